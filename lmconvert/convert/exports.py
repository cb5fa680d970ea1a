"""What an export needs of its source."""

from __future__ import annotations

from lmconvert.formats.canonical import CanonicalMeta
from lmconvert.formats.checkpoint import Checkpoint
from lmconvert.formats.errors import InputError


def canonical_meta(checkpoint: Checkpoint, to: str) -> CanonicalMeta:
    """Exports start from a canonical checkpoint, whose lmconvert.json vouches for its tensors."""
    if checkpoint.meta is None:
        raise InputError(f"{checkpoint.path}: --to {to} needs a canonical checkpoint (with lmconvert.json) as SRC")
    return checkpoint.meta
