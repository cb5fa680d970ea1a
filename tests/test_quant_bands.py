"""`convert --dtype`'s banded dequantization (formats/quant_bands.py) against the reference formulas,
bit for bit: each format's product computed whole as its reference computes it, widened to float32,
then cast to the target dtype (what `--dtype` wrote before bands), against the bands cast straight
into the target, with bands that do not divide the rows, on one thread and on several.

FP8: transformers' `Fp8Dequantize._dequantize_one` (both sides `.to(torch.float32)`, one product per
block) and fbgemm's per-row product; GPTQ: gptqmodel's `scales[g_idx] * (w - zeros[g_idx])` in the
scales' dtype (test_gptq.py's `reference`, on weights packed by gptqmodel's packer there), desc_act
g_idx permutations, zeros of 0 and maxq, 4 and 8 bits, v1 and v2 zeros.
"""

from __future__ import annotations

import pytest
import torch
from test_gptq import checkpoint, config, reference

from lmconvert.formats import fp8, gptq
from lmconvert.formats.digest import FiniteCheck, memory_chunks, scan, tensor_bytes
from lmconvert.formats.errors import InputError
from lmconvert.formats.quant_bands import band_rows, dequantize_into

TARGETS = (torch.bfloat16, torch.float16, torch.float32)
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def same_bits(ours: torch.Tensor, want: torch.Tensor) -> bool:
    return (ours.dtype == want.dtype and ours.shape == want.shape
            and torch.equal(ours.view(BITS[ours.dtype]), want.contiguous().view(BITS[want.dtype])))


def nonfinite(t: torch.Tensor) -> int:
    """What `--dtype`'s check counted on the whole float32 weight."""
    return scan(memory_chunks(tensor_bytes(t.float())), "F32", None).nonfinite


GPTQ_CASES = [(bits, group, sym, desc, v1) for bits in (4, 8) for group, desc in ((16, False), (16, True), (-1, False))
              for sym in (True, False) for v1 in (True, False)]


@pytest.mark.bitexact
@pytest.mark.parametrize("bits,group_size,sym,desc_act,v1", GPTQ_CASES)
def test_gptq_bands_are_the_reference_cast(bits: int, group_size: int, sym: bool, desc_act: bool, v1: bool) -> None:
    tensors, _ = checkpoint(bits, group_size, sym, desc_act, v1, out_features=40, in_features=64)
    recipe = gptq.recipe(config(bits, group_size, sym, desc_act, v1), "config.json")
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], bits, v1)
    banded = gptq.banded(recipe, "m", tensors, "f")
    assert band_rows(banded, 2, 7 * 64 * 2) == 7  # 40 rows in bands of 7: the last one short
    for dtype in TARGETS:
        for threads in (1, 3):
            ours, bad = dequantize_into(banded, dtype, True, band_bytes=7 * 64 * 2, threads=threads)
            assert bad == 0 and same_bits(ours, theirs.float().to(dtype)), (dtype, threads)


def test_gptq_bands_into_bfloat16_scales_and_overflow_counted() -> None:
    """bfloat16 scales: the product in bfloat16 (gptqmodel's dtype order), then the cast. float16 scales
    so large that products overflow: the Inf counted as the float32 weight's check counts it."""
    tensors, _ = checkpoint(4, 16, False, True, False, out_features=40, in_features=64)
    recipe = gptq.recipe(config(4, 16, False, True, False), "config.json")
    tensors["scales"] = tensors["scales"].bfloat16()
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], 4, False)
    for dtype in TARGETS:
        ours, _ = dequantize_into(gptq.banded(recipe, "m", tensors, "f"), dtype, True, band_bytes=1000, threads=2)
        assert same_bits(ours, theirs.float().to(dtype))
    tensors["scales"] = torch.full_like(tensors["scales"], 30000, dtype=torch.float16)
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], 4, False)
    ours, bad = dequantize_into(gptq.banded(recipe, "m", tensors, "f"), torch.bfloat16, True, band_bytes=1000)
    assert bad == nonfinite(theirs) > 0 and same_bits(ours, theirs.float().to(torch.bfloat16))


