"""Errors the CLI turns into exit codes: bad input is 2, a failed parity check is 1."""


class InputError(ValueError):
    """Bad input: the message names the file or argument, what is wrong, and what to do."""


class ParityFailure(RuntimeError):
    """Our decoder and the reference disagree beyond the tolerance."""
