"""GPTQ: lmconvert's dequantization against gptqmodel's own formula, on checkpoints packed here by
gptqmodel's own packing code (gptqmodel does not install beside this CPU torch: docs/formats.md).

The packer is `PackableQuantLinear.pack_original` (ModelCloud/GPTQModel,
gptqmodel/nn_modules/qlinear/__init__.py): integer weights `round((W + zeros*scales) / scales)`
clamped to [0, maxq], packed `32 // bits` input rows per int32 word (field j at bit bits*j), zeros
packed the same way along the output columns; v1 files then have `0b0001...0001` subtracted from each
qzeros word (gptqmodel/utils/model.py, `convert_gptq_v2_to_v1_format_module`). The reference
dequantization is `PackableQuantLinear.dequantize_weight` as written there: shifts by
`wf.unsqueeze(0)` / `wf.unsqueeze(-1)`, int8 (int16 at 8 bits) fields masked with maxq, v1 zeros
corrected by the whole-word addition of `convert_gptq_v1_to_v2_format_module`, then
`scales[g_idx] * (weight - zeros[g_idx])`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from lmconvert.formats import gptq
from lmconvert.formats.errors import InputError
from lmconvert.formats.quantized_linear import TensorHeaders, linears

OUT, IN = 24, 64


def quantize(weight: torch.Tensor, bits: int, group_size: int, sym: bool, desc_act: bool,
             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integer weights [out, in], zeros and fp16 scales [groups, out] and g_idx as GPTQ produces them:
    with desc_act the groups follow a permutation of the input rows (g_idx = perm-order // group)."""
    out_features, in_features = weight.shape
    group = in_features if group_size == -1 else group_size
    n = in_features // group
    maxq = 2 ** bits - 1
    if desc_act:
        perm = torch.randperm(in_features, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty(in_features, dtype=torch.int32)
        g_idx[perm] = (torch.arange(in_features) // group).to(torch.int32)
    else:
        g_idx = (torch.arange(in_features) // group).to(torch.int32)
    scales = torch.empty(n, out_features)
    zeros = torch.empty(n, out_features)
    for g in range(n):
        cols = weight[:, g_idx == g]
        lo, hi = cols.min(1).values.clamp(max=0), cols.max(1).values.clamp(min=0)
        if sym:
            scale = torch.maximum(lo.abs(), hi) * 2 / maxq
            zero = torch.full_like(scale, (maxq + 1) / 2)
        else:
            scale = (hi - lo) / maxq
            zero = torch.round(-lo / scale)
        scales[g], zeros[g] = scale, zero
    zeros[0, :3] = 0  # zeros of 0 (all-ones fields in v1 files) and of maxq: the words' edge cases
    zeros[-1, 3:5] = maxq
    scales = scales.half()
    # pack_original: int_weight = round((W + scale_zeros[g_idx].T) / scales[g_idx].T), clamped
    s = scales.float()
    intw = torch.round((weight + (zeros * s)[g_idx.long()].T) / s[g_idx.long()].T).clamp(0, maxq).to(torch.int32)
    return intw, zeros.to(torch.int32), scales, g_idx


def pack(intw: torch.Tensor, zeros: torch.Tensor, bits: int, v1: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """gptqmodel's `pack_original` loops (numpy uint32), then v1's whole-word subtraction."""
    pf = 32 // bits
    int_weight = intw.T.contiguous().numpy().astype(np.uint32)  # [in, out]
    qweight = np.zeros((math.ceil(int_weight.shape[0] * bits / 32), int_weight.shape[1]), dtype=np.uint32)
    for row in range(qweight.shape[0]):
        for j in range(pf):
            qweight[row] |= int_weight[row * pf + j] << (bits * j)
    z = zeros.numpy().astype(np.uint32)
    qzeros = np.zeros((z.shape[0], math.ceil(z.shape[1] * bits / 32)), dtype=np.uint32)
    for col in range(qzeros.shape[1]):
        for j in range(pf):
            qzeros[:, col] |= z[:, col * pf + j] << (bits * j)
    if v1:
        qzeros -= np.uint32(gptq.V1_ADD[bits])  # convert_gptq_v2_to_v1_format_module, wrapping as int32 does
    return torch.from_numpy(qweight.view(np.int32)), torch.from_numpy(qzeros.view(np.int32))


def reference(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
              bits: int, v1: bool) -> torch.Tensor:
    """gptqmodel's `dequantize_weight` (bits 2/4/8 branch) and `_dequantize_from_codes`, num_itr=1,
    after `convert_gptq_v1_to_v2_format_module` for v1 files; transposed to [out, in]."""
    pf, maxq = 32 // bits, 2 ** bits - 1
    dequant_dtype = torch.int16 if bits == 8 else torch.int8
    if v1:
        qzeros = qzeros + gptq.V1_ADD[bits]  # in place on the int32 buffer in gptqmodel
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(torch.unsqueeze(qzeros, 2).expand(-1, -1, pf), wf.unsqueeze(0)).to(dequant_dtype)
    zeros = torch.bitwise_and(zeros, maxq).reshape(scales.shape)
    weight = torch.bitwise_and(torch.bitwise_right_shift(torch.unsqueeze(qweight, 1).expand(-1, pf, -1),
                                                         wf.unsqueeze(-1)).to(dequant_dtype), maxq)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    return (scales[g_idx.long()] * (weight - zeros[g_idx.long()])).T


def checkpoint(bits: int, group_size: int, sym: bool, desc_act: bool, v1: bool,
               out_features: int = OUT, in_features: int = IN) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(bits * 7 + group_size))
    intw, zeros, scales, g_idx = quantize(weight, bits, group_size, sym, desc_act)
    qweight, qzeros = pack(intw, zeros, bits, v1)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
    # the ints themselves, for the packer's own check
    direct = (scales.float()[g_idx.long()].T * (intw - zeros[g_idx.long()].T)).half()
    return tensors, direct


def config(bits: int, group_size: int, sym: bool, desc_act: bool, v1: bool) -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym, "desc_act": desc_act,
            "checkpoint_format": "gptq" if v1 else "gptq_v2", "damp_percent": 0.01, "true_sequential": True,
            "static_groups": False, "model_name_or_path": None, "model_file_base_name": "model"}


CASES = [(bits, group, sym, desc, v1) for bits in (4, 8) for group, desc in ((16, False), (16, True), (-1, False))
         for sym in (True, False) for v1 in (True, False)]


@pytest.mark.bitexact  # float16/bfloat16 bits, on AVX2's kernels too
@pytest.mark.parametrize("bits,group_size,sym,desc_act,v1", CASES)
def test_dequantize_equals_gptqmodel(bits: int, group_size: int, sym: bool, desc_act: bool, v1: bool) -> None:
    tensors, direct = checkpoint(bits, group_size, sym, desc_act, v1)
    recipe = gptq.recipe(config(bits, group_size, sym, desc_act, v1), "config.json")
    headers = TensorHeaders({f"m.{k}": v for k, v in tensors.items()}, "model.safetensors")
    assert gptq.check_linear(recipe, "m", headers) == (OUT, IN)
    ours = gptq.dequantize(recipe, "m", tensors, "model.safetensors")
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], bits, v1)
    assert ours.shape == (OUT, IN) and ours.dtype == torch.float16 and ours.is_contiguous()
    assert torch.equal(ours.view(torch.int16), theirs.contiguous().view(torch.int16))
    assert torch.equal(ours.view(torch.int16), direct.view(torch.int16))  # the packer's own ints come back


