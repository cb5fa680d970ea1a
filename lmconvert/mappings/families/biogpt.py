"""BioGPT (microsoft/biogpt, microsoft/BioGPT-Large).

Same as xglm (fairseq's pre-norm decoder layer: `self_attn` and `self_attn_layer_norm`, `fc1` /
`fc2` with `final_layer_norm`, LayerNorms with bias at torch's eps 1e-5, every linear with a bias,
an embedding scale sqrt(hidden_size) when `scale_embedding`, multiplied as a Python float), except:
the tensors are under `biogpt.` and the tied LM head is `output_projection`; positions are a learned
table (`embed_positions`, max_position_embeddings + 2 rows, read from index 2), numbered from the
sequence start (BioGptModel passes `arange` positions, so the attention mask does not move them);
the score scale multiplies q.k (transformers' eager attention), not q; the softmax runs in the scores'
dtype, which rounds as fp32 cast back; the keys are llama-era (`hidden_size`, `num_hidden_layers`,
`num_attention_heads`, `intermediate_size`, `hidden_act`, default gelu); `layer_norm_eps` is read by
no module (every LayerNorm is built with torch's default), so it is checked, not kept;
`hidden_dropout_prob` drops the embeddings and each sublayer's output, `attention_probs_dropout_prob`
the attention probabilities, `activation_dropout` the MLP activation and `layerdrop` whole layers
(training only; the last two are checked, not kept).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import NormConfig

from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.hf_config import Key
from ..tables.table import Rule, TensorTable
from .llama import activation
from .opt import POSITION_OFFSET, fairseq_layer_rules, learned_positions
from .xglm import dropout_to_hf, embed_scale_from_hf, embed_scale_to_hf

TENSORS = TensorTable((
    Rule("biogpt.embed_tokens.weight", "embed.weight"),
    Rule("biogpt.embed_positions.weight", "pos_embed.weight"),
    *fairseq_layer_rules("biogpt.layers.{}"),
    Rule("biogpt.layer_norm.weight", "final_norm.weight"),
    Rule("biogpt.layer_norm.bias", "final_norm.bias"),
    Rule("output_projection.weight", "lm_head.weight"),
))


def _dropout_to_hf(cfg: Any) -> dict[str, Any]:
    return {"hidden_dropout_prob": dropout_to_hf(cfg)["dropout"]}


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 42384),
    plain("hidden_size", "d_model", int, 1024),
    plain("intermediate_size", "d_ff", int, 4096),
    plain("num_hidden_layers", "n_layers", int, 24),
    plain("num_attention_heads", "n_heads", int, 16),
    plain("max_position_embeddings", "max_positions", int, 1024),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    activation("hidden_act", "gelu"),
    Entry("scale_embedding", (Key("scale_embedding", bool, True),), embed_scale_from_hf, embed_scale_to_hf),
    Entry("hidden_dropout_prob", (Key("hidden_dropout_prob", float, 0.1, bound="probability"),),
          lambda hf, _: dict.fromkeys(("embed_dropout", "resid_dropout"), hf.get("hidden_dropout_prob")),
          _dropout_to_hf),
    plain("attention_probs_dropout_prob", "attn_dropout", float, 0.1, bound="probability"),
    Entry("no effect", (Key("layer_norm_eps", float, 1e-12),
                        Key("activation_dropout", float, 0.0, bound="probability"),
                        Key("layerdrop", float, 0.0, bound="probability")),
          lambda hf, _: {}, lambda cfg: {"layer_norm_eps": DEFAULT, "activation_dropout": DEFAULT,
                                         "layerdrop": DEFAULT}),
    fixed("BioGPT layers", norm=NormConfig(kind="layer", eps=1e-5, bias=True, dtype_order="scale_then_cast"),
          gated=False, q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True),
    Entry("positions", (), lambda hf, fields: learned_positions(fields["n_layers"], POSITION_OFFSET),
          lambda cfg: {}),
))

FAMILY = Family("biogpt", ("biogpt",), "BioGptForCausalLM", TENSORS, CONFIG)
