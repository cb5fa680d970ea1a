"""MPT (MosaicML MPT-7B, MPT-30B), as transformers runs it.

Same as BLOOM, except: ALiBi with MPT's own slopes (over the next power of two, odd-numbered first
when the head count falls short; alibi_bias_max 8, which transformers always uses) times the
distance to the last key, kept in fp32 and added after the scaling; no embedding norm; residual
before the norm; LayerNorms with a weight and no bias; no biases at all; q, k, v one fused
projection (`Wqkv`) holding all q rows, then k, then v; the MLP is 4 x d_model with exact GeLU;
`attn_config.softmax_scale` (None: 1/sqrt(head_dim)) scales the scores; `attn_config.attn_pdrop`
drops attention weights and each sublayer's output (training only); tied by default; `d_model`,
`n_heads`, `n_layers` also read as hidden_size, num_attention_heads, num_hidden_layers (MptConfig's
attribute_map).
transformers ignores `expansion_ratio`, `no_bias`, `learned_pos_emb`, `logit_scale`,
`norm_type`, `emb_pdrop`, `resid_pdrop`, `embedding_fraction`, `alibi`, `alibi_bias_max`, `attn_type`, `qk_ln`
and `prefix_lm`, so they are read and change nothing; `attn_config.clip_qkv` clamps q, k and v.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.gguf import (
    PADDED,
    written,
)
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.points import FUSED_QKV
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from .gpt_neox import fused_qkv

TENSORS = TensorTable((
    Rule("transformer.wte.weight", "embed.weight"),
    *(Rule(f"transformer.blocks.{{}}.{hf}.weight", f"layers.{{}}.{c}.weight")
      for hf, c in (("norm_1", "attn_norm"), ("attn.out_proj", "attn.o"), ("norm_2", "mlp_norm"),
                    ("ffn.up_proj", "mlp.up"), ("ffn.down_proj", "mlp.down"))),
    *fused_qkv("transformer.blocks.{}.attn.Wqkv.weight", grouped=False),  # already [q; k; v]
    Rule("transformer.norm_f.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
))

# attn_config's keys: MptAttentionConfig's defaults; those transformers ignores are read and unused
ATTN_KEYS: dict[str, Key] = {key.name: key for key in (
    Key("attn_pdrop", float, 0, bound="probability"), Key("softmax_scale", float, None, nullable=True),
    Key("clip_qkv", float, None, nullable=True), Key("alibi_bias_max", int, 8), Key("alibi", bool, True),
    Key("attn_type", str, "multihead_attention"), Key("attn_impl", str, "torch"), Key("qk_ln", bool, False),
    Key("prefix_lm", bool, False), Key("attn_uses_sequence_id", bool, False),
)}


def attn_config(hf: HfConfig) -> HfConfig:
    return HfConfig(dict(hf.get("attn_config") or {}), ATTN_KEYS, "attn_config.")


def attention_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    attn = attn_config(hf)
    p = attn.get("attn_pdrop")
    return {"attn_scale": attn.get("softmax_scale"), "attn_dropout": p, "resid_dropout": p,
            "clip_qkv": attn.get("clip_qkv"),
            "layer_positions": ("alibi",) * fields["n_layers"]}


def attention_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # one dropout for both: a different residual dropout reads back as the attention one and is refused;
    # MptAttentionConfig declares attn_pdrop an int, so 0 is written as one
    p = cfg.attn_dropout
    attn = {name: key.default for name, key in ATTN_KEYS.items()}
    attn.update(attn_pdrop=int(p) if p == int(p) else p, softmax_scale=cfg.attn_scale, clip_qkv=cfg.clip_qkv)
    return {"attn_config": attn}


def model_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    d = hf.get("d_model") if hf.stated("d_model") else hf.get("hidden_size")
    return {"d_model": d, "d_ff": 4 * d}  # transformers' MptMLP is 4 x d_model whatever expansion_ratio says


# top-level keys transformers' MptModel never reads
IGNORED = (Key("expansion_ratio", int, 4), Key("no_bias", bool, True), Key("learned_pos_emb", bool, True),
           Key("logit_scale", float, None, nullable=True), Key("norm_type", str, "low_precision_layernorm"),
           Key("emb_pdrop", float, 0.0, bound="probability"), Key("embedding_fraction", float, 1.0),
           Key("init_device", str, "cpu"), Key("resid_pdrop", float, 0.0, bound="probability"))

CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 50368),
    Entry("d_model", (Key("d_model", int, 2048), Key("hidden_size", int, 2048, legacy=True)), model_from_hf,
          lambda cfg: {"d_model": cfg.d_model}),
    aliased("n_heads", "num_attention_heads", "n_heads", int, 16),
    aliased("n_layers", "num_hidden_layers", "n_layers", int, 24),
    plain("max_seq_len", "max_positions", int, 2048),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    Entry("norm", (Key("layer_norm_epsilon", float, 1e-5),),
          lambda hf, _: {"norm": NormConfig(kind="layer", eps=hf.get("layer_norm_epsilon"),
                                            dtype_order="scale_then_cast")},
          lambda cfg: {"layer_norm_epsilon": cfg.norm.eps}),
    Entry("attn_config", (Key("attn_config", dict, None, nullable=True),), attention_from_hf, attention_to_hf),
    Entry("ignored", IGNORED, lambda hf, _: {}, lambda cfg: dict.fromkeys((key.name for key in IGNORED), DEFAULT)),
    fixed("block", activation="gelu", gated=False, alibi="mpt"),
))


# -- llama.cpp (GGUF)
def _mpt_table() -> TensorTable:
    """llama.cpp's MPT (`MPTModel`): LayerNorms with weights only, q, k, v fused as [q | k | v] (as
    MPT's Wqkv), a plain MLP, no biases; the output tied unless the model has its own."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight") for g, c in norms),
        *(Rule("blk.{}.attn_qkv.weight", f"layers.{{}}.attn.{c}.weight", Piece(("q", "kv", "kv"), i))
          for i, c in enumerate("qkv")),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight")
          for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))),
    ))


# MPT: ALiBi (llama.cpp's slopes for max bias 8, which are MPT's), scores scaled by 1/sqrt(head_dim),
# clip_qkv as clamp_kqv, a 4 x d_model MLP; its config spells the shared keys its own way
GGUF_MPT = written("mpt", arch="mpt", constants={"attention.max_alibi_bias": 8.0},  # transformers' MPT: always 8
                   keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                     "attention.clamp_kqv": "attn_config.clip_qkv"},
                        renamed={"hidden_size": "d_model", "num_attention_heads": "n_heads",
                                 "num_hidden_layers": "n_layers", "max_position_embeddings": "max_seq_len"},
                        norm_eps="attention.layer_norm_epsilon", table=_mpt_table())


# Wqkv: [q; k; v] along its output
REFERENCE_LAYOUTS = FUSED_QKV

FAMILY = Family("mpt", ("mpt",), "MptForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MPT,),
                reference_layouts=REFERENCE_LAYOUTS)
