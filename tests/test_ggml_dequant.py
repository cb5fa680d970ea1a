"""GGUF dequantization (lmconvert/formats/ggml_dequant.py, _ggml.c's C kernels) gives bit for bit the float32 values of
`gguf.quants.dequantize`, which transformers' GGUF loader uses: every type it handles, on random
blocks (random bytes for every field: scales, minimums, quants), on blocks whose float16 fields
are the edge values (zeros of both signs, subnormals, the largest, Inf, quiet and signalling NaNs
with payloads), all-zero and all-ones blocks; and through the reader, on a tensor whose row count
does not divide the band. Equality is of the uint32 bits, not a tolerance."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from lmconvert.formats import ggml_c, ggml_dequant
from lmconvert.formats import gguf as gguf_format

Q = gguf.GGMLQuantizationType
TYPES = sorted(ggml_dequant.LAYOUT)
EDGES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,  # finite
                  0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFDFF, 0x7FFF], dtype=np.uint16)  # Inf, NaN


def same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype == np.float32 and ours.shape == theirs.shape
    differ = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
    assert differ.size == 0, (f"{differ.size} values differ, first at {differ[0]}: "
                              f"{ours.reshape(-1)[differ[0]]!r} vs gguf's {theirs.reshape(-1)[differ[0]]!r}")


def reference(raw: np.ndarray, kind: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(raw, Q[kind])


def test_layout_is_gguf_sizes() -> None:
    for kind, (block, size, _) in ggml_dequant.LAYOUT.items():
        assert gguf.GGML_QUANT_SIZES[Q[kind]] == (block, size)


@pytest.mark.parametrize("kind", TYPES)
def test_random_blocks(kind: str) -> None:
    """Random bytes everywhere: about 1 float16 field in 32 is Inf or NaN."""
    block, size, _ = ggml_dequant.LAYOUT[kind]
    raw = np.random.default_rng(len(kind) * 1000 + size).integers(0, 256, size=(3, 1000 * size), dtype=np.uint8)
    same_bits(ggml_dequant.dequantize(raw, kind), reference(raw, kind))


@pytest.mark.parametrize("kind", TYPES)
def test_finite_random_blocks(kind: str) -> None:
    """Every float16 field finite (the fast path alone, no block handed to gguf), from tiny to large."""
    block, size, fields = ggml_dequant.LAYOUT[kind]
    rng = np.random.default_rng(size)
    raw = rng.integers(0, 256, size=(4096, size), dtype=np.uint8)
    for at in fields:
        raw[:, at + 1] &= 0xFB  # the exponent's lowest bit cleared: even, so never 31
    assert not ggml_dequant._not_finite(raw, fields).any()
    same_bits(ggml_dequant.dequantize(raw, kind), reference(raw, kind))


@pytest.mark.parametrize("kind", TYPES)
def test_edge_scales(kind: str) -> None:
    """Each float16 field takes each edge value against each edge value of the others, over random quants."""
    block, size, fields = ggml_dequant.LAYOUT[kind]
    combos = np.stack(np.meshgrid(*[EDGES] * len(fields), indexing="ij"), axis=-1).reshape(-1, len(fields))
    raw = np.random.default_rng(7).integers(0, 256, size=(combos.shape[0] * 3, size), dtype=np.uint8)
    for i, at in enumerate(fields):
        raw[:, at:at + 2] = np.repeat(combos[:, i], 3).astype("<u2").view(np.uint8).reshape(-1, 2)
    same_bits(ggml_dequant.dequantize(raw, kind), reference(raw, kind))


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("byte", [0x00, 0xFF, 0x3C])
def test_constant_blocks(kind: str, byte: int) -> None:
    _, size, _ = ggml_dequant.LAYOUT[kind]
    raw = np.full((5, 2 * size), byte, dtype=np.uint8)
    same_bits(ggml_dequant.dequantize(raw, kind), reference(raw, kind))


@pytest.mark.parametrize("kind", TYPES)
def test_the_kernels_count_the_blocks_gguf_must_redo(kind: str) -> None:
    """The C kernel's count of blocks with an Inf or NaN float16 field, which decides whether any
    block goes to gguf's code, is the count of such blocks."""
    block, size, fields = ggml_dequant.LAYOUT[kind]
    raw = np.random.default_rng(size + 1).integers(0, 256, size=(2000, size), dtype=np.uint8)
    out = np.empty((2000, block), np.float32)
    expected = int(ggml_dequant._not_finite(raw, fields).sum())
    assert expected > 0
    with np.errstate(all="ignore"):
        assert ggml_c.dequantize(kind, raw, out) == expected


def test_size_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fill"):
        ggml_dequant.dequantize_into(np.zeros(34, dtype=np.uint8), "Q8_0", np.empty(64, np.float32))
    with pytest.raises(ValueError, match="do not fill"):
        ggml_c.dequantize("Q8_0", np.zeros(35, dtype=np.uint8), np.empty(32, np.float32))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "Q6_K", "Q4_1", "IQ4_NL"])
def test_reader_bands_do_not_divide_the_rows(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GgufFile.read: 37 rows in bands of 4 rows; IQ4_NL, which ggml_dequant.py does not know, goes
    through gguf's code."""
    block, size = gguf.GGML_QUANT_SIZES[Q[kind]]
    columns, rows = 2 * 256, 37
    raw = np.random.default_rng(3).integers(0, 256, size=(rows, columns // block * size), dtype=np.uint8)
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("w", raw, raw_dtype=Q[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setattr(gguf_format, "DEQUANTIZE_BAND", 4 * columns * 4)
    file = gguf_format.GgufFile(path)
    try:
        got = file.read("w")
    finally:
        file.close()
    assert got.dtype == torch.float32 and tuple(got.shape) == (rows, columns)
    same_bits(got.numpy(), reference(raw, kind))
