"""A checkpoint (canonical, or any format in one step: exports.export_source) -> Hugging Face
safetensors, as its own family or another that expresses the model exactly, streamed tensor by
tensor into an atomic output."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from lmconvert.formats.atomic import atomic_directory, check_output
from lmconvert.formats.canonical import copy_sidecars
from lmconvert.formats.checkpoint import Checkpoint, opened
from lmconvert.formats.errors import InputError
from lmconvert.formats.quantized import kept, kept_digests, recipe_of
from lmconvert.formats.shards import write_shards
from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.family import tensor_sizes

from .exports import export_source
from .plan import Progress, plan_tensors


def _transformed(family: str, name: str) -> str:
    return (f"tensor {name!r} is quantized, and family {family}'s table transforms it on export in a way its "
            "stored parts cannot follow, so it cannot be written as it is; pass --dtype bfloat16 (or float32) to "
            "dequantize it")


def to_hf(src: Path | Checkpoint, out: Path, family: str | None = None, dtype: str | None = None,
          max_shard_bytes: int = 5 * 10**9, force: bool = False, progress: Progress | None = None,
          allow_nonfinite: bool = False) -> dict[str, Any]:
    """Write a checkpoint (canonical, or any format in one step: `export_source`) as `family`
    (default: its own); refuses what the family cannot express exactly. Returns the config.json
    written."""
    with opened(src) as ckpt:
        export = export_source(ckpt, "hf")
        meta = export.meta
        target = family_named(family or meta.family)
        try:
            config = target.hf_config(meta.arch, meta.family, meta.hf_extras)
        except MappingError as exc:
            raise InputError(f"--family {target.name}: {exc}") from None
        check_output(out, force, (ckpt.path,))
        config["dtype"] = dtype or meta.dtype
        source = export.tensors
        try:  # in the order the shards hold them: sequential reads
            plan = target.tensors_for(meta.arch).plan_export(source.names(), tensor_sizes(meta.arch))
        except MappingError as exc:
            raise InputError(f"--family {target.name}: {exc}") from None
        items = [(hf_name, canonical, t.inverse) for hf_name, (canonical, t) in plan.items()]
        found = recipe_of(ckpt.source.tensors)
        digests = export.digests
        if found is not None and dtype is None:  # kept as it is: the parts, and quantization_config unchanged
            source, items = kept(source, [(hf_name, canonical, t) for hf_name, (canonical, t) in plan.items()],
                                 "inverse", True, partial(_transformed, target.name))
            digests = kept_digests(None if export.direct else meta.tensors, source, meta.hash)
            config["quantization_config"] = found.config
        with atomic_directory(out, force) as tmp, export.side_files(out) as side:
            planned = plan_tensors(source, items, dtype, allow_nonfinite, digests, meta.hash)
            write_shards(planned, tmp, max_shard_bytes, progress=progress, hashed=False)
            copy_sidecars(side, tmp, meta)
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config
