"""AWQ (GEMM packing): lmconvert's dequantization against AutoAWQ's own formula, on checkpoints packed
here by AutoAWQ's own packing code (AutoAWQ and gptqmodel do not install beside this CPU torch:
docs/formats.md).

The packer is `WQLinear_GEMM.from_linear` (casper-hansen/AutoAWQ, awq/modules/linear/gemm.py):
integer weights `round((W + zeros*scales) / scales)`, transposed to [in, out], eight output columns
to an int32 word, column `8c + [0, 2, 4, 6, 1, 3, 5, 7][j]` in field j (bit 4j); zeros likewise. The
reference is `dequantize_gemm` (awq/utils/packing_utils.py) as written there: `unpack_awq` (right shifts
by 0, 4, ..., 28, cast to int8), `reverse_awq_order`, masks with 15, scales and zeros
`repeat_interleave`d over each group, `(iweight - izeros) * scales`.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_gptq import refusal

from lmconvert.formats import awq
from lmconvert.formats.errors import InputError
from lmconvert.formats.quantized_linear import TensorHeaders

OUT, IN = 32, 48
ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's AWQ_ORDER, the packer's order_map
REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]


def quantize(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ's asymmetric `pseudo_quantize_tensor`: per group of input columns, scales
    (max - min) / 15 and zeros -round(min / scales), clamped; ints [out, in], zeros and fp16 scales
    [groups, out]."""
    out_features, in_features = weight.shape
    group = in_features if group_size == -1 else group_size
    w = weight.reshape(-1, group)
    hi, lo = w.amax(dim=1, keepdim=True), w.amin(dim=1, keepdim=True)
    scales = ((hi - lo).clamp(min=1e-5) / 15)
    zeros = (-torch.round(lo / scales)).clamp(0, 15)
    scales = scales.reshape(out_features, -1).t().contiguous().half()
    zeros = zeros.reshape(out_features, -1).t().contiguous()
    zeros[0, :2], zeros[-1, 2:4] = 0, 15  # the fields' edge values
    s = scales.float()
    rows = torch.arange(in_features) // group
    intw = torch.round((weight + (zeros * s)[rows].t()) / s[rows].t()).clamp(0, 15).to(torch.int32)
    return intw, zeros.to(torch.int32), scales


def pack(values: torch.Tensor) -> torch.Tensor:
    """`WQLinear_GEMM.from_linear`'s loop: [rows, cols] ints to [rows, cols / 8] int32 words."""
    packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int32)
    for col in range(values.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= values[:, col * 8 + ORDER[i]] << (i * 4)
    return packed


def reference(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """AutoAWQ's `dequantize_gemm`, [in, out]."""
    shifts = torch.arange(0, 32, 4)
    iweight = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweight = iweight.view(iweight.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    order = torch.arange(izeros.shape[-1], dtype=torch.int32).view(-1, 8)[:, REVERSE].view(-1)
    iweight, izeros = iweight[:, order] & 15, izeros[:, order] & 15
    scales = scales.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweight - izeros) * scales


def checkpoint(group_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    weight = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(group_size + 3))
    intw, zeros, scales = quantize(weight, group_size)
    tensors = {"qweight": pack(intw.t().contiguous()), "qzeros": pack(zeros), "scales": scales}
    group = IN if group_size == -1 else group_size
    rows = torch.arange(IN) // group
    direct = (scales.float()[rows].t() * (intw - zeros[rows].t())).half()
    return tensors, direct


CONFIG = {"quant_method": "awq", "zero_point": True, "group_size": 16, "bits": 4, "version": "gemm",
          "modules_to_not_convert": None}


@pytest.mark.bitexact  # float16/bfloat16 bits, on AVX2's kernels too
@pytest.mark.parametrize("group_size", [16, 48, -1])
def test_dequantize_equals_autoawq(group_size: int) -> None:
    tensors, direct = checkpoint(group_size)
    recipe = awq.recipe({**CONFIG, "group_size": group_size}, "config.json")
    headers = TensorHeaders({f"m.{k}": v for k, v in tensors.items()}, "model.safetensors")
    assert awq.check_linear(recipe, "m", headers) == (OUT, IN)
    ours = awq.dequantize(recipe, "m", tensors, "model.safetensors")
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], IN if group_size == -1 else group_size)
    assert ours.shape == (OUT, IN) and ours.dtype == torch.float16 and ours.is_contiguous()
    assert torch.equal(ours.view(torch.int16), theirs.t().contiguous().view(torch.int16))
    assert torch.equal(ours.view(torch.int16), direct.view(torch.int16))  # the packer's own ints come back