def test_v1_zero_of_zero_is_gptqmodels_whole_word_reading() -> None:
    """A v1 field holding all ones (a zero of 0) carries into the next field as gptqmodel reads it;
    gptqmodel's own v2->v1 export then comes back exactly. AutoGPTQ's per-field `(z + 1) & maxq`
    reads the same words differently only there."""
    zeros = torch.tensor([[0, 5, 15, 0, 7, 0, 1, 2]], dtype=torch.int32)
    _, qzeros = pack(torch.zeros(8, 8, dtype=torch.int32), zeros, 4, v1=True)
    recipe = gptq.GptqRecipe(4, -1, False, False, "gptq")
    assert torch.equal(gptq.zeros(recipe, qzeros), zeros.to(torch.int16))
    fields = (qzeros.unsqueeze(-1) >> torch.arange(0, 32, 4)) & 15
    assert not torch.equal(((fields + 1) & 15).flatten(-2), zeros)


def test_bfloat16_scales_and_a_cast() -> None:
    tensors, _ = checkpoint(4, 16, False, True, False)
    recipe = gptq.recipe(config(4, 16, False, True, False), "config.json")
    as_f32 = gptq.dequantize(recipe, "m", tensors, "f", dtype=torch.float32)
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"].float(), tensors["g_idx"], 4, False)
    assert as_f32.dtype == torch.float32 and torch.equal(as_f32, theirs.contiguous())
    tensors["scales"] = tensors["scales"].bfloat16()
    ours = gptq.dequantize(recipe, "m", tensors, "f")
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], 4, False)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours.view(torch.int16), theirs.contiguous().view(torch.int16))


