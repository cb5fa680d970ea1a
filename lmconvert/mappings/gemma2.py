"""Gemma 2.

Same as llama, except: RMSNorm computes `x * (1 + w)` in fp32 and casts last, with zero-centred
stored weights; sandwich norms (`input_layernorm` before attention, `post_attention_layernorm` on
the attention OUTPUT, `pre_feedforward_layernorm` before the MLP, `post_feedforward_layernorm` on
its output); the embedding is multiplied by sqrt(hidden_size) rounded to the weight dtype; the MLP
is gated with `hidden_activation` (gelu_pytorch_tanh; `hidden_act` is not read); scores are scaled
by `query_pre_attn_scalar ** -0.5` and soft-capped (`attn_logit_softcapping`, 50) before the mask;
logits are soft-capped (`final_logit_softcapping`, 30); `layer_types` (default: even layers
sliding, odd layers full) picks the layers that use `sliding_window`; embeddings are tied by
default; `attention_bias` switches the q, k, v and o biases. The Gemma pieces live here once and
gemma3 builds on them.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from . import llama
from .errors import MappingError
from .family import Family
from .hf_config import (
    ACTIVATIONS_TO_HF,
    HfConfig,
    activation_from_hf,
    layer_kinds_from_hf,
    layer_types_to_hf,
    rope_from_hf,
    rope_parameters,
    window_fields,
)
from .table import Rule, TensorTable

DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 10000.0,
    "attention_bias": False, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "use_bidirectional_attention": None,
}
SANDWICH_NORM_RULES = (
    Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.pre_feedforward_layernorm.weight", "layers.{}.mlp_norm.weight"),
    Rule("model.layers.{}.post_feedforward_layernorm.weight", "layers.{}.mlp_post_norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + SANDWICH_NORM_RULES)


def gemma_fields(hf: HfConfig) -> dict[str, Any]:
    """What Gemma 2 and 3 state the same way: norms, placement, activation, scales, biases."""
    if hf.get("use_bidirectional_attention", bool):
        raise MappingError("config.json: use_bidirectional_attention=true (an encoder-style variant) is not "
                           "supported; only causal Gemma checkpoints are")
    fields = llama.base_fields(hf)
    scale = hf.positive("query_pre_attn_scalar", float) ** -0.5
    return {
        **fields, **llama.attention_biases(hf.get("attention_bias", bool)),
        "norm": NormConfig(eps=hf.get("rms_norm_eps", float), weight_offset=1.0, dtype_order="scale_then_cast"),
        "norm_placement": "sandwich", "activation": activation_from_hf(hf, "hidden_activation"),
        "attn_scale": None if scale == fields["head_dim"] ** -0.5 else scale,
        "embed_scale": fields["d_model"] ** 0.5,
    }


def gemma_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {
        **llama.base_to_hf(cfg), "hidden_activation": ACTIVATIONS_TO_HF[cfg.activation],
        "attention_bias": llama.attention_bias_of(cfg),
        "query_pre_attn_scalar": max(1, round(cfg.score_scale ** -2)),  # an int in transformers
        "layer_types": layer_types_to_hf(cfg.layer_kinds),
        # transformers builds the sliding mask even when no layer uses it, so never write null
        "sliding_window": cfg.sliding_window or DEFAULTS["sliding_window"],
    }


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(data, DEFAULTS)
    fields = gemma_fields(hf)
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % 2 != 0)
    return ArchConfig(**fields, rope=rope_from_hf(hf, rope_parameters(hf)),
                      attn_softcap=hf.get("attn_logit_softcapping", float),
                      final_softcap=hf.get("final_logit_softcapping", float),
                      **window_fields(kinds, hf.get("sliding_window", int)))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {**gemma_to_hf(cfg), "attn_logit_softcapping": cfg.attn_softcap,
            "final_logit_softcapping": cfg.final_softcap}


FAMILY = Family("gemma2", ("gemma2",), "Gemma2ForCausalLM", TENSORS, from_hf, to_hf)
