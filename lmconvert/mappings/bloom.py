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

from . import gptj, llama
from .config_table import ConfigTable, Entry, fixed, plain
from .errors import MappingError
from .family import Family
from .gpt_neox import fused_qkv
from .hf_alias import aliased
from .hf_config import HfConfig, Key
from .table import Rule, TensorTable

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

FAMILY = Family("bloom", ("bloom",), "BloomForCausalLM", TENSORS, CONFIG)
