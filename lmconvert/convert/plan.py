"""Conversion as a plan: every output tensor named, shaped and typed before one byte is read, so the
shard writer can lay out files up front and copy unchanged tensors as raw bytes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from lmconvert.formats.digest import HASH, DigestCheck, FiniteCheck, check_tensor
from lmconvert.formats.dtypes import BY_TORCH_NAME, DTYPES, torch_dtype
from lmconvert.formats.quant_bands import cast_pieces, dequantize_into
from lmconvert.formats.shards import Planned, RawBytes
from lmconvert.formats.source import TensorReader, dtype_name
from lmconvert.mappings.tables.table import IDENTITY, TensorFn, out_shape

if TYPE_CHECKING:
    import torch


Progress = Callable[[int, int], None]  # (bytes written, bytes in all); `diff`: (tensors compared, tensors in all)


def plan_tensors(reader: TensorReader, items: Iterable[tuple[str, str | tuple[str, ...], TensorFn]],
                 cast: str | None, allow_nonfinite: bool = False, digests: Mapping[str, str] | None = None,
                 algorithm: str = HASH, read_before: bool = False) -> list[Planned]:
    """Plan (output name, source name, transform) triples, casting to `cast` (a --dtype name) if
    given: nothing is read until the tensor is written. A tensor that passes through unchanged
    from a safetensors file is planned as a raw byte copy, and planning it needs no torch.
    With `digests` ({source name: digest} under `algorithm`, as lmconvert.json records them),
    every source tensor's bytes are checked against theirs as they are read: a raw copy's by the
    worker that moves it, a transformed one's before it is transformed. One expert's rows of a fused
    experts tensor (a forward with a `span`) are a raw copy of their run of the file too, and the
    fused tensor's check is then made piece by piece, so it is never read whole; with `digests`,
    which are of whole source tensors, it is read and split instead. A tuple of source names is
    one output stored as pieces (Phi-3's fused qkv_proj): `fn` gets the list of them. Unless
    `allow_nonfinite`, a source holding NaN/Inf is refused, and so is a cast one whose values its
    new type cannot hold (checked on the bytes written). `read_before`: the digests are of this
    run's own earlier reads, not lmconvert.json's (the errors say so)."""

    def expected(src: str) -> DigestCheck | None:
        """None without digests, and for a tensor a quantized view makes (it checks the parts it reads)."""
        if digests is None or src not in digests:
            return None
        return DigestCheck(src, reader.where(src), digests[src], algorithm, read_before)

    target = None if cast is None else BY_TORCH_NAME[cast].name

    once: set[str] = set()  # a source several outputs come from (fused experts) is checked once

    def checked(src: str) -> torch.Tensor:
        raw = reader.get(src)
        if src not in once:
            check_tensor(raw, None if allow_nonfinite else FiniteCheck(src, reader.where(src)), expected(src))
            once.add(src)
        return raw

    casts_straight = getattr(reader, "casts_straight", None)  # a quantized view's weights, cast band by band
    banded = getattr(reader, "banded", None)  # any other tensor read a band of rows at a time

    def producer(src: str | tuple[str, ...], fn: TensorFn) -> Callable[[], torch.Tensor]:
        if target is not None and isinstance(src, str) and fn is IDENTITY.forward and expected(src) is None:
            finite = None if allow_nonfinite else FiniteCheck(src, reader.where(src))
            if casts_straight is not None and casts_straight(src):
                def straight() -> torch.Tensor:  # the same bits and checks as below, never the float32 weight whole
                    return reader.get_as(src, torch_dtype(target), finite)  # type: ignore[attr-defined]
                return straight
            if banded is not None and dtype_name(reader, src) != target:
                return partial(banded_cast, src, torch_dtype(target), finite)

        def produce() -> torch.Tensor:
            t = fn([checked(s) for s in src] if isinstance(src, tuple) else checked(src))
            return t if target is None else t.to(torch_dtype(target))
        return produce

    def banded_cast(src: str, dtype: torch.dtype, finite: FiniteCheck | None) -> torch.Tensor:
        """`checked(src).to(dtype)`, bit for bit and refused alike, cast a band of rows at a time as
        they are read: the source tensor (a 1B model's 525 MB float16 embedding beside GPTQ weights) is
        never held whole beside its cast, nor its float32 widening."""
        bands = banded(src)  # type: ignore[misc]
        if bands is None:
            t = checked(src)
            return t.to(dtype)
        weight, nonfinite = dequantize_into(bands, dtype, finite is not None)
        if finite is not None:
            finite.require(nonfinite)
        once.add(src)
        return weight

    def pieces(src: str, fn: TensorFn) -> Callable[[], Iterator[torch.Tensor]] | None:
        """What `banded_cast` gives, as pieces the shard writer asks for one at a time: the cast
        itself never held whole either (a 1B model's 525 MB bfloat16 embedding cast from float16)."""
        if target is None or fn is not IDENTITY.forward or banded is None or expected(src) is not None \
                or dtype_name(reader, src) == target or (casts_straight is not None and casts_straight(src)):
            return None
        finite = None if allow_nonfinite else FiniteCheck(src, reader.where(src))

        def made() -> Iterator[torch.Tensor]:
            bands = banded(src)  # type: ignore[misc]
            if bands is None:
                yield banded_cast(src, torch_dtype(target), finite)
                return
            yield from cast_pieces(bands, torch_dtype(target), finite)
        return made

    stored_at = getattr(reader, "raw_location", None)  # a reader may know some tensors' bytes only
    placed = getattr(reader, "position", None)  # a reader's own order (formats/canonical_view.py)

    def raw_location(src: str) -> tuple[Path, int, int] | None:
        return None if stored_at is None else stored_at(src)

    def position(src: str, first: int = 0) -> tuple[Path, int] | None:
        """Where the tensor's bytes start in the source, for the writer's order."""
        if placed is not None:
            return placed(src)
        where = raw_location(src)
        return None if where is None else (where[0], where[1] + first)

    def written(src: str, source: str) -> FiniteCheck | None:
        """A cast's bytes are checked as they are written: a finite source may not fit the type."""
        if allow_nonfinite or target is None or target == source:
            return None
        return FiniteCheck(src, reader.where(src), cast, "choose --dtype float32 (or keep)")

    planned = []
    for out, src, fn in items:
        if isinstance(src, tuple):  # pieces joined: never a raw copy
            shape = out_shape(fn, [reader.shape(s) for s in src])
            source = dtype_name(reader, src[0])
            planned.append(Planned(out, shape, target or source, producer(src, fn), check=written(src[0], source),
                                   position=position(src[0])))
            continue
        source = dtype_name(reader, src)
        dtype = target or source
        raw = None
        span = getattr(fn, "span", None)  # one expert's rows of a fused experts tensor: a run of its bytes
        size = DTYPES[source].itemsize
        first, stop = (0, 0) if span is None else (n * size for n in span(reader.shape(src)))  # bytes
        where = raw_location(src) if dtype == source and (fn is IDENTITY.forward or span is not None) else None
        if fn is IDENTITY.forward and where is not None:
            raw = RawBytes(*where)
        elif span is not None and where is not None and digests is None:
            raw = RawBytes(where[0], where[1] + first, where[1] + stop)
        if raw is None:
            check = written(src, source)
        else:
            check = None if allow_nonfinite else FiniteCheck(src, reader.where(src))
        planned.append(Planned(out, out_shape(fn, reader.shape(src)), dtype, producer(src, fn), raw, check,
                               None if raw is None else expected(src), position(src, first),
                               None if raw is not None else pieces(src, fn)))
    return planned
