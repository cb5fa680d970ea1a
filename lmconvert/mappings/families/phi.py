"""Phi (phi-1, phi-1.5, phi-2).

Same as llama, except: LayerNorm with a bias (`layer_norm_eps`, default 1e-5; torch's kernel,
so weight and bias apply in fp32); one norm (`input_layernorm`) shared by attention and the MLP,
which run in parallel and are summed `(attn + mlp) + h`; RoPE rotates only
`partial_rotary_factor` (default 0.5) of each head; q, k, v and the output projection (`dense`)
always have biases; `qk_layernorm` adds a LayerNorm with a bias over each head of q and k (one
weight [head_dim] shared by all heads), before RoPE; a plain MLP with biases (`fc1`, `hidden_act`
(gelu_new), `fc2`); `final_layernorm` with a bias; an LM head with a bias (so never tied);
`resid_pdrop` and `embd_pdrop` (training only).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry, fixed, plain, unsupported
from ..tables.gguf import (
    NO_ROPE_BASE,
    layernorm_table,
    written,
)
from ..tables.hf_config import Key
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from . import gptj, llama

WB = ("weight", "bias")
TENSORS = TensorTable((
    Rule("model.embed_tokens.weight", "embed.weight"),
    *(Rule(f"model.layers.{{}}.input_layernorm.{p}", f"layers.{{}}.attn_norm.{p}") for p in WB),
    *(Rule(f"model.layers.{{}}.self_attn.{hf}.{p}", f"layers.{{}}.attn.{c}.{p}")
      for hf, c in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("dense", "o"),
                    ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")) for p in WB),
    *(Rule(f"model.layers.{{}}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}") for hf, c in (("fc1", "up"), ("fc2", "down"))
      for p in WB),
    *(Rule(f"model.final_layernorm.{p}", f"final_norm.{p}") for p in WB),
    *(Rule(f"lm_head.{p}", f"lm_head.{p}") for p in WB),
))

QK_NORMS = {False: "none", True: "head"}


def qk_layernorm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # projection-wide QK norms read back as none, so export refuses them by name
    return {"qk_layernorm": cfg.qk_norm == "head"}


CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(gptj.layer_norm("layer_norm_eps", 1e-5),
         llama.activation("hidden_act", "gelu_new"),
         rope(partial=True),
         unsupported("tie_word_embeddings", bool, False, "an LM head tied to the embeddings, keeping its own bias",
                     "Phi"),
         Entry("qk_layernorm", (Key("qk_layernorm", bool, False),),
               lambda hf, _: {"qk_norm": QK_NORMS[hf.get("qk_layernorm")]}, qk_layernorm_to_hf),
         plain("resid_pdrop", "resid_dropout", float, 0.0, bound="probability"),
         plain("embd_pdrop", "embed_dropout", float, 0.0, bound="probability"),
         fixed("block", norm_placement="parallel_shared", parallel_sum="attn+mlp+h", gated=False, q_bias=True,
               k_bias=True, v_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True)),
    defaults={"vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
              "partial_rotary_factor": 0.5},
    nullable={"head_dim": False},  # not a PhiConfig key, read if stated
)


# -- llama.cpp (GGUF)
# Phi-2 (`phi`): one LayerNorm shared by the parallel attention and MLP (`attn_norm`), an output bias
GGUF_PHI2 = written("phi", arch="phi2", omitted=NO_ROPE_BASE, keys={"attention.layer_norm_epsilon": "layer_norm_eps"},
                         defaults={"hidden_act": "gelu_new"}, norm_eps="attention.layer_norm_epsilon",
                         partial_rotary=True, table=layernorm_table(Rule("output.bias", "lm_head.bias")),
                    head_dim_stated=False)


# PhiAttention: q_proj(x).view(B, T, -1, D).transpose(1, 2), then q_layernorm
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("phi", ("phi",), "PhiForCausalLM", TENSORS, CONFIG, gguf=(GGUF_PHI2,),
                reference_layouts=REFERENCE_LAYOUTS)
