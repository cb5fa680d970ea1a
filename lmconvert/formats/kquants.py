"""llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) encoded byte for byte as its reference
quantizer encodes them: `quantize_row_q{2..6}_K_ref` of ggml/src/ggml-quants.c, which is what
`llama_model_quantize` (`llama-quantize`) runs without an importance matrix.

The encoders are llama.cpp's own C, copied into _ggml.c and compiled as ggml-base compiles it (-O3,
gnu11, no contracted multiply-adds, no fast-math): every float operation is C's, in C's order, so
the bytes are llama.cpp's, including what its code makes of NaN and Inf (tests/test_kquants.py
compares them with libggml-base's on random and adversarial rows, and whole files with
llama_model_quantize's). The C releases the GIL: gguf_writer.py's encoder threads run at once.
"""

from __future__ import annotations

import numpy as np

from . import ggml_c

QK_K = 256
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
ENCODERS = tuple(BLOCK_BYTES)


def quantize(rows: np.ndarray, kind: str) -> np.ndarray:
    """float32 rows [..., n] (n a multiple of 256) -> their `kind` blocks, [..., n/256 * block bytes]
    uint8, byte for byte what ggml_quantize_chunk writes for them without an importance matrix."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if rows.shape[-1] % QK_K:
        raise ValueError(f"{kind}: a row of {rows.shape[-1]} values is not a whole number of {QK_K}-blocks")
    out = np.empty((*rows.shape[:-1], rows.shape[-1] // QK_K * BLOCK_BYTES[kind]), np.uint8)
    ggml_c.quantize(kind, rows, out)
    return out


__all__ = ["BLOCK_BYTES", "ENCODERS", "QK_K", "quantize"]