def test_g_idx_may_be_absent_without_desc_act() -> None:
    tensors, _ = checkpoint(4, 16, True, False, True)
    recipe = gptq.recipe(config(4, 16, True, False, True), "config.json")
    g_idx = tensors.pop("g_idx")
    gptq.check_linear(recipe, "m", TensorHeaders({f"m.{k}": v for k, v in tensors.items()}, "f"))
    theirs = reference(tensors["qweight"], tensors["qzeros"], tensors["scales"], g_idx, 4, True)
    assert torch.equal(gptq.dequantize(recipe, "m", tensors, "f"), theirs)


def test_recipe_reads_transformers_and_gptqmodel_configs() -> None:
    transformers_saved = {"bits": 4, "tokenizer": None, "dataset": None, "group_size": 128, "damp_percent": 0.1,
                          "desc_act": True, "act_group_aware": False, "sym": False, "true_sequential": True,
                          "format": "gptq", "checkpoint_format": "gptq", "meta": None, "backend": "auto",
                          "model_seqlen": None, "block_name_to_quantize": None,
                          "module_name_preceding_first_block": None, "batch_size": 1, "pad_token_id": None,
                          "max_input_length": None, "cache_block_outputs": True,
                          "modules_in_block_to_quantize": None, "quant_method": "gptq"}
    assert gptq.recipe(transformers_saved, "c") == gptq.GptqRecipe(4, 128, False, True, "gptq")
    gptqmodel_saved = {"bits": 8, "group_size": -1, "desc_act": False, "lm_head": False, "method": "gptq",
                       "quant_method": "gptq", "format": "gptq_v2", "checkpoint_format": "gptq_v2",
                       "pack_dtype": "int32", "meta": {"quantizer": ["gptqmodel:5.0"]}, "sym": True}
    assert gptq.recipe(gptqmodel_saved, "c") == gptq.GptqRecipe(8, -1, True, False, "gptq_v2")


@pytest.mark.parametrize("change,fragment", [
    ({"bits": 3}, "quantization_config.bits 3 is not handled (only 4, 8)"),
    ({"checkpoint_format": "marlin"}, "quantization_config.checkpoint_format 'marlin' is not handled"),
    ({"dynamic": {"-:.*down": {}}}, "quantization_config.dynamic"),
    ({"rotation": "hadamard"}, "quantization_config.rotation 'hadamard' is not handled"),
    ({"pack_dtype": "int16"}, "quantization_config.pack_dtype 'int16' is not handled"),
    ({"new_option": 1}, "quantization_config.new_option is an option lmconvert does not handle"),
    ({"group_size": 0}, "quantization_config.group_size 0 is not a positive integer or -1"),
    ({"desc_act": "yes"}, "quantization_config.desc_act 'yes' is not true or false"),
    ({"format": "gptq_v2"}, "checkpoint_format and format disagree"),
])
def test_refused_options(change: dict, fragment: str) -> None:
    with pytest.raises(InputError, match=None) as caught:
        gptq.recipe({**config(4, 16, True, False, True), **change}, "/m/config.json")
    message = str(caught.value)
    assert fragment in message and message.startswith("/m/config.json: ") and "\n" not in message


