"""Errors the CLI turns into exit codes: a failed parity or integrity check is 1, bad input is 2
(any other exception is a bug in lmconvert: 3)."""


class InputError(ValueError):
    """Bad input: the message names the file or argument, what is wrong, and what to do."""


class ParityFailure(RuntimeError):
    """Our decoder and the reference disagree beyond the tolerance."""


class IntegrityError(RuntimeError):
    """A checkpoint's bytes differ from the digests its lmconvert.json recorded: it changed after
    conversion. The message names the tensor or file."""
