"""Conversion as a plan: every output tensor named, shaped and typed before one byte is read, so the
shard writer can lay out files up front and copy unchanged tensors as raw bytes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from lmconvert.formats.digest import HASH, DigestCheck, FiniteCheck, check_tensor
from lmconvert.formats.dtypes import BY_TORCH_NAME, torch_dtype
from lmconvert.formats.shards import Planned, RawBytes
from lmconvert.formats.source import TensorReader, dtype_name
from lmconvert.mappings.table import IDENTITY, TensorFn, out_shape

if TYPE_CHECKING:
    import torch


Progress = Callable[[int, int], None]  # (tensors done, tensors in all)


def plan_tensors(reader: TensorReader, items: Iterable[tuple[str, str | tuple[str, ...], TensorFn]], cast: str | None,
                 allow_nonfinite: bool = False, digests: Mapping[str, str] | None = None,
                 algorithm: str = HASH) -> list[Planned]:
    """Plan (output name, source name, transform) triples, casting to `cast` (a --dtype name) if
    given: nothing is read until the tensor is written. A tensor that passes through unchanged
    from a safetensors file is planned as a raw byte copy, and planning it needs no torch.
    With `digests` ({source name: digest} under `algorithm`, as lmconvert.json records them),
    every source tensor's bytes are checked against theirs as they are read: a raw copy's by the
    worker that moves it, a transformed one's before it is transformed. A tuple of source names is
    a tensor fused from pieces (GPT-2's c_attn): its transform is given the list of them."""

    def expected(src: str) -> DigestCheck | None:
        return None if digests is None else DigestCheck(src, reader.where(src), digests[src], algorithm)

    target = None if cast is None else BY_TORCH_NAME[cast].name

    def read(src: str) -> torch.Tensor:
        raw = reader.get(src)
        check_tensor(raw, None if allow_nonfinite else FiniteCheck(src, reader.where(src)), expected(src))
        return raw

    def producer(src: str | tuple[str, ...], fn: TensorFn) -> Callable[[], torch.Tensor]:
        def produce() -> torch.Tensor:
            t = fn([read(s) for s in src] if isinstance(src, tuple) else read(src))
            return t if target is None else t.to(torch_dtype(target))
        return produce

    raw_location = getattr(reader, "raw_location", None)
    planned = []
    for out, src, fn in items:
        if isinstance(src, tuple):  # pieces: never a raw copy, each checked as it is read
            source = dtype_name(reader, src[0])
            shape = tuple(fn([_meta(reader.shape(s)) for s in src]).shape)
            planned.append(Planned(out, shape, target or source, producer(src, fn), None, None, None))
            continue
        source = dtype_name(reader, src)
        dtype = target or source
        raw = None
        if fn is IDENTITY.forward and dtype == source and raw_location is not None:
            raw = RawBytes(*raw_location(src))
        check = None if raw is None or allow_nonfinite else FiniteCheck(src, reader.where(src))
        planned.append(Planned(out, out_shape(fn, reader.shape(src)), dtype, producer(src, fn), raw, check,
                               None if raw is None else expected(src)))
    return planned


def _meta(shape: tuple[int, ...]) -> torch.Tensor:
    import torch

    return torch.empty(shape, device="meta")
