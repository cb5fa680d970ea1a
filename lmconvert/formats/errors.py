"""Errors about files and arguments, which the CLI turns into exit codes: a failed integrity check
is 1, bad input is 2 (a failed parity check, `verify.errors.ParityFailure`, is 1 too; any other
exception is a bug in lmconvert: 3). Both carry their code from `lmconvert.arch.errors`."""

from lmconvert.arch.errors import BadInput, CheckFailed


class InputError(BadInput, ValueError):
    """Bad input: the message names the file or argument, what is wrong, and what to do."""


class IntegrityError(CheckFailed, RuntimeError):
    """A checkpoint's bytes differ from the digests its lmconvert.json recorded: it changed after
    conversion. The message names the tensor or file."""
