"""Ling 3's Kimi delta attention (`mixer="kimi_delta"` with `gate_projections="full"`, a bounded or
torch-softplus forget gate cast to the activation dtype, conv and A_log kept in fp32) against
transformers' own BailingHybridDeltaAttention, initialised as BailingHybridPreTrainedModel does (A_log,
dt_bias) and perturbed, the parameters its loader keeps in fp32 (`_keep_in_fp32_modules_strict`:
conv1d, dt_bias, A_log) kept so on both sides: bit for bit in fp32, bf16 and fp16 over a prefill longer
than the conv width and two chunks, cached decoding step by step with transformers' own cache (and in
float64 against our full forward), left padding (`delta_rule_checks`)."""

from __future__ import annotations

import math

import pytest
import torch
from arch_helpers import perturb
from delta_rule_checks import check_cached_decoding, check_left_padding, check_prefill, check_state_and_parts, inputs

from lmconvert.arch import ArchConfig
from lmconvert.arch.mixer_kinds import mixer_kind

pytestmark = pytest.mark.slow  # 150 tokens through transformers' torch KDA: seconds a test on 2 cores
D, H, DK, KERNEL = 32, 4, 8, 4
FP32 = ("conv1d.weight", "forget_gate.dt_bias", "forget_gate.A_log")
GATES = {True: "bounded", False: "softplus_cast"}


def _hf_config(safe: bool):
    from transformers import BailingHybridConfig
    return BailingHybridConfig(hidden_size=D, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                               rms_norm_eps=1e-5, num_attention_heads=H, head_dim=DK, short_conv_kernel_size=KERNEL,
                               kda_safe_gate=safe, kda_lower_bound=-3.0, num_key_value_heads=H, vocab_size=64,
                               pad_token_id=None, bos_token_id=None, eos_token_id=None)


def _settings(safe: bool) -> dict:
    return dict(heads=H, head_dim=DK, conv_kernel=KERNEL, norm_eps=1e-5, gate_projections="full",
                forget_gate=GATES[safe], gate_lower_bound=-3.0, fp32_kept="dt_bias+A_log+conv1d")


def _fp32_kept(module: torch.nn.Module) -> torch.nn.Module:
    """As transformers' loader leaves them: the `_keep_in_fp32_modules_strict` parameters in fp32."""
    params = dict(module.named_parameters())
    for name in FP32:
        params[name].data = params[name].data.float()
    return module


def _pair(dtype: torch.dtype, safe: bool = True):
    from transformers.models.bailing_hybrid.modeling_bailing_hybrid import BailingHybridDeltaAttention

    hf_cfg = _hf_config(safe)
    torch.manual_seed(0)
    ref = BailingHybridDeltaAttention(hf_cfg, 0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # BailingHybridPreTrainedModel._init_weights: module construction leaves them empty
        ref.forget_gate.A_log.copy_(torch.empty(H).uniform_(1.0, 16.0, generator=gen).log())
        dt = torch.empty(H * DK).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp().clamp_min(1e-4)
        ref.forget_gate.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
    perturb(ref, seed=3)
    ref = _fp32_kept(ref.to(dtype)).eval()
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, max_positions=512,
                     mixer="kimi_delta", mixer_settings=_settings(safe))
    ours = _fp32_kept(mixer_kind("kimi_delta").build(cfg, 0).to(dtype)).eval()
    ours.load_state_dict(dict(ref.state_dict()), strict=True)
    return ref, ours, hf_cfg


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("safe", [True, False], ids=["bounded", "softplus"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_is_transformers_bit_for_bit(dtype: torch.dtype, safe: bool) -> None:
    ref, ours, _ = _pair(dtype, safe)
    check_prefill(ref, ours, inputs(dtype, D, 150))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_decoding_is_transformers_step_by_step(dtype: torch.dtype) -> None:
    ref, ours, hf_cfg = _pair(dtype)
    check_cached_decoding(ref, ours, hf_cfg, inputs(dtype, D, 111))


@pytest.mark.parametrize("dtype", DTYPES)
def test_left_padding_is_transformers(dtype: torch.dtype) -> None:
    ref, ours, hf_cfg = _pair(dtype)
    check_left_padding(ref, ours, hf_cfg, inputs(dtype, D, 133))


def test_state_elements_and_parts_are_what_transformers_has() -> None:
    ref, ours, hf_cfg = _pair(torch.float32)
    kind = mixer_kind("kimi_delta")
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, mixer="kimi_delta",
                     mixer_settings=_settings(True))
    check_state_and_parts(kind, cfg, ref, ours, hf_cfg, D)
    assert any("-3 sigmoid(exp(A_log) (f(x) + dt_bias))" in line for line in kind.describe(cfg))
    assert {n for n, p in ours.named_parameters() if p.dtype == torch.float32} >= set(FP32)
