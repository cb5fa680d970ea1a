"""What an export needs of its source."""

from __future__ import annotations

from lmconvert.formats.canonical import META_FILE, CanonicalMeta
from lmconvert.formats.checkpoint import Checkpoint
from lmconvert.formats.errors import InputError, IntegrityError
from lmconvert.formats.integrity import check_shards


def canonical_meta(checkpoint: Checkpoint, to: str) -> CanonicalMeta:
    """Exports start from a canonical checkpoint, whose lmconvert.json vouches for its tensors and
    files. Its tensor names and shard headers are checked here, before anything is written; each
    tensor's bytes and each copied file are checked against their digests as the export reads them."""
    meta = checkpoint.meta
    if meta is None:
        raise InputError(f"{checkpoint.path}: --to {to} needs a canonical checkpoint (with lmconvert.json) as SRC")
    names = set(checkpoint.source.tensors.names())
    if names != set(meta.tensors):
        changed = sorted(names ^ set(meta.tensors))
        raise IntegrityError(f"{checkpoint.path}: its tensors differ from {META_FILE} ({', '.join(changed[:5])}); "
                             "the checkpoint changed after conversion: run `lmconvert verify --files` and re-convert")
    check_shards(checkpoint.path, meta)
    return meta
