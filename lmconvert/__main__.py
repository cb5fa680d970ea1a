"""`python -m lmconvert` works as the `lmconvert` command does."""

from lmconvert.cli import main

main()
