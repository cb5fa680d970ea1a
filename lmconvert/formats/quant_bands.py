"""Dequantizing one quantized weight straight into the dtype it is written in, a band of rows at a time.

`convert --dtype` used to dequantize a weight whole into float32 (transformers' dtype), then cast
it whole, then scan the float32 copy for NaN/Inf: three weight-sized passes through memory and two
weight-sized temporaries (464 MB peak for a 1B FP8 model). Here each band of rows is computed in
the format's own dtype (`Banded.native`: float32 for FP8, the scales' dtype for GPTQ) into a small
scratch that stays in the CPU cache, checked for NaN/Inf there, and cast into its rows of the
output: the same operations on the same values in the same order, so the same bits, while memory
holds the output and one scratch per thread. The bands are independent and torch and numpy release
the GIL, so they go on up to four threads, each torch op on one thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .digest import FiniteCheck

BAND_BYTES = 1 << 20  # native bytes of one band: it and its cast stay in a core's L2 cache
PIECE_BYTES = 8 << 20  # output bytes `cast_pieces` gives at a time (several bands, on the threads)
THREADS = max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class Banded:
    """A weight [rows, cols] as bands: `fill(start, stop, into)` writes rows [start, stop) in the
    format's `native` dtype into `into` (contiguous, [stop - start, cols]); every band but the last
    starts and ends at a multiple of `align` rows (FP8's scale blocks). `shape`: the weight's own,
    where [rows, cols] flattens its leading dimensions (a stack of matrices)."""

    rows: int
    cols: int
    native: torch.dtype
    fill: Callable[[int, int, torch.Tensor], None]
    align: int = 1
    shape: tuple[int, ...] | None = None


def stored_rows(shape: tuple[int, ...], native: torch.dtype, read_into: Callable[[int, memoryview], None]) -> Banded:
    """A float tensor stored row-major as `native` values, as bands read straight from its bytes:
    `read_into(byte offset, view)` fills `view` with the stored bytes from that offset on (whole, or
    refused by name). The float32 embedding of a 1B model (1.05 GB) is then never held whole by a
    cast (`dequantize_into`) or a GGUF encoder (gguf_writer.py), only its bands are."""
    import torch

    cols = shape[-1] if shape else 1
    row_bytes = cols * torch.empty((), dtype=native).element_size()

    def fill(start: int, stop: int, into: torch.Tensor) -> None:
        read_into(start * row_bytes, memoryview(into.view(torch.uint8).numpy()).cast("B"))

    return Banded(prod(shape[:-1]), cols, native, fill, shape=shape)


def pread_into(fd: int, view: memoryview, offset: int, short: Callable[[], Exception]) -> None:
    """Fill `view` from file `fd` at `offset` (positioned reads: threads share the descriptor);
    a read that finds the end of the file first raises `short()`."""
    done = 0
    while done < len(view):  # one read returns at most ~2 GB on Linux
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise short()
        done += got


_free: list[torch.Tensor] = []  # scratch buffers (flat, uint8) between bands, reused across weights
_free_lock = threading.Lock()


def _scratch(nbytes: int) -> torch.Tensor:
    import torch

    with _free_lock:
        for i, t in enumerate(_free):
            if t.numel() >= nbytes:
                return _free.pop(i)
    return torch.empty(nbytes, dtype=torch.uint8)


def _release(t: torch.Tensor) -> None:
    with _free_lock:
        if len(_free) < 2 * THREADS:
            _free.append(t)


_held = threading.Lock()
_holders = [0, 0]  # how many callers hold torch to one thread, and the count of threads before them


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's operations on one thread each while held: the bands go on threads of their own, and
    torch's OpenMP teams inside each would oversubscribe the cores, their workers spinning after
    every small step (GPTQ `--dtype float16` took 61 CPU-s that way against 6.6 held). Threads
    started inside take the count of one when they first use torch; the count before is restored
    by the last to leave."""
    import torch

    with _held:
        if _holders[0] == 0:
            _holders[1] = torch.get_num_threads()
            torch.set_num_threads(1)
        _holders[0] += 1
    try:
        yield
    finally:
        with _held:
            _holders[0] -= 1
            if _holders[0] == 0:
                torch.set_num_threads(_holders[1])


def band_rows(banded: Banded, itemsize: int, band_bytes: int = BAND_BYTES) -> int:
    """Rows per band: about `band_bytes` of native values, a multiple of `align` (at least one)."""
    rows = max(1, band_bytes // max(1, banded.cols * itemsize))
    return max(banded.align, rows // banded.align * banded.align)


def dequantize_into(banded: Banded, dtype: torch.dtype, checked: bool, out: torch.Tensor | None = None,
                    band_bytes: int = BAND_BYTES, threads: int = THREADS) -> tuple[torch.Tensor, int]:
    """The weight in `dtype` (into `out` if given, else a new tensor) and, if `checked`, how many
    of its native values are NaN or Inf (what a scan of the widened float32 weight counts: widening
    keeps them), else 0. `dtype` equal to `native`: each band is filled in place, no scratch."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from .digest import memory_chunks, scan, tensor_bytes
    from .dtypes import of_torch

    if out is None:
        out = torch.empty(banded.rows, banded.cols, dtype=dtype)
    whole, out = out, out.view(banded.rows, banded.cols)
    native_size = torch.empty((), dtype=banded.native).element_size()
    step = band_rows(banded, native_size, band_bytes)
    kind = of_torch(banded.native).name
    widen = torch.float32 not in (banded.native, dtype)

    def band(start: int) -> int:
        stop = min(start + step, banded.rows)
        rows = out[start:stop]
        held = None
        if dtype == banded.native:
            into = rows
        else:
            held = _scratch((stop - start) * banded.cols * native_size)
            into = held[:(stop - start) * banded.cols * native_size].view(banded.native).view(stop - start, banded.cols)
        wide = None
        try:
            banded.fill(start, stop, into)
            bad = scan(memory_chunks(tensor_bytes(into)), kind, None).nonfinite if checked else 0
            if held is not None and widen:
                # float16 -> bfloat16 one value at a time is torch's slow path (7x): widened first, both
                # casts vectorized, the same rounding of the same values (NaN payloads aside: a GPTQ
                # product of finite scales is never NaN, and a NaN is refused unless allowed)
                wide = _scratch(into.numel() * 4)
                rows.copy_(wide[:into.numel() * 4].view(torch.float32).view(into.shape).copy_(into))
            elif held is not None:
                rows.copy_(into)
        finally:
            for t in (held, wide):
                if t is not None:
                    _release(t)
        return bad

    starts = range(0, banded.rows, step)
    with one_torch_thread():  # torch's own threads on bands this small spin: 10x slower on a loaded machine
        if threads <= 1 or len(starts) == 1:
            bad = sum(band(s) for s in starts)
        else:
            with ThreadPoolExecutor(max_workers=min(threads, len(starts))) as pool:
                bad = sum(pool.map(band, starts))
    return (whole if banded.shape in (None, tuple(whole.shape)) else whole.view(banded.shape)), bad


def cast_pieces(banded: Banded, dtype: torch.dtype, finite: FiniteCheck | None,
                piece_bytes: int = PIECE_BYTES) -> Iterator[torch.Tensor]:
    """`dequantize_into(banded, dtype, ...)`'s tensor as successive pieces of its rows, in order, each
    computed as it is asked for into one reused buffer (the shard writer hashes and writes each
    before asking for the next): the same bits, and memory holds a piece, never the tensor. The
    NaN/Inf of the native values are counted over all pieces and refused by `finite` after the last."""
    import torch

    size = torch.empty((), dtype=dtype).element_size()
    step = max(banded.align, max(1, piece_bytes // max(1, banded.cols * size)) // banded.align * banded.align)
    buffer = torch.empty(min(step, banded.rows) * banded.cols, dtype=dtype)
    bad = 0
    for start in range(0, banded.rows, step):
        stop = min(start + step, banded.rows)
        part = Banded(stop - start, banded.cols, banded.native,
                      lambda s, e, into, at=start: banded.fill(at + s, at + e, into), banded.align)
        piece, found = dequantize_into(part, dtype, finite is not None, buffer[:(stop - start) * banded.cols])
        bad += found
        yield piece
    if finite is not None:
        finite.require(bad)
