"""HF -> canonical and canonical -> HF conversion, streamed tensor by tensor into atomic outputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.family import PASSTHROUGH_KEYS
from lmconvert.mappings.table import IDENTITY, TensorFn, out_shape

from .atomic import atomic_directory, check_output
from .canonical import META_FILE, CanonicalMeta, copy_sidecars, is_canonical, read_meta
from .digest import FiniteCheck, check_finite, file_digest
from .dtypes import BY_TORCH_NAME, DTYPES, dominant, torch_dtype
from .errors import InputError
from .hf_source import HfCheckpoint
from .safetensors_dir import TensorSource
from .shards import Planned, RawBytes, write_shards
from .sources import TensorReader, dtype_name

if TYPE_CHECKING:
    import torch


def _hash_files(directory: Path, shards: dict[str, dict[str, object]]) -> dict[str, str]:
    """The digest of every file in the output but the shards, which tensor and header digests cover."""
    return {p.name: file_digest(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name != META_FILE and p.name not in shards}


Progress = Callable[[int, int], None]  # (tensors done, tensors in all)


def plan_tensors(reader: TensorReader, items: Iterable[tuple[str, str, TensorFn]], cast: str | None,
                 allow_nonfinite: bool = False) -> list[Planned]:
    """Plan (output name, source name, transform) triples, casting to `cast` (a --dtype name) if
    given: nothing is read until the tensor is written. A tensor that passes through unchanged
    from a safetensors file is planned as a raw byte copy, and planning it needs no torch."""
    raw_location = getattr(reader, "raw_location", None)
    target = None if cast is None else BY_TORCH_NAME[cast].name

    def producer(src: str, fn: TensorFn) -> Callable[[], torch.Tensor]:
        def produce() -> torch.Tensor:
            raw = reader.get(src)
            if not allow_nonfinite:
                check_finite(src, raw, reader.where(src))
            t = fn(raw)
            return t if target is None else t.to(torch_dtype(target))
        return produce

    planned = []
    for out, src, fn in items:
        source = dtype_name(reader, src)
        dtype = target or source
        raw = None
        if fn is IDENTITY.forward and dtype == source and raw_location is not None:
            raw = RawBytes(*raw_location(src))
        check = None if raw is None or allow_nonfinite else FiniteCheck(src, reader.where(src))
        planned.append(Planned(out, out_shape(fn, reader.shape(src)), dtype, producer(src, fn), raw, check))
    return planned


def to_canonical(src: Path, out: Path, dtype: str | None = None, max_shard_bytes: int = 5 * 10**9,
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
        model_dtype = DTYPES[dominant([(p.dtype, p.nbytes) for p in planned])].torch_name
        meta = CanonicalMeta(arch=ckpt.arch, family=ckpt.family.name, dtype=model_dtype,
                             source=source, hf_extras=extras, tensors=written.tensors,
                             shards=written.shards, files=_hash_files(tmp, written.shards))
        (tmp / META_FILE).write_text(meta.to_json())
    return meta


def canonical_tensors(directory: Path, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    with TensorSource(directory) as source:
        for name in source.names():
            t = source.get(name)
            yield name, t if dtype is None else t.to(dtype)


def to_hf(src: Path, out: Path, family: str | None = None, dtype: str | None = None,
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
    config["dtype"] = dtype or meta.dtype
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


def _to_meta(src: Path, out: Path, **kwargs: Any) -> dict[str, Any]:
    from .formats.meta_export import to_meta  # loads torch: Meta's files are pickles

    return to_meta(src, out, **kwargs)


def convert(src: Path, out: Path, to: str, **kwargs: Any) -> None:
    """`dtype` is a --dtype name ("bfloat16", ...) or None to keep the checkpoint's own."""
    targets = {"canonical": (False, to_canonical), "hf": (True, to_hf), "meta": (True, _to_meta)}
    needs_canonical, fn = targets[to]
    if is_canonical(src) != needs_canonical:
        want = "a canonical checkpoint (with lmconvert.json)" if needs_canonical else "an HF checkpoint"
        raise InputError(f"{src}: --to {to} needs {want} as SRC")
    if not needs_canonical:
        kwargs.pop("family", None)
    fn(src, out, **kwargs)