def fp8_reference(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """transformers 5.25's `_dequantize_one`: both to float32, the block's scale broadcast over it."""
    rows, cols = q.shape[-2:]
    sr, sc = s.shape[-2:] if s.dim() >= 2 else (1, 1)
    w = q.to(torch.float32).reshape(-1, sr, rows // sr, sc, cols // sc)
    return (w * s.to(torch.float32).reshape(-1, sr, 1, sc, 1)).reshape(q.shape)


def e4m3(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Every code, NaN (0x7F, 0xFF) and subnormals included, in random places."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)


FP8_CASES = {  # weight shape, scale shape
    "blocks": ((56, 48), (7, 3)),  # 8x16 blocks
    "stack of blocks": ((3, 16, 32), (3, 2, 4)),
    "per-tensor []": ((24, 40), ()),
    "per-tensor [1]": ((24, 40), (1,)),
    "per-tensor [1, 1]": ((24, 40), (1, 1)),
    "stack per-tensor": ((2, 24, 40), (2, 1, 1)),
}


@pytest.mark.bitexact
@pytest.mark.parametrize("case", list(FP8_CASES))
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_fp8_bands_are_the_reference_cast(case: str, scale_dtype: torch.dtype) -> None:
    shape, scale_shape = FP8_CASES[case]
    q = e4m3(shape, len(case))
    s = (torch.rand(scale_shape, generator=torch.Generator().manual_seed(1)) * 4e-3 + 1e-5).to(scale_dtype)
    theirs = fp8_reference(q, s)
    banded = fp8.banded(q, s)
    for band_bytes in (1, 17 * shape[-1] * 4, 1 << 20):  # a block (or a row) a band, bands not dividing, one band
        for dtype in TARGETS:
            for threads in (1, 3):
                ours, bad = dequantize_into(banded, dtype, True, band_bytes=band_bytes, threads=threads)
                assert bad == nonfinite(theirs) > 0  # the NaN codes, counted as the float32 check counts
                assert same_bits(ours, theirs.to(dtype)), (band_bytes, dtype, threads)


@pytest.mark.bitexact
def test_fbgemm_bands_are_the_reference_cast() -> None:
    q = e4m3((37, 24), 3)
    s = torch.rand(37, 1, generator=torch.Generator().manual_seed(2)) * 1e-2
    theirs = q.to(torch.float32) * s
    for dtype in TARGETS:
        ours, bad = dequantize_into(fp8.banded_rows(q, s), dtype, True, band_bytes=5 * 24 * 4, threads=2)
        assert bad == nonfinite(theirs) and same_bits(ours, theirs.to(dtype))


def test_unchecked_counts_nothing_and_out_is_filled() -> None:
    q, s = e4m3((16, 32), 4), torch.rand(2, 2)
    out = torch.empty(16, 32, dtype=torch.bfloat16)
    got, bad = dequantize_into(fp8.banded(q, s), torch.bfloat16, False, out=out, band_bytes=256, threads=2)
    assert got is out and bad == 0 and same_bits(out, fp8_reference(q, s).to(torch.bfloat16))


def test_refusal_names_the_tensor_as_before() -> None:
    """The count goes to the same FiniteCheck the float32 weight's scan went to: the same message."""
    q, s = e4m3((16, 32), 5), torch.rand(2, 2)
    _, bad = dequantize_into(fp8.banded(q, s), torch.bfloat16, True, band_bytes=256, threads=2)
    with pytest.raises(InputError, match=rf"tensor 'x.weight' holds {nonfinite(fp8_reference(q, s))} NaN/Inf"):
        FiniteCheck("x.weight", "f.safetensors").require(bad)
