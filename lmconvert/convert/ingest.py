"""Any input format -> the canonical checkpoint, streamed tensor by tensor into an atomic output."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from lmconvert.formats.atomic import atomic_directory, check_output
from lmconvert.formats.canonical import META_FILE, CanonicalMeta
from lmconvert.formats.checkpoint import Checkpoint, opened
from lmconvert.formats.digest import file_digest
from lmconvert.formats.dtypes import DTYPES, dominant
from lmconvert.formats.quantized import kept, recipe_of
from lmconvert.formats.shards import write_shards
from lmconvert.formats.whole_file import Announced

from .exports import hf_extras, source_description
from .plan import Progress, plan_tensors


def _hash_files(directory: Path, shards: dict[str, dict[str, object]]) -> dict[str, str]:
    """The digest of every file in the output but the shards, which tensor and header digests cover."""
    return {p.name: file_digest(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name != META_FILE and p.name not in shards}


def _transformed(ckpt: Checkpoint, name: str) -> str:
    return (f"{ckpt.path}: tensor {name!r} is quantized, and family {ckpt.family.name}'s table transforms it in a way "
            "its stored parts cannot follow, so it cannot be kept as it is; pass --dtype bfloat16 (or float32) to "
            "dequantize it")


def to_canonical(src: Path | Checkpoint, out: Path, dtype: str | None = None, max_shard_bytes: int = 5 * 10**9,
                 force: bool = False, source_info: dict[str, Any] | None = None,
                 progress: Progress | None = None, allow_nonfinite: bool = False,
                 announced: Sequence[Announced] = ()) -> CanonicalMeta:
    """`dtype` is a --dtype name ("bfloat16", ...) or None to keep the checkpoint's own. Each
    `announced` source file must have the sha256 announced for it (a Hub download's)."""
    with opened(src) as ckpt:
        check_output(out, force, (ckpt.path,))
        with atomic_directory(out, force) as tmp:
            found = recipe_of(ckpt.source.tensors)
            keep = found is not None and dtype is None  # the quantized parts as they are, else dequantized
            reader, items = ckpt.reader, [(canonical, name, t.forward) for canonical, (name, t) in ckpt.plan.items()]
            if keep:
                reader, items = kept(reader, [(canonical, name, t) for canonical, (name, t) in ckpt.plan.items()],
                                     "forward", False, partial(_transformed, ckpt))
            planned = plan_tensors(reader, items, dtype, allow_nonfinite)
            written = write_shards(planned, tmp, max_shard_bytes, progress=progress, announced=announced)
            ckpt.write_sidecars(tmp)
            extras = hf_extras(ckpt)
            source = source_description(ckpt, source_info)
            model_dtype = ckpt.dtype() if keep else DTYPES[dominant([(p.dtype, p.nbytes) for p in planned])].torch_name
            meta = CanonicalMeta(arch=ckpt.arch, family=ckpt.family.name, dtype=model_dtype,
                                 quantization=found.config if keep and found is not None else {},
                                 source=source, hf_extras=extras, tensors=written.tensors,
                                 shards=written.shards, files=_hash_files(tmp, written.shards))
            (tmp / META_FILE).write_text(meta.to_json())
    return meta
