"""HF -> canonical and canonical -> HF conversion, streamed tensor by tensor into atomic outputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.family import PASSTHROUGH_KEYS

from .atomic import atomic_directory, check_output
from .canonical import META_FILE, CanonicalMeta, copy_sidecars, is_canonical, read_meta
from .errors import InputError
from .hf_source import HfCheckpoint
from .safetensors_dir import TensorSource
from .shards import file_sha256, write_shards


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _watch_dtype(tensors: Iterator[tuple[str, torch.Tensor]], seen: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t in tensors:
        if not seen:
            seen.append(_dtype_name(t.dtype))
        yield name, t


def _hash_files(directory: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != META_FILE}


Progress = Callable[[int, int], None]  # (tensors done, tensors in all)


def _report(tensors: Iterator[tuple[str, torch.Tensor]], total: int,
            progress: Progress | None) -> Iterator[tuple[str, torch.Tensor]]:
    for done, item in enumerate(tensors, start=1):
        yield item
        if progress is not None:
            progress(done, total)


def to_canonical(src: Path, out: Path, dtype: torch.dtype | None = None, max_shard_bytes: int = 5 * 10**9,
                 force: bool = False, source_info: dict[str, Any] | None = None,
                 progress: Progress | None = None) -> CanonicalMeta:
    check_output(out, force, (src,))
    with HfCheckpoint.open(src) as ckpt, atomic_directory(out) as tmp:
        seen: list[str] = []
        tensors = _report(ckpt.tensors(dtype), len(ckpt.plan), progress)
        hashes = write_shards(_watch_dtype(tensors, seen), tmp, max_shard_bytes)
        ckpt.source.write_sidecars(tmp)
        extras = {k: ckpt.config[k] for k in PASSTHROUGH_KEYS if k in ckpt.config}
        source = {"path": str(src.resolve()), "format": ckpt.source.format,
                  "model_type": ckpt.config.get("model_type"), **ckpt.source.info, **(source_info or {})}
        if ckpt.dropped:
            source["dropped_tensors"] = ckpt.dropped
        meta = CanonicalMeta(arch=ckpt.arch, family=ckpt.family.name, dtype=seen[0] if seen else "float32",
                             source=source, hf_extras=extras, tensors=hashes, files=_hash_files(tmp))
        (tmp / META_FILE).write_text(meta.to_json())
    return meta


def canonical_tensors(directory: Path, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    with TensorSource(directory) as source:
        for name in source.names():
            t = source.get(name)
            yield name, t if dtype is None else t.to(dtype)


def to_hf(src: Path, out: Path, family: str | None = None, dtype: torch.dtype | None = None,
          max_shard_bytes: int = 5 * 10**9, force: bool = False, progress: Progress | None = None) -> dict[str, Any]:
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

    def hf_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        with TensorSource(src) as source:
            for hf_name, (canonical, transform) in plan.items():
                t = transform.inverse(source.get(canonical))
                yield hf_name, t if dtype is None else t.to(dtype)

    config["dtype"] = _dtype_name(dtype) if dtype is not None else meta.dtype
    with atomic_directory(out) as tmp:
        write_shards(_report(hf_tensors(), len(plan), progress), tmp, max_shard_bytes)
        copy_sidecars(src, tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def convert(src: Path, out: Path, to: str, **kwargs: Any) -> None:
    targets = {"canonical": (False, to_canonical), "hf": (True, to_hf)}
    needs_canonical, fn = targets[to]
    if is_canonical(src) != needs_canonical:
        want = "a canonical checkpoint (with lmconvert.json)" if needs_canonical else "an HF checkpoint"
        raise InputError(f"{src}: --to {to} needs {want} as SRC")
    if not needs_canonical:
        kwargs.pop("family", None)
    fn(src, out, **kwargs)
