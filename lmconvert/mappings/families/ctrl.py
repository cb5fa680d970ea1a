"""CTRL (Salesforce/ctrl).

Same as gpt2's layout in spirit (pre-norm LayerNorms with a bias, q, k, v and o projections with
biases, a plain MLP with biases, absolute positions, a tied LM head), except: the projections are
plain linears (`Wq`, `Wk`, `Wv`, `dense`) and the MLP is `ffn.0` / `ffn.2` with ReLU between,
`dff` wide; the token embeddings (`w`) are multiplied by sqrt(n_embd) (numpy's float64, unrounded)
and a fixed sinusoidal table is added, its columns the sin of every frequency then the cos of every
frequency with the original Transformer's frequencies 10000^(-2i/d) (`sinusoidal_halves`); the
tied LM head has a bias of its own (`lm_head.bias`); the block LayerNorms' eps is fixed at 1e-6 and
only the final norm reads `layer_norm_epsilon`, so only 1e-6 (its default) is supported; the keys
are `n_embd`, `n_layer`, `n_head`, `n_positions`, also read as hidden_size, num_hidden_layers,
num_attention_heads, max_position_embeddings (CTRLConfig's attribute_map); dropouts `embd_pdrop`
and `resid_pdrop` (training only).
"""

from __future__ import annotations

import math
from typing import Any

from lmconvert.arch import NormConfig

from ..family import Family
from ..tables.config_table import ConfigTable, Entry, fixed, plain, unsupported
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig
from ..tables.table import Rule, TensorTable

WB = ("weight", "bias")
LAYER = "transformer.h.{}"

TENSORS = TensorTable((
    Rule("transformer.w.weight", "embed.weight"),
    Rule("transformer.pos_encoding", None),  # the sinusoidal table, if a checkpoint stored it
    *(Rule(f"{LAYER}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("layernorm1", "attn_norm"), ("layernorm2", "mlp_norm"),
                    ("multi_head_attention.Wq", "attn.q"), ("multi_head_attention.Wk", "attn.k"),
                    ("multi_head_attention.Wv", "attn.v"), ("multi_head_attention.dense", "attn.o"),
                    ("ffn.0", "mlp.up"), ("ffn.2", "mlp.down")) for p in WB),
    *(Rule(f"transformer.layernorm.{p}", f"final_norm.{p}") for p in WB),
    *(Rule(f"lm_head.{p}", f"lm_head.{p}") for p in WB),
))


def embeddings(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"embed_scale": math.sqrt(fields["d_model"]), "embed_scale_unrounded": True,
            "absolute_positions": "sinusoidal_halves", "layer_positions": ("none",) * fields["n_layers"]}


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 246534),
    aliased("n_embd", "hidden_size", "d_model", int, 1280),
    plain("dff", "d_ff", int, 8192),
    aliased("n_layer", "num_hidden_layers", "n_layers", int, 48),
    aliased("n_head", "num_attention_heads", "n_heads", int, 16),
    aliased("n_positions", "max_position_embeddings", "max_positions", int, 256),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    unsupported("layer_norm_epsilon", float, 1e-6, "the final LayerNorm's eps, where the block LayerNorms keep "
                "1e-6", "CTRL"),
    plain("embd_pdrop", "embed_dropout", float, 0.1, bound="probability"),
    plain("resid_pdrop", "resid_dropout", float, 0.1, bound="probability"),
    fixed("CTRL layers", norm=NormConfig(kind="layer", bias=True, eps=1e-6, dtype_order="scale_then_cast"),
          gated=False, activation="relu", q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True,
          lm_head_bias=True),
    Entry("embeddings", (), embeddings, lambda cfg: {}),
))

FAMILY = Family("ctrl", ("ctrl",), "CTRLLMHeadModel", TENSORS, CONFIG)
