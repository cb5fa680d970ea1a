"""HF -> canonical and canonical -> HF conversion, streamed tensor by tensor into atomic outputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.family import PASSTHROUGH_KEYS
from lmconvert.mappings.table import IDENTITY

from .atomic import atomic_directory, check_output
from .canonical import META_FILE, CanonicalMeta, copy_sidecars, is_canonical, read_meta
from .errors import InputError
from .formats.meta_export import to_meta
from .hf_source import HfCheckpoint
from .safetensors_dir import TensorSource
from .shards import Planned, RawBytes, file_sha256, write_shards
from .sources import TensorReader


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _hash_files(directory: Path, known: dict[str, str]) -> dict[str, str]:
    """sha256 of every file in the output; the shards' were computed while they were written."""
    return {p.name: known.get(p.name) or file_sha256(p)
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != META_FILE}


Progress = Callable[[int, int], None]  # (tensors done, tensors in all)
TensorFn = Callable[[torch.Tensor], torch.Tensor]


def _source_dtype(reader: TensorReader, name: str) -> torch.dtype:
    dtype = getattr(reader, "dtype", None)
    return dtype(name) if dtype is not None else reader.get(name).dtype


def check_finite(name: str, t: torch.Tensor, where: object) -> None:
    """NaN and Inf propagate through min and max, a fast vectorised pass; only a failing tensor
    pays for the exact count."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    low, high = torch.aminmax(t)
    if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
        return
    count = int((~torch.isfinite(t)).sum())
    raise InputError(f"{where}: tensor {name!r} holds {count} NaN/Inf value(s); "
                     "fix the checkpoint or pass --allow-nonfinite")


def plan_tensors(reader: TensorReader, items: Iterable[tuple[str, str, TensorFn]], dtype: torch.dtype | None,
                 allow_nonfinite: bool = False) -> list[Planned]:
    """Plan (output name, source name, transform) triples: shapes and dtypes come from running
    each transform on a meta tensor, so nothing is read until the tensor is written. A tensor
    that passes through unchanged from a safetensors file is planned as a raw byte copy."""
    raw_location = getattr(reader, "raw_location", None)

    def checker(src: str) -> Callable[[torch.Tensor], None] | None:
        return None if allow_nonfinite else (lambda t: check_finite(src, t, reader.where(src)))

    def producer(src: str, fn: TensorFn) -> Callable[[], torch.Tensor]:
        def produce() -> torch.Tensor:
            raw = reader.get(src)
            check = checker(src)
            if check is not None:
                check(raw)
            t = fn(raw)
            return t if dtype is None else t.to(dtype)
        return produce

    planned = []
    for out, src, fn in items:
        source_dtype = _source_dtype(reader, src)
        shape = fn(torch.empty(reader.shape(src), dtype=source_dtype, device="meta"))
        unchanged = fn is IDENTITY.forward and dtype in (None, source_dtype)
        raw = RawBytes(*raw_location(src)) if unchanged and raw_location is not None else None
        planned.append(Planned(out, tuple(shape.shape), dtype or shape.dtype, producer(src, fn), raw, checker(src)))
    return planned


def to_canonical(src: Path, out: Path, dtype: torch.dtype | None = None, max_shard_bytes: int = 5 * 10**9,
                 force: bool = False, source_info: dict[str, Any] | None = None,
                 progress: Progress | None = None, allow_nonfinite: bool = False) -> CanonicalMeta:
    check_output(out, force, (src,))
    with HfCheckpoint.open(src) as ckpt, atomic_directory(out) as tmp:
        items = [(canonical, hf_name, t.forward) for canonical, (hf_name, t) in ckpt.plan.items()]
        planned = plan_tensors(ckpt.source.tensors, items, dtype, allow_nonfinite)
        written = write_shards(planned, tmp, max_shard_bytes, progress=progress)
        ckpt.source.write_sidecars(tmp)
        extras = {k: ckpt.config[k] for k in PASSTHROUGH_KEYS if k in ckpt.config}
        source = {"path": str(src.resolve()), "format": ckpt.source.format,
                  "model_type": ckpt.config.get("model_type"), **ckpt.source.info, **(source_info or {})}
        if ckpt.dropped:
            source["dropped_tensors"] = ckpt.dropped
        meta = CanonicalMeta(arch=ckpt.arch, family=ckpt.family.name, dtype=_dtype_name(planned[0].dtype),
                             source=source, hf_extras=extras, tensors=written.tensors,
                             files=_hash_files(tmp, written.files))
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
    config["dtype"] = _dtype_name(dtype) if dtype is not None else meta.dtype
    with TensorSource(src) as source:
        if set(source.names()) != set(meta.tensors):
            changed = sorted(set(source.names()) ^ set(meta.tensors))
            raise InputError(f"{src}: its tensors differ from {META_FILE} ({', '.join(changed[:5])}); "
                             "run `lmconvert verify --files` and re-convert")
        try:  # in the order the shards hold them: sequential reads
            plan = target.tensors.plan_export(source.names())
        except MappingError as exc:
            raise InputError(f"--family {target.name}: {exc}") from None
        items = [(hf_name, canonical, t.inverse) for hf_name, (canonical, t) in plan.items()]
        with atomic_directory(out) as tmp:
            write_shards(plan_tensors(source, items, dtype, allow_nonfinite), tmp, max_shard_bytes,
                         progress=progress, hashed=False)
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
