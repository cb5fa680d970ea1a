"""Norm maths (RMS / Layer, bias, scale, Gemma's 1 + w) and the bf16 dtype order of each family."""

from __future__ import annotations

import pytest
import torch
from arch_helpers import perturb
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

from lmconvert.arch import NormConfig
from lmconvert.arch.norms import Norm

D = 48


def _x(dtype=torch.float32, seed=0, scale=3.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, 16, D, generator=g) * scale + shift).to(dtype)


def _norm(seed=1, dtype=torch.float32, **kwargs) -> Norm:
    norm = Norm(D, NormConfig(**kwargs))
    perturb(norm, seed, scale=0.5)
    return norm.to(dtype)


def test_rms_norm_is_scale_invariant_and_has_unit_rms():
    norm = Norm(D, NormConfig(kind="rms", eps=1e-6))  # weight 1
    x = _x()
    torch.testing.assert_close(norm(x * 7.5), norm(x), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm(x).pow(2).mean(-1), torch.ones(4, 16), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(norm(x + 1.0), norm(x), atol=1e-2)  # but not shift-invariant


def test_rms_norm_weight_scales_each_channel():
    x = _x()
    plain = Norm(D, NormConfig())(x)
    norm = _norm()
    torch.testing.assert_close(norm(x), plain * norm.weight, rtol=1e-6, atol=1e-6)


def test_layer_norm_zero_mean_unit_variance_and_shift_invariant():
    norm = Norm(D, NormConfig(kind="layer", eps=1e-5, weight=False))
    x = _x(shift=5.0)
    y = norm(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 16), rtol=0, atol=1e-5)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 16), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(norm(x - 4.0), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm(x * 3.0), y, rtol=1e-5, atol=1e-5)
    assert norm.weight is None and norm.bias is None and not list(norm.parameters())


@pytest.mark.parametrize("weight,bias", [(True, True), (True, False), (False, True), (False, False)])
def test_layer_norm_matches_torch_layer_norm(weight, bias):
    norm = _norm(kind="layer", eps=1e-5, weight=weight, bias=bias)
    ref = torch.nn.LayerNorm(D, eps=1e-5, elementwise_affine=weight or bias, bias=bias)
    with torch.no_grad():
        if weight or bias:
            ref.weight.copy_(norm.weight if weight else torch.ones(D))
        if bias:
            ref.bias.copy_(norm.bias)
    assert {n for n, _ in norm.named_parameters()} == {n for n, flag in (("weight", weight), ("bias", bias)) if flag}
    x = _x(shift=2.0)
    torch.testing.assert_close(norm(x), ref(x), rtol=1e-6, atol=1e-6)


def test_layer_norm_bias_shifts_output():
    norm = _norm(kind="layer", bias=True)
    x = _x()
    assert (norm.bias.abs() > 0).all()
    torch.testing.assert_close(norm(x), Norm(D, NormConfig(kind="layer"))(x) * norm.weight + norm.bias)


def test_gemma_offset_zero_weight_is_plain_normalisation():
    norm = Norm(D, NormConfig(weight_offset=1.0))
    assert torch.equal(norm.weight, torch.zeros(D))  # stored zero-centred
    x = _x()
    torch.testing.assert_close(norm(x), Norm(D, NormConfig(weight=False))(x), rtol=0, atol=0)
    with torch.no_grad():
        norm.weight.fill_(0.5)
    torch.testing.assert_close(norm(x), 1.5 * Norm(D, NormConfig(weight=False))(x), rtol=1e-6, atol=1e-6)


def test_statistics_in_fp32():
    norm = Norm(D, NormConfig(weight=False, dtype_order="scale_then_cast"))
    x = _x(torch.bfloat16, scale=300.0)
    expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    in_bf16 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert norm(x).dtype == torch.bfloat16
    assert torch.equal(norm(x), expected)
    assert not torch.equal(in_bf16, expected)  # bf16 statistics would be visibly different


def _hf(cls, norm: Norm):
    ref = cls(D, eps=norm.cfg.eps)
    with torch.no_grad():
        ref.weight.copy_(norm.weight.float())
    return ref.to(norm.weight.dtype)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.bitexact
def test_cast_then_scale_is_llama_bit_for_bit(seed):
    norm = _norm(seed=seed, dtype=torch.bfloat16, eps=1e-5, dtype_order="cast_then_scale")
    x = _x(torch.bfloat16, seed=seed)
    ours, ref = norm(x), _hf(LlamaRMSNorm, norm)(x)
    assert ours.dtype == ref.dtype == torch.bfloat16
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.bitexact
def test_scale_then_cast_with_offset_is_gemma2_bit_for_bit(seed):
    norm = _norm(seed=seed, dtype=torch.bfloat16, weight_offset=1.0, dtype_order="scale_then_cast")
    x = _x(torch.bfloat16, seed=seed)
    assert torch.equal(norm(x), _hf(Gemma2RMSNorm, norm)(x))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("reference", [Olmo2RMSNorm, GptOssRMSNorm], ids=["olmo2", "gpt_oss"])
