"""The tiny perturbed model of each mission family that the family, verify and GPU tests share:
its transformers config, what `inspect` must say of it, and the old config.json style it also
comes in. Every sequence is several windows long, and the soft-caps are small enough to bite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hf_models import token_batch

WINDOW = 4
SEQ = 28  # seven windows long
IDS = token_batch(seq=SEQ)
FP32_TOL = 1e-5
FAITHFULNESS = 1.25
ATTN_CAP, FINAL_CAP = 2.0, 3.0


@dataclass(frozen=True)
class Spec:
    model_type: str
    kwargs: dict[str, Any]
    old_style: dict[str, Any]  # transformers 4 keys that replace rope_parameters in a hand-written config.json
    card: tuple[str, ...]  # what `lmconvert inspect` must say
    old_drop: tuple[str, ...] = ()  # further keys a transformers 4 file lacks (derived by transformers)
    layer_types: tuple[list[str], tuple[str, ...]] | None = None  # a non-default layer_types, the kinds it means
    not_on_card: tuple[str, ...] = ()  # what it must not say


S, F = "sliding_attention", "full_attention"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
YARN = {"factor": 4.0, "original_max_position_embeddings": 32}

SPECS: dict[str, Spec] = {
    "llama": Spec(
        "llama", dict(attention_bias=True, mlp_bias=True, rope_parameters={**LLAMA3, "rope_theta": 500000.0}),
        old_style={"rope_theta": 500000.0, "rope_scaling": LLAMA3},
        card=("pre-norm", "SwiGLU", "biases: q, k, v, o, mlp", "llama3 x8", "weight after cast")),
    "mistral": Spec(
        "mistral", dict(sliding_window=WINDOW, head_dim=24,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6},
        card=("sliding window 4 on local layers; pattern LL", "head_dim 24", "biases: none"),
        layer_types=([F, S], ("global", "local"))),  # AutoConfig then loads it as Ministral
    "gemma": Spec(
        "gemma", dict(head_dim=16, attention_bias=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 20000.0}),
        old_style={"rope_theta": 20000.0, "hidden_act": "gelu"},  # the legacy spelling of tanh GELU
        card=("pre-norm", "scale (w + 1)", "weight in fp32", "GeGLU (tanh)", "embedding scale: 8",
              "biases: q, k, v, o", "embeddings: tied"),
        not_on_card=("soft-cap", "sliding")),
    "gemma2": Spec(
        "gemma2", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24, attention_bias=True,
                       attn_logit_softcapping=ATTN_CAP, final_logit_softcapping=FINAL_CAP),
        old_style={"rope_theta": 10000.0}, old_drop=("layer_types",),
        card=("sandwich", "scale (w + 1)", "weight in fp32", "attention soft-cap: 2", "final-logit soft-cap: 3",
              "sliding window 4 on local layers; pattern LG", "GeGLU (tanh)", "embedding scale: 8",
              "score scale: 0.204124"),
        layer_types=([F, S], ("global", "local"))),
    "gemma3": Spec(
        "gemma3_text", dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                            sliding_window_pattern=2, attn_logit_softcapping=ATTN_CAP,  # ignored by transformers
                            final_logit_softcapping=FINAL_CAP,
                            rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0},
                                             F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 500000.0}}),
        old_style={"rope_theta": 500000.0, "rope_local_base_freq": 20000.0,
                   "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 2},
        old_drop=("layer_types", "_sliding_window_pattern"),
        card=("sandwich", "QK norm: per head", "sliding window 4 on local layers; pattern LGL",
              "local layers: RoPE half, theta=20000", "linear x8", "final-logit soft-cap: 3"),
        not_on_card=("attention soft-cap",),
        layer_types=([F, F, S], ("global", "global", "local"))),
    "olmo2": Spec(
        "olmo2", dict(attention_bias=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
        old_style={"rope_theta": 500000.0},
        card=("norm on sublayer output only", "QK norm: over the whole projection", "eps=1e-05", "weight in fp32",
              "biases: q, k, v, o")),
    "qwen2": Spec(
        "qwen2", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, **YARN}),
        old_style={"rope_theta": 1e6, "rope_scaling": {"type": "yarn", **YARN}}, old_drop=("layer_types",),
        card=("biases: q, k, v", "sliding window 4 on local layers; pattern GLL", "yarn x4", "embeddings: tied"),
        layer_types=([S, F, S], ("local", "global", "local"))),
    "qwen3": Spec(
        "qwen3", dict(head_dim=16, attention_bias=True, use_sliding_window=True, sliding_window=WINDOW,
                      max_window_layers=1, rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
        old_style={"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        old_drop=("layer_types",),
        card=("QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern GL", "linear x2"),
        layer_types=([S, F], ("local", "global"))),
    "smollm3": Spec(
        "smollm3", dict(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=WINDOW,
                        attention_bias=True, mlp_bias=True, bos_token_id=2, eos_token_id=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6}, old_drop=("layer_types", "no_rope_layers"),
        card=("positions: none (layers [1, 3])", "positions: RoPE half, theta=1e+06 (layers [0, 2])",
              "sliding window 4 on local layers; pattern GLGL", "biases: q, k, v, o, mlp", "embeddings: tied"),
        layer_types=([S, F, F, F], ("local", "global", "global", "global"))),
    "starcoder2": Spec(
        "starcoder2", dict(sliding_window=WINDOW, bos_token_id=2, eos_token_id=1,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
        old_style={"rope_theta": 1e5},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh), d_ff 96",
              "biases: q, k, v, o, mlp", "sliding window 4 on local layers; pattern LL", "embeddings: tied")),
    "nemotron": Spec(
        "nemotron", dict(attention_bias=True, mlp_bias=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5},
        card=("LayerNorm, eps=1e-05, scale (w + 1), bias, weight in fp32", "pre-norm", "FFN: squared ReLU, d_ff 96",
              "RoPE half, theta=20000, 0.5 of head_dim", "biases: q, k, v, o, mlp", "embeddings: untied")),
    "stablelm": Spec(
        "stablelm", dict(use_parallel_residual=True, use_qkv_bias=True, eos_token_id=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.25},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm", "SwiGLU",
              "RoPE half, theta=20000, 0.25 of head_dim", "biases: q, k, v", "embeddings: untied")),
    "granite": Spec(
        "granite", dict(embedding_multiplier=12.0, attention_multiplier=0.0625, residual_multiplier=0.22,
                        logits_scaling=8.0, attention_bias=True, mlp_bias=True,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        old_style={"rope_theta": 1e4},
        card=("residual scale: 0.22", "score scale: 0.0625", "embedding scale: 12", "logit scale: 0.125",
              "pre-norm", "SwiGLU", "biases: q, k, v, o, mlp")),
    "olmo": Spec(
        "olmo", dict(attention_bias=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
        old_style={"rope_theta": 5e5},
        card=("LayerNorm, eps=1e-05, no scale", "pre-norm", "SwiGLU", "biases: q, k, v, o", "embeddings: untied")),
    # mixtures of experts: more experts than chosen per token, each chosen somewhere in IDS
    # (tests/test_moe.py checks that), top-3 where the family allows it so the order of the adds shows
    "mixtral": Spec(
        "mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6},
        card=("mixture of experts: 4 experts, top-2, d_expert 96 (all layers)",
              "router: softmax then top-k, renormalised, weights in fp32", "sliding window 4 on local layers",
              "active per token")),
    "qwen2_moe": Spec(
        "qwen2_moe", dict(num_hidden_layers=3, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                          shared_expert_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1],
                          use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6}, old_drop=("layer_types",),
        card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [0, 2])", "FFN: SwiGLU, d_ff 96",
              "renormalised, weights in activation dtype", "one shared expert, sigmoid-gated, width 48",
              "biases: q, k, v", "sliding window 4 on local layers; pattern LGG"),
        layer_types=([F, S, S], ("global", "local", "local"))),
    "qwen3_moe": Spec(
        "qwen3_moe", dict(num_hidden_layers=4, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                          decoder_sparse_step=2, head_dim=16, attention_bias=True, use_sliding_window=True,
                          sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6},
        card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [1, 3])", "not renormalised",
              "QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern LLLL")),
    "olmoe": Spec(
        "olmoe", dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True, eos_token_id=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
        old_style={"rope_theta": 5e5},
        card=("mixture of experts: 6 experts, top-3, d_expert 96 (all layers)", "QK norm: over the whole projection",
              "renormalised, weights in activation dtype", "eps=1e-05", "biases: q, k, v, o")),
}
NAMES = list(SPECS)
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, head_dim=16, sliding_window=WINDOW,
            query_pre_attn_scalar=24, sliding_window_pattern=2, pad_token_id=0,
            final_logit_softcapping=FINAL_CAP)  # Gemma3ForConditionalGeneration never applies it
VISION = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
