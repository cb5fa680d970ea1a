"""OLMo 2.

Same as llama, except: no input norms; each sublayer's output is normalised before the residual
add (`post_attention_layernorm` after attention, `post_feedforward_layernorm` after the MLP); the
RMSNorm weight multiplies in fp32 before the cast back; q_norm / k_norm normalise the whole q and k
projections (all heads together) before the head split; RoPE cos/sin stay in fp32; rms_norm_eps
defaults to 1e-5; `attention_bias` switches the q, k, v and o biases; the MLP has no bias.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from . import llama
from .family import Family
from .hf_config import HfConfig
from .table import Rule, TensorTable

DEFAULTS: dict[str, Any] = {
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "attention_bias": False, "rope_theta": 10000.0,
}
OUTPUT_NORM_RULES = (
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.post_feedforward_layernorm.weight", "layers.{}.mlp_post_norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + OUTPUT_NORM_RULES
                      + llama.QK_NORM_RULES)


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(data, DEFAULTS)
    fields = llama.llama_fields(hf)
    fields["norm"] = replace(fields["norm"], dtype_order="scale_then_cast")
    fields["rope"] = replace(fields["rope"], fp32_tables=True)
    return ArchConfig(**fields, norm_placement="output", qk_norm="projection",
                      **llama.attention_biases(hf.get("attention_bias", bool)))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {**llama.llama_to_hf(cfg), "attention_bias": llama.attention_bias_of(cfg)}


FAMILY = Family("olmo2", ("olmo2",), "Olmo2ForCausalLM", TENSORS, from_hf, to_hf)
