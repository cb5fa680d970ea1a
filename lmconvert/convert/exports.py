"""What an export needs of its source: canonical tensors and the description lmconvert.json holds,
from a canonical checkpoint, or from any other format in one step, without the canonical copy."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from lmconvert.arch import ArchConfig
from lmconvert.formats.atomic import scratch_directory
from lmconvert.formats.canonical import META_FILE, CanonicalMeta
from lmconvert.formats.canonical_view import CanonicalTensors
from lmconvert.formats.checkpoint import Checkpoint
from lmconvert.formats.digest import file_digest
from lmconvert.formats.dtypes import DTYPES, dominant
from lmconvert.formats.errors import InputError, IntegrityError
from lmconvert.formats.integrity import check_shards
from lmconvert.formats.source import TensorReader
from lmconvert.mappings.family import PASSTHROUGH_KEYS


def canonical_meta(checkpoint: Checkpoint, to: str) -> CanonicalMeta:
    """Exports start from a canonical checkpoint, whose lmconvert.json vouches for its tensors and
    files. Its tensor names and shard headers are checked here, before anything is written; each
    tensor's bytes and each copied file are checked against their digests as the export reads them."""
    meta = checkpoint.meta
    if meta is None:
        raise InputError(f"{checkpoint.path}: --to {to} needs a canonical checkpoint (with lmconvert.json) as SRC")
    tensors = checkpoint.source.tensors
    names = set(getattr(tensors, "every_name", tensors.names)())  # a quantized weight's parts, not the weight
    if names != set(meta.tensors):
        changed = sorted(names ^ set(meta.tensors))
        raise IntegrityError(f"{checkpoint.path}: its tensors differ from {META_FILE} ({', '.join(changed[:5])}); "
                             "the checkpoint changed after conversion: run `lmconvert verify --files` and re-convert")
    check_shards(checkpoint.path, meta)
    return meta


def source_description(checkpoint: Checkpoint, source_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """lmconvert.json's "source", as ingest records it (after the side files are written: a GGUF
    source notes there how its tokenizer was rebuilt)."""
    source = {"path": str(checkpoint.path.resolve()), "format": checkpoint.format,
              "model_type": checkpoint.config.get("model_type"), **checkpoint.source.info, **(source_info or {})}
    if checkpoint.dropped:
        source["dropped_tensors"] = checkpoint.dropped
    return source


def hf_extras(checkpoint: Checkpoint) -> dict[str, Any]:
    return {k: checkpoint.config[k] for k in PASSTHROUGH_KEYS if k in checkpoint.config}


def as_recorded(value: dict[str, Any]) -> dict[str, Any]:
    """A part of lmconvert.json as an export reads it back: JSON (lists, not tuples), its keys sorted
    (Meta's params.json, copied from "source", keeps that order)."""
    return json.loads(json.dumps(value, sort_keys=True))


@dataclass
class Export:
    """An export's source: the checkpoint, its description and its tensors by canonical name.

    From a canonical checkpoint: its lmconvert.json, and every tensor read checked against the
    digest recorded there (`digests`). From any other format (one step): the description ingest
    would record (family, ArchConfig, dtype, hf_extras, source), built in memory, and the tensors
    read from the source through the family's import plan (formats/canonical_view.py). Nothing
    recorded their digests, so there is nothing to compare what is read with: `digests` is None,
    as for ingest, which reads its source unchecked too (the Meta export, which reads every tensor
    once per rank, hashes the first read and checks the others against it)."""

    checkpoint: Checkpoint
    meta: CanonicalMeta
    tensors: TensorReader

    @property
    def direct(self) -> bool:
        """Straight from a format other than canonical."""
        return self.checkpoint.meta is None

    @property
    def digests(self) -> Mapping[str, str] | None:
        """The digests to check tensors against as they are read; a quantized canonical checkpoint's
        view checks each part it reads itself (`QuantizedTensors.checking`), dequantized weights aside."""
        if self.direct:
            return None
        checking = getattr(self.tensors, "checking", None)
        return self.meta.tensors if checking is None else checking(self.meta.tensors, self.meta.hash)

    @contextmanager
    def side_files(self, out: Path) -> Iterator[Path]:
        """A directory holding the side files (tokenizer, generation config) as the canonical copy
        holds them, each listed with its digest in `meta.files`: the canonical checkpoint itself, or
        for a direct export, the files ingest would write (the source's own, or what a GGUF or Meta
        source rebuilds), written into a marked temporary beside `out` that goes when the block ends.
        Call it once `out` has been checked (`check_output`): nothing is written before."""
        if not self.direct:
            yield self.checkpoint.path
            return
        with scratch_directory(out) as scratch:
            self.checkpoint.write_sidecars(scratch)
            self.meta.files = {p.name: file_digest(p, self.meta.hash) for p in sorted(scratch.iterdir())
                               if p.is_file()}
            self.meta.source = as_recorded(source_description(self.checkpoint))  # what writing them noted
            yield scratch


def export_source(checkpoint: Checkpoint, to: str) -> Export:
    """What an export to `to` reads of `checkpoint`, whatever its format."""
    if checkpoint.meta is not None:
        return Export(checkpoint, canonical_meta(checkpoint, to), checkpoint.source.tensors)
    tensors = CanonicalTensors(checkpoint)
    sized = [(tensors.dtype_name(n), prod(tensors.shape(n)) * DTYPES[tensors.dtype_name(n)].itemsize)
             for n in checkpoint.plan]
    arch = ArchConfig.from_dict(as_recorded(checkpoint.arch.to_dict()))
    meta = CanonicalMeta(arch=arch, family=checkpoint.family.name, dtype=DTYPES[dominant(sized)].torch_name,
                         source=as_recorded(source_description(checkpoint)),
                         hf_extras=as_recorded(hf_extras(checkpoint)))
    return Export(checkpoint, meta, tensors)
