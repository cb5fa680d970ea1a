"""XGLM (facebook/xglm-564M ... 7.5B).

Same as opt, except: always pre-norm with a final `layer_norm`, LayerNorms always affine and every
projection biased; positions are not learned but fairseq's sinusoidal table (sin of every frequency,
then cos of every frequency, frequencies exp(-i log(10000) / (d/2 - 1))) indexed from 2; the token
embeddings are multiplied by sqrt(d_model) as a Python float (`scale_embedding`, default true), not
rounded to the weight dtype first; the softmax runs in the scores' own dtype (fp32 for fp16), which
rounds as fp32 cast back;
`dropout` drops the embeddings and each sublayer's output, `activation_dropout` the MLP activations
(training only, checked, not kept); `d_model`, `num_layers` and `attention_heads` are also read as
`hidden_size`, `num_hidden_layers` and `num_attention_heads` (XGLMConfig's attribute_map). The
table row at `pad_token_id` is zeroed in transformers; the default pad id 1 lies below the offset,
so no position reaches it, and a pad id of 2 or more (which would blank one position) is refused.
"""

from __future__ import annotations

import math
from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from .llama import activation
from .opt import POSITION_OFFSET, fairseq_layer_rules

TENSORS = TensorTable((
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("model.embed_positions.weights", None),  # the sinusoidal table, if a checkpoint stored it
    *fairseq_layer_rules("model.layers.{}"),
    Rule("model.layer_norm.weight", "final_norm.weight"),
    Rule("model.layer_norm.bias", "final_norm.bias"),
    Rule("lm_head.weight", "lm_head.weight"),
))


def embed_scale_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"embed_scale": math.sqrt(fields["d_model"]) if hf.get("scale_embedding") else None,
            "embed_scale_unrounded": True}


def embed_scale_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # any other scale reads back as sqrt(d_model) or none, so export refuses it by name
    return {"scale_embedding": cfg.embed_scale is not None}


def positions(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    pad = hf.data.get("pad_token_id")  # a token id, checked by the passthrough; here only its table row matters
    if isinstance(pad, int) and not isinstance(pad, bool) and pad >= POSITION_OFFSET:
        raise MappingError(f"config.json: pad_token_id={pad}: XGLM zeroes row {pad} of its sinusoidal table, so "
                           f"position {pad - POSITION_OFFSET} gets no position embedding, which lmconvert does not "
                           "express; only pad ids below 2 (XGLM's own is 1) are supported")
    return {"absolute_positions": "sinusoidal_fairseq", "position_offset": POSITION_OFFSET,
            "layer_positions": ("none",) * fields["n_layers"]}


def dropout_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # one key for both: a model whose two differ reads back with the sublayer one, and is refused
    return {"dropout": cfg.resid_dropout}


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 256008),
    aliased("d_model", "hidden_size", "d_model", int, 1024),
    plain("ffn_dim", "d_ff", int, 4096),
    aliased("num_layers", "num_hidden_layers", "n_layers", int, 24),
    aliased("attention_heads", "num_attention_heads", "n_heads", int, 16),
    plain("max_position_embeddings", "max_positions", int, 2048),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    activation("activation_function", "gelu"),
    Entry("scale_embedding", (Key("scale_embedding", bool, True),), embed_scale_from_hf, embed_scale_to_hf),
    Entry("dropout", (Key("dropout", float, 0.1, bound="probability"),),
          lambda hf, _: dict.fromkeys(("embed_dropout", "resid_dropout"), hf.get("dropout")), dropout_to_hf),
    plain("attention_dropout", "attn_dropout", float, 0.1, bound="probability"),
    Entry("training only", (Key("activation_dropout", float, 0.0, bound="probability"),
                            Key("layerdrop", float, 0.0, bound="probability")),
          lambda hf, _: {}, lambda cfg: {"activation_dropout": DEFAULT, "layerdrop": DEFAULT}),
    fixed("XGLM layers", norm=NormConfig(kind="layer", eps=1e-5, bias=True, dtype_order="scale_then_cast"),
          gated=False, scale_query=True, q_bias=True, k_bias=True, v_bias=True,
          o_bias=True, mlp_bias=True),
    Entry("positions", (), positions, lambda cfg: {}),
))

FAMILY = Family("xglm", ("xglm",), "XGLMForCausalLM", TENSORS, CONFIG)
