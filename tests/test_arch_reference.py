"""Whole decoders against transformers, element by element: tiny random LLaMA (every RoPE scaling),
Gemma 2 (sandwich norms, 1 + w, soft-caps, local/global windows, query_pre_attn_scalar, embedding
scale, tied head), Gemma 3 (local RoPE theta, per-head QK norm), Qwen 3 (per-head QK norm) and OLMo 2
(norm on sublayer outputs, QK norm over the projection, fp32 RoPE). The weights are copied by a plain
rename here, independent of lmconvert.mappings."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from arch_helpers import max_diff, perturb, tokens
from transformers import AutoConfig, AutoModelForCausalLM

from lmconvert.arch import ArchConfig, Decoder, NormConfig, RopeConfig

HF_TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
ARCH_TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_positions=64)

COMMON = [(r"model\.embed_tokens\.", "embed."), (r"model\.norm\.", "final_norm."), (r"lm_head\.", "lm_head."),
          (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.", r"layers.\1.attn.\2."),
          (r"model\.layers\.(\d+)\.self_attn\.([qk])_norm\.", r"layers.\1.attn.\2_norm."),
          (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.", r"layers.\1.mlp.\2.")]
NORMS = {
    "pre": {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"},
    "sandwich": {"input_layernorm": "attn_norm", "post_attention_layernorm": "attn_post_norm",
                 "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"},
    "output": {"post_attention_layernorm": "attn_post_norm", "post_feedforward_layernorm": "mlp_post_norm"},
}


def _rename(name: str, placement: str) -> str:
    for pattern, repl in COMMON:
        if re.fullmatch(pattern + r".*", name):
            return re.sub(pattern, repl, name)
    match = re.fullmatch(r"model\.layers\.(\d+)\.(\w+)\.(\w+)", name)
    assert match, name
    return f"layers.{match[1]}.{NORMS[placement][match[2]]}.{match[3]}"


def _family(name: str) -> tuple[str, dict[str, Any], ArchConfig]:
    """(model_type, transformers config overrides, the equivalent ArchConfig)."""
    if name.startswith("llama"):
        rope = {
            "llama": ({"rope_type": "default", "rope_theta": 500.0}, RopeConfig(theta=500.0)),
            "llama_linear": ({"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
                             RopeConfig(scaling="linear", factor=4.0)),
            "llama_dynamic": ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
                              RopeConfig(scaling="dynamic", factor=2.0)),
            "llama_llama3": ({"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                             RopeConfig(theta=5e5, scaling="llama3", factor=8.0, original_max_positions=16)),
            "llama_yarn": ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                            "original_max_position_embeddings": 16},
                           RopeConfig(scaling="yarn", factor=4.0, original_max_positions=16)),
        }[name]
        hf = dict(rope_parameters=rope[0], rms_norm_eps=1e-5, attention_bias=True, mlp_bias=True)
        arch = ArchConfig(**ARCH_TINY, rope=rope[1], norm=NormConfig(eps=1e-5), q_bias=True, k_bias=True,
                          v_bias=True, o_bias=True, mlp_bias=True)
        return "llama", hf, arch
    if name == "gemma2":
        hf = dict(head_dim=8, query_pre_attn_scalar=24, sliding_window=5, attn_logit_softcapping=3.0,
                  final_logit_softcapping=2.5, layer_types=["sliding_attention", "full_attention"])
        arch = ArchConfig(**ARCH_TINY, norm=NormConfig(weight_offset=1.0, dtype_order="scale_then_cast"),
                          norm_placement="sandwich", activation="gelu_tanh", layer_kinds=("local", "global"),
                          sliding_window=5, attn_scale=24 ** -0.5, attn_softcap=3.0, tie_embeddings=True,
                          embed_scale=math.sqrt(32), final_softcap=2.5)
        return "gemma2", hf, arch
    if name == "gemma3_text":
        hf = dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=5, layer_types=["sliding_attention",
                                                                                       "full_attention"],
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                   "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
        arch = ArchConfig(**ARCH_TINY, norm=NormConfig(weight_offset=1.0, dtype_order="scale_then_cast"),
                          norm_placement="sandwich", qk_norm="head", activation="gelu_tanh",
                          layer_kinds=("local", "global"), sliding_window=5, rope=RopeConfig(theta=1e6),
                          rope_local=RopeConfig(theta=1e4), tie_embeddings=True, embed_scale=math.sqrt(32))
        return "gemma3_text", hf, arch
    if name == "qwen3":
        hf = dict(head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        arch = ArchConfig(**ARCH_TINY, head_dim=16, qk_norm="head", rope=RopeConfig(theta=1e6))
        return "qwen3", hf, arch
    if name == "olmo2":
        hf = dict(rms_norm_eps=1e-5)
        arch = ArchConfig(**ARCH_TINY, norm=NormConfig(eps=1e-5, dtype_order="scale_then_cast"),
                          norm_placement="output", qk_norm="projection", rope=RopeConfig(fp32_tables=True))
        return "olmo2", hf, arch
    raise KeyError(name)


def _pair(name: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    model_type, overrides, arch = _family(name)
    config = AutoConfig.for_model(model_type, **{**HF_TINY, **overrides})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    perturb(hf, seed)
    placement = arch.norm_placement
    state = {_rename(k, placement): v for k, v in hf.state_dict().items()
             if not (arch.tie_embeddings and k == "lm_head.weight")}
    ours = Decoder(arch)
    ours.load_state_dict(state, strict=True)
    return hf.to(dtype).eval(), ours.to(dtype).eval()


FAMILIES = ["llama", "llama_linear", "llama_dynamic", "llama_llama3", "llama_yarn", "gemma2", "gemma3_text",
            "qwen3", "olmo2"]


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers_fp32(name, backend):
    hf, ours = _pair(name)
    ids = tokens(seq=40)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got = ours.set_attention(backend)(ids)
        ref_states = hf(input_ids=ids, output_hidden_states=True).hidden_states
        states = ours.hidden_states(ids)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for i in range(len(states) - 1):  # every block; transformers' last entry is after the final norm
        torch.testing.assert_close(states[i], ref_states[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "llama_yarn", "gemma2", "gemma3_text", "qwen3", "olmo2"])
@pytest.mark.bitexact
def test_logits_match_transformers_bf16_eager(name, tmp_path):
    """In bf16 the op order decides every rounding; our eager path must reproduce transformers' eager
    path bit for bit. transformers is loaded the way users load it (from_pretrained with a dtype),
    which keeps its RoPE frequencies in fp32; `.to(bfloat16)` would round them."""
    hf, ours = _pair(name, dtype=torch.bfloat16)
    hf.to(torch.float32).save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, attn_implementation="eager").eval()
    ids = tokens(seq=40)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got = ours.set_attention("eager")(ids)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, ref), max_diff(got, ref)


def _hf_incremental(hf, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    with torch.no_grad():
        out = hf(input_ids=ids[:, :prefill], use_cache=True)
        logits, cache = [out.logits], out.cache
        for t in range(prefill, ids.shape[1]):
            out = hf(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            logits.append(out.logits)
            cache = out.cache
    return torch.cat(logits, dim=1)


def _incremental(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    cache = model.new_cache()
    with torch.no_grad():
        logits = [model(ids[:, :prefill], cache=cache)]
        for t in range(prefill, ids.shape[1]):
            logits.append(model(ids[:, t:t + 1], cache=cache))
    return torch.cat(logits, dim=1)


def test_dynamic_rope_cached_decoding_beyond_max_positions_matches_transformers():
    """Dynamic NTK re-derives the base from the current length, and both caches keep keys rotated
    with the frequencies of their own step: past max_positions, cached decoding is NOT the full
    forward (in transformers either); it must be transformers' cached decoding."""
    hf, ours = _pair("llama_dynamic")
    ids = tokens(seq=90, batch=1)
    cached, ref = _incremental(ours, ids, 50), _hf_incremental(hf, ids, 50)
    torch.testing.assert_close(cached, ref, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        full = ours(ids)
        torch.testing.assert_close(full, hf(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert max_diff(cached[:, 70:], full[:, 70:]) > 1e-3
    torch.testing.assert_close(cached[:, :64], _incremental(ours, ids[:, :64], 50), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text"])
def test_cached_decoding_with_window_matches_transformers(name):
    hf, ours = _pair(name)
    ids = tokens(seq=20, batch=1)
    torch.testing.assert_close(_incremental(ours, ids, 6), _hf_incremental(hf, ids, 6), rtol=1e-5, atol=1e-5)
