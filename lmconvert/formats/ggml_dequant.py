"""GGML's quantized blocks to float32, bit for bit what `gguf.quants.dequantize` gives, 3-8x faster.

gguf's numpy code (the one transformers' GGUF loader uses) computes each value with a fixed chain
of float32 operations: Q8_0 is `float(q) * float(d)`, Q4_K is `(d * sc) * q - dmin * m`, each
product and difference rounded to float32 on its own. The same operations run here in the same
order on the same float32 operands; with finite scales nothing overflows, so IEEE rounding fixes
every bit. A block whose float16 fields (d, dmin, m) hold an Inf or NaN is handed to gguf's own
code instead, because which NaN's payload survives `NaN - NaN` depends on the instruction's
operand order, which numpy's and torch's kernels do not share.

What differs is how: the integer unpacking (nibbles, high bits, 6-bit scales; exact whatever the
order) is done on bytes by whole-chunk torch operations (the small per-sub-block scales by numpy,
whose calls cost less), then one conversion to float32 and one or two broadcast multiply/subtract
passes, 2^18 values (1 MiB) at a time, instead of numpy's dozen full-size temporaries per value.
tests/test_ggml_dequant.py compares every type with gguf's, bit for bit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

QK_K = 256
CHUNK_VALUES = 1 << 18  # float32 values dequantized per step (1 MiB)

# type name -> (values per block, bytes per block, byte offsets of its float16 fields); GGML's layout
LAYOUT: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "Q4_0": (32, 18, (0,)), "Q4_1": (32, 20, (0, 2)), "Q5_0": (32, 22, (0,)), "Q5_1": (32, 24, (0, 2)),
    "Q8_0": (32, 34, (0,)),
    "Q2_K": (QK_K, 84, (80, 82)), "Q3_K": (QK_K, 110, (108,)), "Q4_K": (QK_K, 144, (0, 2)),
    "Q5_K": (QK_K, 176, (0, 2)), "Q6_K": (QK_K, 210, (208,)),
}


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """A float16 field of each block (at an even offset; blocks are an even number of bytes), as
    float32, shaped (blocks, 1)."""
    return b[:, at:at + 2].view(torch.float16).float()


def _scaled(b: torch.Tensor, at: int, ints: np.ndarray) -> torch.Tensor:
    """float32(f16 field at `at`) * float32(ints), per sub-block: (blocks, sub-blocks, 1). Small
    arrays, so numpy (a microsecond an operation, torch's are several)."""
    d = np.ascontiguousarray(b.numpy()[:, at:at + 2]).view(np.float16).astype(np.float32)
    return torch.from_numpy((d * ints.astype(np.float32))[:, :, None])


def _planes(src: torch.Tensor, width: int, group: int) -> torch.Tensor:
    """Bytes -> `width`-bit fields, lowest bits first: each run of `group` bytes gives 8 // width
    rows of `group` values (GGML's order), as (blocks, values) bytes."""
    n = src.shape[0]
    runs = src.contiguous().view(n, -1, group)  # one strided copy; then each operation runs over one flat array
    mask, top = (1 << width) - 1, 8 - width
    rows = [runs >> top if shift == top else (runs >> shift if shift else runs) & mask for shift in range(0, 8, width)]
    return torch.stack(rows, dim=2).view(n, -1)  # the top field needs no mask


def _values(q: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    o.copy_(q.view(o.shape))  # exact: small integers
    return o


def _q8_0(b: torch.Tensor, o: torch.Tensor) -> None:
    o.copy_(b[:, 2:].view(torch.int8))
    o.mul_(_f16(b, 0))  # gguf: x * d


def _q4_0(b: torch.Tensor, o: torch.Tensor) -> None:
    q = _planes(b[:, 2:], 4, 16).view(torch.int8)
    q -= 8  # gguf: int8(q) - 8, then d * q
    _values(q, o).mul_(_f16(b, 0))


def _q4_1(b: torch.Tensor, o: torch.Tensor) -> None:
    _values(_planes(b[:, 4:], 4, 16), o).mul_(_f16(b, 0))  # gguf: d * q + m
    o.add_(_f16(b, 2))


def _five(b: torch.Tensor, qs: int, qh: int) -> torch.Tensor:
    """Q5_0/Q5_1: nibbles | the 32 fifth bits (a little-endian uint32: bit i is bit i % 8 of
    byte i // 8) << 4."""
    q = _planes(b[:, qs:qs + 16], 4, 16)
    high = _planes(b[:, qh:qh + 4], 1, 1)
    high <<= 4
    q |= high
    return q


def _q5_0(b: torch.Tensor, o: torch.Tensor) -> None:
    q = _five(b, 6, 2).view(torch.int8)
    q -= 16  # int8(q) - 16, then d * q
    _values(q, o).mul_(_f16(b, 0))


def _q5_1(b: torch.Tensor, o: torch.Tensor) -> None:
    _values(_five(b, 8, 4), o).mul_(_f16(b, 0))  # d * q + m
    o.add_(_f16(b, 2))


def _k_min(b: torch.Tensor, q: torch.Tensor, o: torch.Tensor) -> None:
    """Q4_K/Q5_K: (d * sc) * q - dmin * m over 8 sub-blocks of 32; the 12 bytes at 4 hold the
    6-bit scales and minimums (gguf's get_scale_min)."""
    n = b.shape[0]
    # each 4 bytes as one little-endian uint32, masked byte by byte (a shift by 2 or 4 moves the
    # bits the masks keep within their byte): a few operations on n values, not on n rows of 4
    d, m, md = np.ascontiguousarray(b.numpy()[:, 4:16]).view("<u4").T
    sc = np.stack([d & 0x3F3F3F3F, (md & 0x0F0F0F0F) | ((d >> 2) & 0x30303030)], axis=1).view(np.uint8)
    mn = np.stack([m & 0x3F3F3F3F, ((md >> 4) & 0x0F0F0F0F) | ((m >> 2) & 0x30303030)], axis=1).view(np.uint8)
    ov = o.view(n, 8, 32)
    _values(q, ov).mul_(_scaled(b, 0, sc))
    ov.sub_(_scaled(b, 2, mn))


def _q4_k(b: torch.Tensor, o: torch.Tensor) -> None:
    _k_min(b, _planes(b[:, 16:], 4, 32), o)


def _q5_k(b: torch.Tensor, o: torch.Tensor) -> None:
    q = _planes(b[:, 48:], 4, 32)
    high = _planes(b[:, 16:48], 1, 32)
    high <<= 4
    q |= high
    _k_min(b, q, o)


def _q6_k(b: torch.Tensor, o: torch.Tensor) -> None:
    n = b.shape[0]
    q = _planes(b[:, 0:128], 4, 64)
    high = _planes(b[:, 128:192], 2, 32)
    high <<= 4
    q |= high
    q = q.view(torch.int8)
    q -= 32  # int8(q) - 32, then (d * scale) * q
    ov = o.view(n, 16, 16)
    _values(q, ov).mul_(_scaled(b, 208, b.numpy()[:, 192:208].view(np.int8)))


def _q2_k(b: torch.Tensor, o: torch.Tensor) -> None:
    n = b.shape[0]
    scales = b.numpy()[:, 0:16]
    ov = o.view(n, 16, 16)
    _values(_planes(b[:, 16:80], 2, 32), ov).mul_(_scaled(b, 80, scales & 0x0F))  # dl * q - ml
    ov.sub_(_scaled(b, 82, scales >> 4))


def _q3_k(b: torch.Tensor, o: torch.Tensor) -> None:
    n = b.shape[0]
    s = b.numpy()[:, 96:108]
    lo = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
    hi = np.concatenate([(s[:, 8:12] >> k) & 3 for k in (0, 2, 4, 6)], axis=1)
    scales = (lo | (hi << 4)).view(np.int8) - np.int8(32)  # int8 arithmetic, as gguf's
    minus4 = _planes(b[:, 0:32], 1, 32)
    minus4 ^= 1
    minus4 <<= 2  # a high bit of 0 subtracts 4
    q = _planes(b[:, 32:96], 2, 32).view(torch.int8)
    q -= minus4.view(torch.int8)
    ov = o.view(n, 16, 16)
    _values(q, ov).mul_(_scaled(b, 108, scales))


KERNELS: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}


def _not_finite(b: np.ndarray, fields: tuple[int, ...]) -> np.ndarray:
    """Blocks with an Inf or NaN float16 field: all five exponent bits set (0x7C of the high byte)."""
    exponents = b[:, [at + 1 for at in fields]] & 0x7C
    return (exponents == 0x7C).any(axis=1)


def dequantize_into(raw: torch.Tensor, kind: str, out: torch.Tensor) -> None:
    """Blocks of `kind` (raw: uint8, whole blocks) into float32 `out` (contiguous, as many values
    as the blocks hold), a chunk of blocks at a time."""
    block, size, fields = LAYOUT[kind]
    blocks = raw.reshape(-1, size)
    values = out.view(-1, block)
    if values.shape[0] != blocks.shape[0]:
        raise ValueError(f"{blocks.shape[0]} {kind} blocks do not fill {out.numel()} values")
    kernel, step = KERNELS[kind], max(1, CHUNK_VALUES // block)
    for start in range(0, blocks.shape[0], step):
        b, o = blocks[start:start + step], values[start:start + step]
        kernel(b, o)
        bad = _not_finite(b.numpy(), fields)
        if bad.any():
            import gguf

            rows = torch.from_numpy(bad.nonzero()[0])
            with np.errstate(all="ignore"):  # NaN * q: gguf's values, quietly
                o[rows] = torch.from_numpy(gguf.quants.dequantize(b[rows].numpy(), gguf.GGMLQuantizationType[kind]))


_held = threading.Lock()
_holders = [0, 0]  # how many callers hold torch to one thread, and the count of threads before them


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's operations on one thread each while held: the callers spread chunks over their own
    threads, and torch's OpenMP teams inside each of those would oversubscribe the cores (its
    spinning workers made a band 10x slower on a loaded 2-core machine). Threads started inside
    take the count of one when they first use torch; the count before is restored by the last to
    leave."""
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


def dequantize(raw: np.ndarray, kind: str) -> np.ndarray:
    """`gguf.quants.dequantize(raw, kind)` for the types in KERNELS: raw (..., row bytes) uint8 ->
    (..., row values) float32."""
    block, size, _ = LAYOUT[kind]
    out = np.empty((*raw.shape[:-1], raw.shape[-1] // size * block), dtype=np.float32)
    dequantize_into(torch.from_numpy(np.ascontiguousarray(raw)), kind, torch.from_numpy(out))
    return out
