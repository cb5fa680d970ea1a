"""HF -> canonical and canonical -> HF conversion, streamed tensor by tensor into atomic outputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.family import PASSTHROUGH_KEYS

from .atomic import atomic_directory, check_output
from .canonical import META_FILE, CanonicalMeta, copy_sidecars, is_canonical, read_meta
from .errors import InputError
from .formats.meta_export import to_meta
from .hf_source import HfCheckpoint
from .safetensors_dir import TensorSource
from .shards import Planned, file_sha256, write_shards
from .sources import TensorReader


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _hash_files(directory: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != META_FILE}


Progress = Callable[[int, int], None]  # (tensors done, tensors in all)
TensorFn = Callable[[torch.Tensor], torch.Tensor]


def _source_dtype(reader: TensorReader, name: str) -> torch.dtype:
    dtype = getattr(reader, "dtype", None)
    return dtype(name) if dtype is not None else reader.get(name).dtype


def check_finite(name: str, t: torch.Tensor, where: object) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        count = int((~torch.isfinite(t)).sum())
        raise InputError(f"{where}: tensor {name!r} holds {count} NaN/Inf value(s); "
                         "fix the checkpoint or pass --allow-nonfinite")


def plan_tensors(reader: TensorReader, items: Iterable[tuple[str, str, TensorFn]], dtype: torch.dtype | None,
                 progress: Progress | None = None, allow_nonfinite: bool = False) -> list[Planned]:
    """Plan (output name, source name, transform) triples: shapes and dtypes come from running
    each transform on a meta tensor, so nothing is read until the tensor is written."""
    items = list(items)
    done = [0]

    def producer(src: str, fn: TensorFn) -> Callable[[], torch.Tensor]:
        def produce() -> torch.Tensor:
            raw = reader.get(src)
            if not allow_nonfinite:
                check_finite(src, raw, reader.where(src))
            t = fn(raw)
            t = t if dtype is None else t.to(dtype)
            done[0] += 1
            if progress is not None:
                progress(done[0], len(items))
            return t
        return produce

    planned = []
    for out, src, fn in items:
        shape = fn(torch.empty(reader.shape(src), dtype=_source_dtype(reader, src), device="meta"))
        planned.append(Planned(out, tuple(shape.shape), dtype or shape.dtype, producer(src, fn)))
    return planned


def to_canonical(src: Path, out: Path, dtype: torch.dtype | None = None, max_shard_bytes: int = 5 * 10**9,
                 force: bool = False, source_info: dict[str, Any] | None = None,
                 progress: Progress | None = None, allow_nonfinite: bool = False) -> CanonicalMeta:
    check_output(out, force, (src,))
    with HfCheckpoint.open(src) as ckpt, atomic_directory(out) as tmp:
        items = [(canonical, hf_name, t.forward) for canonical, (hf_name, t) in ckpt.plan.items()]
        planned = plan_tensors(ckpt.source.tensors, items, dtype, progress, allow_nonfinite)
        hashes = write_shards(planned, tmp, max_shard_bytes)
        ckpt.source.write_sidecars(tmp)
        extras = {k: ckpt.config[k] for k in PASSTHROUGH_KEYS if k in ckpt.config}
        source = {"path": str(src.resolve()), "format": ckpt.source.format,
                  "model_type": ckpt.config.get("model_type"), **ckpt.source.info, **(source_info or {})}
        if ckpt.dropped:
            source["dropped_tensors"] = ckpt.dropped
        meta = CanonicalMeta(arch=ckpt.arch, family=ckpt.family.name, dtype=_dtype_name(planned[0].dtype),
                             source=source, hf_extras=extras, tensors=hashes, files=_hash_files(tmp))
        (tmp / META_FILE).write_text(meta.to_json())
    return meta


def canonical_tensors(directory: Path, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    with TensorSource(directory) as source:
        for name in source.names():
            t = source.get(name)
            yield name, t if dtype is None else t.to(dtype)


def to_hf(src: Path, out: Path, family: str | None = None, dtype: torch.dtype | None = None,
          max_shard_bytes: int = 5 * 10**9, force: bool = False, progress: Progress | None = None,
          allow_nonfinite: bool = False) -> dict[str, Any]:
    """Write a canonical checkpoint as `family` (default: its own); refuses what the family
    cannot express exactly."""
    meta = read_meta(src)
    target = family_named(family or meta.family)
    try:
        config = target.hf_config(meta.arch, meta.family, meta.hf_extras)
    except MappingError as exc:
        raise InputError(f"--family {target.name}: {exc}") from None
    check_output(out, force, (src,))
    try:
        plan = target.tensors.plan_export(meta.tensors)
    except MappingError as exc:
        raise InputError(f"--family {target.name}: {exc}") from None

    config["dtype"] = _dtype_name(dtype) if dtype is not None else meta.dtype
    with TensorSource(src) as source, atomic_directory(out) as tmp:
        items = [(hf_name, canonical, t.inverse) for hf_name, (canonical, t) in plan.items()]
        write_shards(plan_tensors(source, items, dtype, progress, allow_nonfinite), tmp, max_shard_bytes)
        copy_sidecars(src, tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def convert(src: Path, out: Path, to: str, **kwargs: Any) -> None:
    targets = {"canonical": (False, to_canonical), "hf": (True, to_hf), "meta": (True, to_meta)}
    needs_canonical, fn = targets[to]
    if is_canonical(src) != needs_canonical:
        want = "a canonical checkpoint (with lmconvert.json)" if needs_canonical else "an HF checkpoint"
        raise InputError(f"{src}: --to {to} needs {want} as SRC")
    if not needs_canonical:
        kwargs.pop("family", None)
    fn(src, out, **kwargs)
