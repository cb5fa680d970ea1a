"""GGML's quantized blocks to float32, bit for bit what `gguf.quants.dequantize` gives, by the C
kernels of _ggml.c (15-40x gguf's numpy).

gguf's numpy code (the one transformers' GGUF loader uses) computes each value with a fixed chain
of float32 operations: Q8_0 is `float(q) * float(d)`, Q4_K is `(d * sc) * q - dmin * m`, each
product and difference rounded to float32 on its own. The C kernels run the same operations in the
same order on the same float32 operands, compiled without contraction into fused multiply-adds;
with finite scales nothing overflows, so IEEE rounding fixes every bit. A block whose float16
fields (d, dmin, m) hold an Inf or NaN is handed to gguf's own code instead, because which NaN's
payload survives `NaN - NaN` depends on the operand order inside numpy's kernels: the kernels count
such blocks, and only where there are some are they found and redone here.
tests/test_ggml_dequant.py compares every type with gguf's, bit for bit.
"""

from __future__ import annotations

import numpy as np

from . import ggml_c

QK_K = 256

# type name -> (values per block, bytes per block, byte offsets of its float16 fields); GGML's layout
LAYOUT: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "Q4_0": (32, 18, (0,)), "Q4_1": (32, 20, (0, 2)), "Q5_0": (32, 22, (0,)), "Q5_1": (32, 24, (0, 2)),
    "Q8_0": (32, 34, (0,)),
    "Q2_K": (QK_K, 84, (80, 82)), "Q3_K": (QK_K, 110, (108,)), "Q4_K": (QK_K, 144, (0, 2)),
    "Q5_K": (QK_K, 176, (0, 2)), "Q6_K": (QK_K, 210, (208,)),
}


def _not_finite(b: np.ndarray, fields: tuple[int, ...]) -> np.ndarray:
    """Blocks with an Inf or NaN float16 field: all five exponent bits set (0x7C of the high byte)."""
    exponents = b[:, [at + 1 for at in fields]] & 0x7C
    return (exponents == 0x7C).any(axis=1)


def dequantize_into(raw: np.ndarray, kind: str, out: np.ndarray) -> None:
    """Blocks of `kind` (raw: uint8, C-contiguous, whole blocks) into the C-contiguous float32 `out`
    of as many values as the blocks hold. The GIL is released while the kernel runs."""
    block, size, fields = LAYOUT[kind]
    if raw.size % size or out.size != raw.size // size * block:
        raise ValueError(f"{raw.size // size} {kind} blocks do not fill {out.size} values")
    if ggml_c.dequantize(kind, raw, out):
        import gguf

        blocks, values = raw.reshape(-1, size), out.reshape(-1, block)
        rows = _not_finite(blocks, fields).nonzero()[0]
        with np.errstate(all="ignore"):  # NaN * q: gguf's values, quietly
            values[rows] = gguf.quants.dequantize(blocks[rows], gguf.GGMLQuantizationType[kind])


def dequantize(raw: np.ndarray, kind: str) -> np.ndarray:
    """`gguf.quants.dequantize(raw, kind)` for the types in LAYOUT: raw (..., row bytes) uint8 ->
    (..., row values) float32."""
    block, size, _ = LAYOUT[kind]
    out = np.empty((*raw.shape[:-1], raw.shape[-1] // size * block), dtype=np.float32)
    dequantize_into(np.ascontiguousarray(raw), kind, out)
    return out