def refusal(*calls: Callable[[], object]) -> str:
    """The one-line InputError the first failing call raises (the rest must not be reached)."""
    with pytest.raises(InputError) as caught:
        for call in calls:
            call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def hostile(change: dict[str, torch.Tensor], drop: str = "", recipe: gptq.GptqRecipe | None = None) -> str:
    tensors, _ = checkpoint(4, 16, False, True, True)
    tensors = {**tensors, **change}
    tensors.pop(drop, None)
    recipe = recipe or gptq.recipe(config(4, 16, False, True, True), "config.json")
    headers = TensorHeaders({f"m.{k}": v for k, v in tensors.items()}, "/m/x.safetensors")
    return refusal(lambda: gptq.check_linear(recipe, "m", headers, OUT, IN),
                   lambda: gptq.dequantize(recipe, "m", tensors, "/m/x.safetensors"))


def test_hostile_inputs() -> None:
    assert "'m.scales' has shape [4, 25], but GPTQ 4-bit, group_size 16, desc_act (gptq) needs [4, 24]" in hostile(
        {"scales": torch.ones(4, 25, dtype=torch.float16)})
    assert "'m.scales' holds NaN or Inf scales" in hostile({"scales": torch.full((4, 24), math.nan).half()})
    assert "'m.qweight' has shape [9, 24], but" in hostile({"qweight": torch.zeros(9, 24, dtype=torch.int32)})
    assert "'m.qweight' is float32, but GPTQ" in hostile({"qweight": torch.zeros(8, 24)})
    assert "holds groups from 0 to 4, outside the 4 groups" in hostile(
        {"g_idx": torch.arange(IN, dtype=torch.int32) % 5})
    assert "has no 'm.g_idx', which GPTQ 4-bit, group_size 16, desc_act (gptq) needs" in hostile({}, drop="g_idx")
    assert "group_size 24 does not divide its 64 input features" in hostile(
        {}, recipe=gptq.GptqRecipe(4, 24, True, False, "gptq"))
    with pytest.raises(InputError, match="20 input features is not a multiple of 8"):
        gptq.parts(gptq.GptqRecipe(4, -1, True, False, "gptq"), 24, 20, "m")


def test_module_of() -> None:
    assert gptq.module_of("model.layers.0.mlp.up_proj.qweight") == "model.layers.0.mlp.up_proj"
    assert gptq.module_of("model.layers.0.mlp.up_proj.weight") is None


def test_linears_and_orphan_parts() -> None:
    tensors, _ = checkpoint(4, 16, True, False, True)
    named = {f"model.layers.0.mlp.{p}_proj.{k}": v for p in ("up", "down") for k, v in tensors.items()}
    named["model.norm.weight"] = torch.ones(4)
    headers = TensorHeaders(named, "/m/x.safetensors")
    assert linears(headers, named, gptq.MARKERS, gptq.PARTS, "GPTQ") == ["model.layers.0.mlp.up_proj",
                                                                          "model.layers.0.mlp.down_proj"]
    del named["model.layers.0.mlp.down_proj.qweight"]
    assert refusal(lambda: linears(headers, named, gptq.MARKERS, gptq.PARTS, "GPTQ")) == (
        "/m/x.safetensors: tensor 'model.layers.0.mlp.down_proj.qzeros' is a GPTQ part, but "
        "'model.layers.0.mlp.down_proj' has no 'model.layers.0.mlp.down_proj.qweight'; the checkpoint is incomplete")
