"""NaN/Inf in GGUF tensor data as written, without decoding it.

A finite weight can still be written as Inf: 1e5 cast to F16, or a block of Q4_0 whose largest
value needs a scale over float16's 65504. lmconvert's reader (and llama.cpp) then refuse the file,
so the writer checks the bytes it writes, chunk by chunk as it writes them. GGML's quantized types
store blocks of a fixed size whose float fields (scales, minimums) lie at fixed offsets; those are
the only values that can be NaN/Inf, and they are tested in place, through a strided view, as
`digest.py` tests floats: all exponent bits set.
"""

from __future__ import annotations

import numpy as np

from .digest import CHUNK

_F16 = (np.uint16, 0x7C00)
# GGML type -> its float fields within a block: (byte offset, bits type, exponent mask)
FLOAT_FIELDS: dict[str, tuple[tuple[int, type, int], ...]] = {
    "F32": ((0, np.uint32, 0x7F80_0000),),
    "F16": ((0, *_F16),),
    "BF16": ((0, np.uint16, 0x7F80),),
    "Q8_0": ((0, *_F16),),  # d, then 32 int8
    "Q4_0": ((0, *_F16),),  # d, then 16 bytes of nibbles
    "Q4_1": ((0, *_F16), (2, *_F16)),  # d, m
    "Q5_0": ((0, *_F16),),  # d, then the high bits and nibbles
    "Q5_1": ((0, *_F16), (2, *_F16)),  # d, m
    "TQ1_0": ((52, *_F16),),  # 52 bytes of trits, then d
    "TQ2_0": ((64, *_F16),),  # 64 bytes of 2-bit values, then d
    "MXFP4": ((0, np.uint8, 0xFF),),  # an E8M0 exponent, whose all-ones is NaN
    "Q2_K": ((80, *_F16), (82, *_F16)),  # 16 scale bytes and 64 of 2-bit values, then d, dmin
    "Q3_K": ((108, *_F16),),  # high bits, 2-bit values, 12 scale bytes, then d
    "Q4_K": ((0, *_F16), (2, *_F16)),  # d, dmin, then 12 scale bytes and the nibbles
    "Q5_K": ((0, *_F16), (2, *_F16)),  # d, dmin, then scales, high bits, nibbles
    "Q6_K": ((208, *_F16),),  # low and high bits, 16 int8 scales, then d
}


def block_bytes(kind: str) -> int:
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]


def chunk_bytes(kind: str) -> int:
    """About CHUNK bytes, whole blocks: each chunk is checked while it is in cache, then written."""
    size = block_bytes(kind)
    return max(1, CHUNK // size) * size


def nonfinite(chunk: memoryview, kind: str) -> int:
    """NaN/Inf values among the float fields of the whole blocks of type `kind` in `chunk`."""
    size = block_bytes(kind)
    blocks = len(chunk) // size
    found = 0
    for offset, bits, mask in FLOAT_FIELDS[kind]:
        field = np.ndarray((blocks,), dtype=bits, buffer=chunk, offset=offset, strides=(size,))
        masked = field & bits(mask)
        if blocks and masked.max() == mask:  # (x & mask) <= mask, equal only when all are set
            found += int(np.count_nonzero(masked == mask))
    return found
