"""The verdict `verify` raises when it is not a pass, which the CLI turns into exit code 1."""

from lmconvert.arch.errors import CheckFailed


class ParityFailure(CheckFailed, RuntimeError):
    """Our decoder and the reference disagree beyond the tolerance."""
