"""BLOOM (BigScience BLOOM and BLOOMZ).

Same as GPT-NeoX's sequential layout, except: ALiBi instead of RoPE (Press et al.'s slopes, with
the interleaved extras for a head count that is no power of two); a LayerNorm on the embeddings
(`word_embeddings_layernorm`); `apply_residual_connection_post_layernorm` takes each sublayer's
residual after its norm; the MLP is 4 x hidden with BLOOM's own tanh GeLU; q, k, v, o and the MLP
always have biases; tied embeddings by default (`tie_word_embeddings`); GPT-2 style names for the
layer and head counts (`n_layer`, `n_head`, also read as `num_hidden_layers`, `num_attention_heads`,
BloomConfig's attribute_map; `n_embed` in older files); no position limit (ALiBi);
`pretraining_tp` > 1 with `slow_but_exact` splits the output projections into slices summed in
order, which is refused; `hidden_dropout` (training only).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import ConfigTable, Entry, fixed, plain
from ..tables.gguf import (
    PADDED,
    GgufArch,
    weight_and_bias,
)
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Piece
from . import gptj, llama
from .gpt_neox import fused_qkv

WB = ("weight", "bias")
TENSORS = TensorTable((
    Rule("transformer.word_embeddings.weight", "embed.weight"),
    *(Rule(f"transformer.word_embeddings_layernorm.{p}", f"embed_norm.{p}") for p in WB),
    *(Rule(f"transformer.h.{{}}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")) for p in WB),
    *(rule for p in WB for rule in fused_qkv(f"transformer.h.{{}}.self_attention.query_key_value.{p}")),
    *(Rule(f"transformer.h.{{}}.self_attention.dense.{p}", f"layers.{{}}.attn.o.{p}") for p in WB),
    *(Rule(f"transformer.h.{{}}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
      for hf, c in (("dense_h_to_4h", "up"), ("dense_4h_to_h", "down")) for p in WB),
    *(Rule(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in WB),
    Rule("lm_head.weight", "lm_head.weight"),
))


def hidden_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    d = hf.get("n_embed") if hf.stated("n_embed") else hf.get("hidden_size")
    return {"d_model": d, "d_ff": 4 * d}


def tp_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if hf.get("pretraining_tp") > 1 and hf.get("slow_but_exact"):
        raise MappingError(f"config.json: pretraining_tp={hf.get('pretraining_tp')} with slow_but_exact=true sums the "
                           "output projections in slices, which lmconvert does not; set slow_but_exact to false")
    return {}


def residual_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"apply_residual_connection_post_layernorm": cfg.residual_after_norm}


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 250880),
    Entry("hidden_size", (Key("hidden_size", int, 64), Key("n_embed", int, None, legacy=True)), hidden_from_hf,
          lambda cfg: {"hidden_size": cfg.d_model}),
    aliased("n_layer", "num_hidden_layers", "n_layers", int, 2),
    aliased("n_head", "num_attention_heads", "n_heads", int, 8),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    gptj.layer_norm("layer_norm_epsilon", 1e-5),
    Entry("apply_residual_connection_post_layernorm",
          (Key("apply_residual_connection_post_layernorm", bool, False),),
          lambda hf, _: {"residual_after_norm": hf.get("apply_residual_connection_post_layernorm")}, residual_to_hf),
    Entry("hidden_dropout", (Key("hidden_dropout", float, 0.0, bound="probability"),),
          lambda hf, _: {"resid_dropout": hf.get("hidden_dropout")},
          lambda cfg: {"hidden_dropout": cfg.resid_dropout}),
    plain("attention_dropout", "attn_dropout", float, 0.0, bound="probability"),
    Entry("pretraining_tp", (Key("pretraining_tp", int, 1), Key("slow_but_exact", bool, False)), tp_from_hf,
          lambda cfg: {"pretraining_tp": 1, "slow_but_exact": False}),
    Entry("positions", (), lambda hf, fields: {"layer_positions": ("alibi",) * fields["n_layers"]}, lambda cfg: {}),
    fixed("block", embed_norm=True, activation="gelu_bloom", gated=False, alibi="bloom",
          **llama.attention_biases(True), mlp_bias=True),
))


# -- llama.cpp (GGUF)
def _bloom_table() -> TensorTable:
    """llama.cpp's BLOOM (`BloomModel`): its converter reorders the per-head fused qkv
    ([q_h; k_h; v_h] for each head) to GPT-2's [q | k | v] rows, weight and bias alike; the
    embedding LayerNorm is `token_embd_norm`; every norm and linear has a bias; `output` only when
    the checkpoint stores an lm_head."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        *(Rule(f"token_embd_norm.{p}", f"embed_norm.{p}") for p in ("weight", "bias")),
        *(Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "q", "q"), i))
          for p in ("weight", "bias") for i, c in enumerate("qkv")),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(rule for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for rule in weight_and_bias(g, c, IDENTITY)),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        Rule("output.weight", "lm_head.weight", PADDED),
    ))


# llama.cpp's BLOOM graph adds each sublayer to its un-normed input: a model with
# apply_residual_connection_post_layernorm has no GGUF form, and the file cannot say so
GGUF_BLOOM = GgufArch("bloom", arch="bloom", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon"},
                          norm_eps="attention.layer_norm_epsilon", table=_bloom_table(),
                     # ALiBi without a position limit: llama.cpp's converter states its seq_length, else its width
                     # as many KV heads as heads, stated as llama.cpp's converter states them
                     unstated={"max_position_embeddings": lambda config: config.get("seq_length")
                               or config["hidden_size"],
                               "num_key_value_heads": lambda config: config.get("n_head")
                               or config.get("num_attention_heads")})


FAMILY = Family("bloom", ("bloom",), "BloomForCausalLM", TENSORS, CONFIG, gguf=(GGUF_BLOOM,))
