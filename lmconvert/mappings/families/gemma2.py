"""Gemma 2.

Same as llama, except: RMSNorm computes `x * (1 + w)` in fp32 and casts last, with zero-centred
stored weights; sandwich norms (`input_layernorm` before attention, `post_attention_layernorm` on
the attention OUTPUT, `pre_feedforward_layernorm` before the MLP, `post_feedforward_layernorm` on
its output); the embedding is multiplied by sqrt(hidden_size) rounded to the weight dtype; the MLP
is gated with `hidden_activation` (gelu_pytorch_tanh; `hidden_act` is not read); scores are scaled
by `query_pre_attn_scalar ** -0.5` and soft-capped (`attn_logit_softcapping`, 50) before the mask;
logits are soft-capped (`final_logit_softcapping`, 30); `layer_types` (default: even layers
sliding, odd layers full) picks the layers that use `sliding_window`; embeddings are tied by
default; `attention_bias` switches the q, k, v and o biases. The Gemma rows live here once and
gemma3's table builds on this one.
"""

from __future__ import annotations

from typing import Any

from ..family import Family
from ..tables.config_table import Entry, fixed, plain, unsupported
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    GEMMA_KEYS,
    NO_ROPE_BASE,
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.table import Rule, TensorTable
from . import llama

SANDWICH_NORM_RULES = (
    Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.pre_feedforward_layernorm.weight", "layers.{}.mlp_norm.weight"),
    Rule("model.layers.{}.post_feedforward_layernorm.weight", "layers.{}.mlp_post_norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + SANDWICH_NORM_RULES)


def attn_scale_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Scores scale by `query_pre_attn_scalar ** -0.5`; None when that is head_dim's own scale."""
    scale = hf.get("query_pre_attn_scalar") ** -0.5
    return {"attn_scale": None if scale == fields["head_dim"] ** -0.5 else scale}



def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % 2 != 0)
    return window_fields(kinds, hf.get("sliding_window"))


# the Gemma rows, which gemma3 inherits
CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(
        llama.norm(1e-6, weight_offset=1.0, dtype_order="scale_then_cast"),
        llama.activation("hidden_activation", "gelu_pytorch_tanh"),
        fixed("sandwich norms", norm_placement="sandwich"),
        Entry("query_pre_attn_scalar", (Key("query_pre_attn_scalar", float, 256),), attn_scale_from_hf,
              lambda cfg: {"query_pre_attn_scalar": max(1, round(cfg.score_scale ** -2))}),  # an int in transformers
        Entry("embedding scale", (), lambda hf, fields: {"embed_scale": fields["d_model"] ** 0.5}, lambda cfg: {}),
        Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, layers_and_window_to_hf),
        plain("attn_logit_softcapping", "attn_softcap", float, 50.0, nullable=True),
        plain("final_logit_softcapping", "final_softcap", float, 30.0, nullable=True),
        unsupported("use_bidirectional_attention", bool, False, "an encoder-style variant", "causal Gemma",
                    default=None, nullable=True),
    ),
    defaults={"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
              "tie_word_embeddings": True},
    nullable={"num_key_value_heads": False, "head_dim": False},
)


# -- llama.cpp (GGUF)
GGUF_GEMMA2 = GgufArch("gemma2", arch="gemma2", keys={**GEMMA_KEYS, "attn_logit_softcapping": "attn_logit_softcapping"},
                       omitted=NO_ROPE_BASE,
                          defaults={"hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
                                    "final_logit_softcapping": 30.0},
                          bias_flags=ATTENTION_BIAS_FLAG, norm_offset=1.0, output=False, swa_pattern=2, big_layers=46)


FAMILY = Family("gemma2", ("gemma2",), "Gemma2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GEMMA2,))