def test_scales_cast_first() -> None:
    """gptqmodel's TorchAwqQuantLinear casts the scales to the activations' dtype, then dequantize_gemm."""
    tensors, _ = checkpoint(16)
    recipe = awq.recipe(CONFIG, "config.json")
    ours = awq.dequantize(recipe, "m", tensors, "f", dtype=torch.float32)
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"].float(), 16)
    assert ours.dtype == torch.float32 and torch.equal(ours, theirs.t())


def test_recipe_reads_autoawq_and_transformers_configs() -> None:
    assert awq.recipe({**CONFIG, "version": "GEMM", "backend": "autoawq"}, "c") == awq.AwqRecipe(16)
    transformers_saved = {"bits": 4, "group_size": 128, "zero_point": True, "backend": "auto", "format": "gemm",
                          "version": "gemm", "modules_to_not_convert": ["lm_head"], "desc_act": False, "sym": True,
                          "damp_percent": 0.1, "true_sequential": True, "quant_method": "awq", "tokenizer": None}
    assert awq.recipe(transformers_saved, "c") == awq.AwqRecipe(128)


@pytest.mark.parametrize("change,fragment", [
    ({"version": "gemv"}, "quantization_config.version 'gemv' is not handled"),
    ({"version": "gemv_fast"}, "quantization_config.version 'gemv_fast' is not handled"),
    ({"backend": "llm-awq"}, "quantization_config.backend 'llm-awq' is not handled"),
    ({"zero_point": False}, "quantization_config.zero_point False is not handled (only True)"),
    ({"bits": 8}, "quantization_config.bits 8 is not handled (only 4)"),
    ({"w_bit": 4}, "quantization_config.w_bit is an option lmconvert does not handle"),
])
def test_refused_options(change: dict, fragment: str) -> None:
    with pytest.raises(InputError) as caught:
        awq.recipe({**CONFIG, **change}, "/m/config.json")
    message = str(caught.value)
    assert fragment in message and message.startswith("/m/config.json: ") and "\n" not in message


def hostile(change: dict[str, torch.Tensor], recipe: awq.AwqRecipe | None = None) -> str:
    tensors, _ = checkpoint(16)
    tensors = {**tensors, **change}
    recipe = recipe or awq.recipe(CONFIG, "config.json")
    headers = TensorHeaders({f"m.{k}": v for k, v in tensors.items()}, "/m/x.safetensors")
    return refusal(lambda: awq.check_linear(recipe, "m", headers, OUT, IN),
                   lambda: awq.dequantize(recipe, "m", tensors, "/m/x.safetensors"))


def test_hostile_inputs() -> None:
    assert "'m.scales' has shape [3, 31], but AWQ GEMM 4-bit, group_size 16 needs [3, 32]" in hostile(
        {"scales": torch.ones(3, 31, dtype=torch.float16)})
    assert "'m.scales' holds NaN or Inf scales" in hostile({"scales": torch.full((3, 32), math.inf).half()})
    assert "'m.qweight' has shape [48, 5], but" in hostile({"qweight": torch.zeros(48, 5, dtype=torch.int32)})
    assert "'m.qzeros' is int64, but" in hostile({"qzeros": torch.zeros(3, 4, dtype=torch.int64)})
    assert "group_size 32 does not divide its 48 input features" in hostile({}, awq.AwqRecipe(32))
    with pytest.raises(InputError, match="has no 'm.qzeros'"):
        awq.check_linear(awq.AwqRecipe(16), "m", TensorHeaders({"m.qweight": torch.zeros(48, 4, dtype=torch.int32),
                                                                "m.scales": torch.zeros(3, 32)}, "f"))
