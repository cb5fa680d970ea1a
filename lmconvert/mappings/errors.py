"""Errors raised while translating a family's config or tensor names."""

from lmconvert.arch.errors import BadInput


class MappingError(BadInput, ValueError):
    """A config.json or tensor set that a family mapping cannot translate; the message says
    which key or tensor, what is wrong, and what to do."""


class Inexpressible(MappingError):
    """The target family cannot express a variant the checkpoint uses."""
