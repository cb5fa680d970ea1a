"""The verdict `verify` raises when it is not a pass, which the CLI turns into exit code 1."""


class ParityFailure(RuntimeError):
    """Our decoder and the reference disagree beyond the tolerance."""
