"""`python -m lmconvert` works as the `lmconvert` command does (what torchrun launches)."""

from lmconvert.cli import entry

entry()
