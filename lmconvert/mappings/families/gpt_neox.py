"""GPT-NeoX (GPT-NeoX-20B, Pythia, and the models trained with its code).

Same as llama, except: LayerNorm with a bias (`layer_norm_eps`, default 1e-5; torch's kernel, so
weight and bias apply in fp32); `use_parallel_residual` (default true) runs attention and the MLP
in parallel, each with its own norm, summed `(mlp + attn) + h`, else sequentially (pre-norm);
RoPE rotates only `partial_rotary_factor` (default 0.25) of each head, theta default 10000 (older
files: `rotary_pct`, `rotary_emb_base`); head_dim is hidden/heads and there is no KV grouping; q,
k and v are one fused projection (`query_key_value`) laid out head by head, [q_h; k_h; v_h];
`attention_bias` (default true) switches its bias and the output projection's (`dense`); a plain
MLP with biases (`dense_h_to_4h`, `hidden_act` (gelu), `dense_4h_to_h`); the LM head is stored
as `embed_out` (transformers 5 calls the module `lm_head`, reads both names and saves the old one);
`hidden_dropout` (training only) drops each sublayer's output and the embeddings.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import (
    layernorm_table,
    written,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import FRACTION, PARAMETER_KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, Piece, QkvGroups
from . import gptj, llama

WB = ("weight", "bias")


QKV = ("q", "kv", "kv")  # a fused projection's pieces, once in [q; k; v] order


def fused_qkv(stored: str, grouped: bool = True) -> tuple[Rule, ...]:
    """The rules of one fused qkv tensor (weights or biases): q, k and v are its pieces, after a
    per-KV-group layout (NeoX, BLOOM, Falcon) is regrouped to [q; k; v] (MPT's already is)."""
    part = stored.rsplit(".", 1)[1]
    return tuple(Rule(stored, f"layers.{{}}.attn.{c}.{part}", Chain(QkvGroups(), Piece(QKV, i)) if grouped
                      else Piece(QKV, i)) for i, c in enumerate("qkv"))


TENSORS = TensorTable((
    Rule("gpt_neox.embed_in.weight", "embed.weight"),
    *(Rule(f"gpt_neox.layers.{{}}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")) for p in WB),
    *(rule for p in WB for rule in fused_qkv(f"gpt_neox.layers.{{}}.attention.query_key_value.{p}")),
    *(Rule(f"gpt_neox.layers.{{}}.attention.dense.{p}", f"layers.{{}}.attn.o.{p}") for p in WB),
    *(Rule(f"gpt_neox.layers.{{}}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
      for hf, c in (("dense_h_to_4h", "up"), ("dense_4h_to_h", "down")) for p in WB),
    *(Rule(f"gpt_neox.layers.{{}}.attention.{buffer}", None)  # buffers older files hold
      for buffer in ("bias", "masked_bias", "rotary_emb.inv_freq")),
    *(Rule(f"gpt_neox.final_layer_norm.{p}", f"final_norm.{p}") for p in WB),
    Rule("embed_out.weight", "lm_head.weight"),  # as transformers saves it (its module is `lm_head` since 5)
    Rule("lm_head.weight", "lm_head.weight"),
))

# the older spellings of the RoPE keys, which GPTNeoXConfig reads when rope_parameters lacks them
LEGACY_ROPE = (Key("rotary_emb_base", float, 10000.0, legacy=True),
               Key("rotary_pct", float, 0.25, bound="fraction", legacy=True))


def rope_from_neox(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    params, where = rope_parameters(hf)
    stated = HfConfig(params, PARAMETER_KEYS, where)
    theta = stated.get("rope_theta") if stated.stated("rope_theta") else hf.get("rotary_emb_base")
    if not stated.stated(FRACTION.name):
        params[FRACTION.name] = hf.get("rotary_pct")
    return {"rope": rope_from_hf(hf, params, where, theta=theta, partial=True)}


ROPE = Entry("rope", (Key("rope_parameters", dict, None, nullable=True),
                      Key("rope_scaling", dict, None, nullable=True, legacy=True), *LEGACY_ROPE),
             rope_from_neox, lambda cfg: {"rope_parameters": rope_to_hf(cfg.rope, partial=True)})

PLACEMENTS = {True: "parallel_separate", False: "pre"}
SUMS = {True: "mlp+attn+h", False: "h+attn+mlp"}


def parallel_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # another placement reads back as pre-norm, so export refuses it by name
    return {"use_parallel_residual": cfg.norm_placement == "parallel_separate"}


def bias_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"attention_bias": llama.attention_bias_of(cfg)}


def dropout_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    p = hf.get("hidden_dropout")
    return {"resid_dropout": p, "embed_dropout": p}


CONFIG = llama.CONFIG.but(
    drop=("num_key_value_heads", "head_dim", "mlp_bias"),
    add=(gptj.layer_norm("layer_norm_eps", 1e-5),
         llama.activation("hidden_act", "gelu"),
         ROPE,
         Entry("use_parallel_residual", (Key("use_parallel_residual", bool, True),),
               lambda hf, _: {"norm_placement": PLACEMENTS[hf.get("use_parallel_residual")],
                              "parallel_sum": SUMS[hf.get("use_parallel_residual")]}, parallel_to_hf),
         Entry("attention_bias", (Key("attention_bias", bool, True),),
               lambda hf, _: llama.attention_biases(hf.get("attention_bias")), bias_to_hf),
         Entry("hidden_dropout", (Key("hidden_dropout", float, 0.0, bound="probability"),), dropout_from_hf,
               lambda cfg: {"hidden_dropout": cfg.resid_dropout}),
         fixed("plain MLP", gated=False, mlp_bias=True)),
    defaults={"vocab_size": 50432, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 44,
              "num_attention_heads": 64},
    nullable={"attention_dropout": False},
)


# -- llama.cpp (GGUF)
GGUF_GPTNEOX = written("gpt_neox", arch="gptneox", keys={"attention.layer_norm_epsilon": "layer_norm_eps",
                                              "use_parallel_residual": "use_parallel_residual",
                                              "rope.freq_base": "rotary_emb_base"},  # its older spellings
                            defaults={"hidden_act": "gelu"}, norm_eps="attention.layer_norm_epsilon",
                            partial_rotary=True, rotary_key="rotary_pct", table=layernorm_table(qkv=True))


FAMILY = Family("gpt_neox", ("gpt_neox",), "GPTNeoXForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GPTNEOX,))
