"""CodeGen (Salesforce/codegen-350M ... 16B, mono / multi / nl; CodeGen 1).

Same as gptj (one LayerNorm `ln_1` with a bias shared by attention and the MLP, which run in parallel
and are summed `(attn + mlp) + h`; interleaved RoPE over an absolute `rotary_dim` of each head, theta
10000; q and k upcast to fp32 for the scores, the softmax in fp32 cast back; no attention biases; a
plain MLP with biases `fc_in` / `fc_out`; an LM head with a bias, so never tied; the GPT-2 era keys
and dropouts; MHA only), except: q, k and v are one `qkv_proj` without a bias, laid out as the 4
shards of the model-parallel original (`mp_num`), each a quarter of the model width of q, then v,
then k rows, [q_s | v_s | k_s] (the tensor table regroups them and cuts the pieces; export writes
them back that way, and refuses a width 4 does not divide); `out_proj` is the output projection;
the sin/cos table stays fp32 (not cast to the activation dtype, as GPT-J's is), so q and k rotate in
fp32 and are cast back afterwards; `n_ctx` is read by nothing (the context is `n_positions`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..family import Family
from ..tables.config_table import Entry, unsupported
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, Piece, QkvShards
from . import gptj

WB = ("weight", "bias")
LAYER = "transformer.h.{}"
QKV = ("q", "q", "q")  # q | k | v once regrouped, each as wide as the model (no KV grouping)

TENSORS = TensorTable((
    Rule("transformer.wte.weight", "embed.weight"),
    *(Rule(f"{LAYER}.ln_1.{p}", f"layers.{{}}.attn_norm.{p}") for p in WB),
    *(Rule(f"{LAYER}.attn.qkv_proj.weight", f"layers.{{}}.attn.{c}.weight", Chain(QkvShards(), Piece(QKV, i)))
      for i, c in enumerate("qkv")),
    Rule(f"{LAYER}.attn.out_proj.weight", "layers.{}.attn.o.weight"),
    *(Rule(f"{LAYER}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}") for hf, c in (("fc_in", "up"), ("fc_out", "down"))
      for p in WB),
    Rule(f"{LAYER}.attn.causal_mask", None),  # the causal-mask buffers older files stored
    Rule(f"{LAYER}.attn.masked_bias", None),
    *(Rule(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in WB),
    *(Rule(f"lm_head.{p}", f"lm_head.{p}") for p in WB),
))

def rotary_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"rope": replace(gptj.rotary_from_hf(hf, fields)["rope"], fp32_tables=True)}


CONFIG = gptj.CONFIG.but(
    add=(Entry("rope", (Key("rotary_dim", int, 64),), rotary_from_hf, gptj.rotary_to_hf),
         unsupported("tie_word_embeddings", bool, False, "an LM head tied to the embeddings, keeping its own bias",
                     "CodeGen"),),
)

FAMILY = Family("codegen", ("codegen",), "CodeGenForCausalLM", TENSORS, CONFIG)
