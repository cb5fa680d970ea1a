"""Falcon (Falcon-7B/40B/180B, Falcon-RW), in all three of its layouts.

Same as GPT-NeoX, except: the layout is chosen by flags. `new_decoder_architecture` (40B, 180B):
attention and the MLP in parallel, with two norms (`ln_attn`, `ln_mlp`) or, with
`num_ln_in_parallel_attn` 1, one shared (`input_layernorm`), and `num_kv_heads` KV heads (the
fused qkv holds each group's q heads, then its k and v head); the norms' names so depend on the
layout (`layout_table`). Otherwise `parallel_attn` (7B) runs
them in parallel with one shared norm, and `multi_query` gives one KV head ([q...; k; v]); else
(Falcon-RW) sequential pre-norm blocks, one KV head per q head, the fused qkv laid out head by head.
Parallel blocks sum `(mlp + attn) + h`. `alibi` (RW) replaces RoPE with Falcon's ALiBi: slopes
and their products rounded to bf16, added before the 1/sqrt(head_dim) scaling and again, divided
by sqrt(head_dim), with the mask (as transformers computes it eagerly), softmax in the activation
dtype. `bias` switches every linear bias (q, k, v, o, MLP), each added after its matmul
(FalconLinear); MLP `ffn_hidden_size` (None: 4 x hidden) with `activation` (gelu); LayerNorms with
a bias; tied by default; head_dim hidden/heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import ConfigTable, Entry, fixed, plain
from ..tables.gguf import (
    NO_ROPE_BASE,
    PADDED,
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import gptj, llama
from .gpt_neox import fused_qkv

WB = ("weight", "bias")


def table(norms: tuple[tuple[str, str], ...]) -> TensorTable:
    """Falcon's tensors, with the stored names of the norms a layout has."""
    return TensorTable((
        Rule("transformer.word_embeddings.weight", "embed.weight"),
        *(Rule(f"transformer.h.{{}}.{hf}.{p}", f"layers.{{}}.{c}.{p}") for hf, c in norms for p in WB),
        *(rule for p in WB for rule in fused_qkv(f"transformer.h.{{}}.self_attention.query_key_value.{p}")),
        *(Rule(f"transformer.h.{{}}.self_attention.dense.{p}", f"layers.{{}}.attn.o.{p}") for p in WB),
        *(Rule(f"transformer.h.{{}}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
          for hf, c in (("dense_h_to_4h", "up"), ("dense_4h_to_h", "down")) for p in WB),
        *(Rule(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in WB),
        Rule("lm_head.weight", "lm_head.weight"),
    ))


ONE_OR_SEQUENTIAL = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"))
TWO_NORMS = (("ln_attn", "attn_norm"), ("ln_mlp", "mlp_norm"))  # new_decoder_architecture's two parallel norms
TENSORS = table(ONE_OR_SEQUENTIAL + TWO_NORMS)  # reads every layout
TABLES = {"parallel_separate": table(TWO_NORMS)}


def layout_table(arch: ArchConfig) -> TensorTable:
    return TABLES.get(arch.norm_placement, TENSORS)


LAYOUT_KEYS = (Key("new_decoder_architecture", bool, False, nullable=True),
               Key("parallel_attn", bool, True, nullable=True), Key("multi_query", bool, True, nullable=True),
               Key("num_ln_in_parallel_attn", int, None, nullable=True), Key("num_kv_heads", int, None, nullable=True),
               Key("alibi", bool, False, nullable=True))


def layout_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Placement, KV heads and positions from the layout flags (null means false, as in transformers)."""
    new, parallel, mqa = (bool(hf.get(k)) for k in ("new_decoder_architecture", "parallel_attn", "multi_query"))
    heads = fields["n_heads"]
    kv = hf.get("num_kv_heads") or heads
    norms = hf.get("num_ln_in_parallel_attn") or 2
    if new:
        if not parallel:
            raise MappingError("config.json: new_decoder_architecture=true with parallel_attn=false mixes the two "
                               "layouts, which transformers' Falcon cannot load either; set parallel_attn to true")
        placement = "parallel_separate" if norms == 2 else "parallel_shared"
    else:
        placement = "parallel_shared" if parallel else "pre"
        if mqa:
            kv = 1
        elif kv != heads:
            raise MappingError(f"config.json: num_kv_heads={kv} without new_decoder_architecture or multi_query: "
                               f"Falcon then lays the fused qkv out for {heads} KV heads; set num_kv_heads to {heads}")
    fields_out: dict[str, Any] = {"norm_placement": placement, "n_kv_heads": kv,
                                  "parallel_sum": "mlp+attn+h" if placement != "pre" else "h+attn+mlp"}
    if hf.get("alibi"):
        fields_out.update(layer_positions=("alibi",) * fields["n_layers"], alibi="falcon")
    return fields_out


def layout_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # the flags that read back as this model; anything else reads back differently and is refused by name
    alibi = cfg.layer_positions[0] == "alibi"
    if cfg.norm_placement == "pre":  # one KV head per q head: other counts read back as that, refused by name
        return {"new_decoder_architecture": False, "parallel_attn": False, "multi_query": False,
                "num_ln_in_parallel_attn": None, "num_kv_heads": cfg.n_heads, "alibi": alibi}
    if cfg.norm_placement == "parallel_shared" and cfg.n_kv_heads == 1:  # Falcon-7B: num_kv_heads unused
        return {"new_decoder_architecture": False, "parallel_attn": True, "multi_query": True,
                "num_ln_in_parallel_attn": None, "num_kv_heads": cfg.n_heads, "alibi": alibi}
    return {"new_decoder_architecture": True, "parallel_attn": True, "multi_query": True,
            "num_ln_in_parallel_attn": 2 if cfg.norm_placement == "parallel_separate" else 1,
            "num_kv_heads": cfg.n_kv_heads, "alibi": alibi}


def bias_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"bias": llama.attention_bias_of(cfg) and cfg.mlp_bias}


def activation_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    name = hf.get("activation")
    if name is None:
        raise MappingError("config.json: activation=null names no activation; Falcon uses \"gelu\"")
    return {"activation": llama.ACTIVATIONS_FROM_HF[name]}


def widths_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    """hidden_size (`n_embed` in older files, which wins, as in transformers) and the MLP width."""
    d = hf.get("n_embed") if hf.stated("n_embed") else hf.get("hidden_size")
    return {"d_model": d, "d_ff": hf.get("ffn_hidden_size") or 4 * d}


def dropout(hf: HfConfig, key: str) -> float:
    return hf.get(key) or 0.0  # null: no dropout


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 65024),
    Entry("hidden_size", (Key("hidden_size", int, 4544), Key("n_embed", int, None, legacy=True),
                          Key("ffn_hidden_size", int, None, nullable=True)), widths_from_hf,
          lambda cfg: {"hidden_size": cfg.d_model, "ffn_hidden_size": cfg.d_ff}),
    plain("num_hidden_layers", "n_layers", int, 32),
    plain("num_attention_heads", "n_heads", int, 71),
    plain("max_position_embeddings", "max_positions", int, 2048),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    gptj.layer_norm("layer_norm_epsilon", 1e-5, nullable=True),
    Entry("activation", (Key("activation", str, "gelu", nullable=True, choices=llama.ACTIVATIONS_FROM_HF),),
          activation_from_hf, lambda cfg: {"activation": llama.activation_to_hf(cfg.activation)}),
    rope(),
    Entry("layout", LAYOUT_KEYS, layout_from_hf, layout_to_hf),
    Entry("bias", (Key("bias", bool, False, nullable=True),),
          lambda hf, _: {**llama.attention_biases(bool(hf.get("bias"))), "mlp_bias": bool(hf.get("bias")),
                         "bias_separate": bool(hf.get("bias"))},
          bias_to_hf),
    Entry("dropout", (Key("hidden_dropout", float, 0.0, nullable=True, bound="probability"),
                      Key("attention_dropout", float, 0.0, nullable=True, bound="probability")),
          lambda hf, _: {"resid_dropout": dropout(hf, "hidden_dropout"),
                         "attn_dropout": dropout(hf, "attention_dropout")},
          lambda cfg: {"hidden_dropout": cfg.resid_dropout, "attention_dropout": cfg.attn_dropout}),
    fixed("plain MLP", gated=False),
))


# -- llama.cpp (GGUF)
def _falcon_table(norms: tuple[tuple[str, str], ...]) -> TensorTable:
    """llama.cpp's Falcon (`FalconModel`): its converter reorders the fused qkv from Falcon's per-KV
    group layout to [q | k | v] rows; LayerNorms with biases, no linear biases, a plain MLP."""
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(Rule("blk.{}.attn_qkv.weight", f"layers.{{}}.attn.{c}.weight", Piece(("q", "kv", "kv"), i))
          for i, c in enumerate("qkv")),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight")
          for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))),
    ))


def _falcon_layout(config: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp runs every Falcon as a parallel block: one KV head and one norm is Falcon-7B's layout
    (what transformers' GGUF loader assumes for every file), anything else new_decoder_architecture's
    with the file's KV heads and norms (Falcon-40B/180B: two; Falcon2-11B: one)."""
    if config["num_key_value_heads"] == 1 and config["num_ln_in_parallel_attn"] == 1:
        return {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True}
    return {"new_decoder_architecture": True, "parallel_attn": True, "num_kv_heads": config["num_key_value_heads"]}


# what llama.cpp's falcon cannot run (its converter may still write them): Falcon-RW's layout
FALCON_REFUSED = {**dict.fromkeys((f"blk.0.{t}.bias" for t in ("attn_qkv", "attn_output", "ffn_up", "ffn_down")),
                                   "linear biases, Falcon's bias=true"),
                  "blk.0.ffn_norm.weight": "a sequential block, Falcon's parallel_attn=false"}


def _falcon_kv_heads(config: Mapping[str, Any]) -> int:
    """Falcon's KV heads from its layout flags: num_kv_heads counts only with new_decoder_architecture
    (Falcon-7B's re-saved config states its head count there; llama.cpp's converter would write that)."""
    if not config.get("new_decoder_architecture") and config.get("multi_query"):
        return 1
    return config.get("num_kv_heads") or config["num_attention_heads"]


def _falcon(norms: int, table: TensorTable) -> GgufArch:
    return GgufArch("falcon", arch="falcon", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                    "feed_forward_length": "ffn_hidden_size"},
                    omitted=NO_ROPE_BASE,
                    defaults={"activation": "gelu", "bias": False, "alibi": False, "num_ln_in_parallel_attn": norms},
                    norm_eps="attention.layer_norm_epsilon", table=table, derived=_falcon_layout,
                    refused=FALCON_REFUSED, transformers_layout=lambda config: not config["new_decoder_architecture"],
                    unstated={"num_key_value_heads": _falcon_kv_heads},
                    constants={"tensor_data_layout": "jploski"})  # its qkv as [q | k | v]


# Falcon-40B's second norm (`ln_attn`, `attn_norm_2`) feeds attention, its first (`ln_mlp`) the MLP;
# Falcon-RW's ALiBi has no GGUF form (llama.cpp's falcon always rotates)
FALCON_TWO_NORMS = _falcon(2, _falcon_table((("attn_norm_2", "attn_norm"), ("attn_norm", "mlp_norm"))))
GGUF_FALCON = replace(_falcon(1, _falcon_table((("attn_norm", "attn_norm"),))),
                          variants=(("blk.0.attn_norm_2.weight", FALCON_TWO_NORMS),), arch="falcon")


FAMILY = Family("falcon", ("falcon",), "FalconForCausalLM", TENSORS, CONFIG, layout=layout_table, gguf=(GGUF_FALCON,))