@pytest.mark.bitexact
def test_scale_then_cast_is_olmo2_bit_for_bit(seed, reference):
    """OLMo 2's and gpt-oss's RMSNorms: the weight multiplies the fp32 statistics, then the cast."""
    norm = _norm(seed=seed, dtype=torch.bfloat16, dtype_order="scale_then_cast")
    x = _x(torch.bfloat16, seed=seed)
    assert torch.equal(norm(x), _hf(reference, norm)(x))


@pytest.mark.bitexact
def test_dtype_orders_really_differ_in_bf16():
    """Guards the three bit-exact tests above: the two orders must give different bf16 results."""
    x = _x(torch.bfloat16)
    a = _norm(dtype=torch.bfloat16, dtype_order="cast_then_scale")
    b = _norm(dtype=torch.bfloat16, dtype_order="scale_then_cast")
    assert torch.equal(a.weight, b.weight)
    assert not torch.equal(a(x), b(x))
    assert not torch.equal(a(x), _hf(Olmo2RMSNorm, a)(x))
    assert not torch.equal(b(x), _hf(LlamaRMSNorm, b)(x))


@pytest.mark.bitexact
def test_layer_norm_scale_then_cast_is_torch_layer_norm_bit_for_bit_in_bf16():
    norm = _norm(dtype=torch.bfloat16, kind="layer", eps=1e-5, bias=True, dtype_order="scale_then_cast")
    ref = torch.nn.LayerNorm(D, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(norm.weight.float())
        ref.bias.copy_(norm.bias.float())
    ref = ref.bfloat16()
    x = _x(torch.bfloat16, shift=1.0)
    assert torch.equal(norm(x), ref(x))


def test_layer_norm_scale_then_cast_is_torch_layer_norm_bit_for_bit_in_fp32():
    """StarCoder2's nn.LayerNorm applies weight and bias inside the kernel; a separate multiply
    and add differs in fp32 by ~1e-7 per element, which verify's exact per-point check sees."""
    norm = _norm(kind="layer", eps=1e-5, bias=True, dtype_order="scale_then_cast")
    ref = torch.nn.LayerNorm(D, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(norm.weight)
        ref.bias.copy_(norm.bias)
    x = _x(shift=1.0)
    assert torch.equal(norm(x), ref(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_layer_norm_with_offset_is_nemotron_layer_norm_1p_bit_for_bit(dtype):
    """`weight + 1.0` in the weight's dtype (rounded in bf16), then torch's LayerNorm."""
    norm = _norm(dtype=dtype, kind="layer", eps=1e-5, bias=True, weight_offset=1.0, dtype_order="scale_then_cast")
    ref = NemotronLayerNorm1P(D, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(norm.weight.float())
        ref.bias.copy_(norm.bias.float())
    ref = ref.to(dtype)
    x = _x(dtype, shift=1.0)
    assert torch.equal(norm(x), ref(x))
    if dtype == torch.bfloat16:  # the offset is rounded to bf16 before it scales, as there
        unrounded = torch.nn.functional.layer_norm(x.float(), (D,), norm.weight.float() + 1.0, norm.bias.float(), 1e-5)
        assert not torch.equal(unrounded.to(dtype), ref(x))


def test_layer_norm_scale_then_cast_runs_torch_kernel_in_the_input_dtype():
    """torch's bf16 LayerNorm kernel and the fp32 kernel fed upcast copies round differently now
    and then (here one element of 7168); StableLM's parallel block showed it as 1.6e-2 in the
    logits. Ours feeds the kernel what nn.LayerNorm does."""
    g = torch.Generator().manual_seed(0)
    dim = 128
    x = (torch.randn(2, 28, dim, generator=g) * 3).bfloat16()
    norm = Norm(dim, NormConfig(kind="layer", eps=1e-5, bias=True, dtype_order="scale_then_cast")).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(dim, generator=g))
        norm.bias.copy_(0.5 * torch.randn(dim, generator=g))
    ref = torch.nn.functional.layer_norm(x, (dim,), norm.weight, norm.bias, 1e-5)
    upcast = torch.nn.functional.layer_norm(x.float(), (dim,), norm.weight.float(), norm.bias.float(), 1e-5)
    assert not torch.equal(upcast.bfloat16(), ref)  # the inputs that tell the two apart
    assert torch.equal(norm(x), ref)
