from lmconvert.cli import entry

entry()
