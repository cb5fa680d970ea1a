"""Conversion as a plan: every output tensor named, shaped and typed before one byte is read, so the
shard writer can lay out files up front and copy unchanged tensors as raw bytes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from lmconvert.formats.digest import FiniteCheck, check_finite
from lmconvert.formats.dtypes import BY_TORCH_NAME, torch_dtype
from lmconvert.formats.shards import Planned, RawBytes
from lmconvert.formats.source import TensorReader, dtype_name
from lmconvert.mappings.table import IDENTITY, TensorFn, out_shape

if TYPE_CHECKING:
    import torch


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


