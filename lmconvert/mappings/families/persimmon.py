"""Persimmon (adept/persimmon-8b-base, persimmon-8b-chat; Fuyu's language model).

Same as gpt_neox (LayerNorms with a bias at `layer_norm_eps`, torch's kernel, so weight and bias
apply in fp32; q, k and v one fused `query_key_value` laid out head by head, [q_h; k_h; v_h], with a
bias; the output projection `dense` with a bias; a plain MLP with biases, `dense_h_to_4h`,
`hidden_act`, `dense_4h_to_h`; RoPE over `partial_rotary_factor` (default 0.5) of each head, its
cos/sin cast to the activation dtype; head_dim hidden/heads, no KV grouping), except: the blocks are
sequential pre-norm (`input_layernorm`, `post_attention_layernorm`); `qk_layernorm` (default true)
adds a LayerNorm with a bias over each head of q and k (one weight [head_dim] shared by all heads), on
the (B, T, H, D) view before the heads move before time and before RoPE; the activation defaults to
relu2 (squared ReLU); the names are llama's (`model.embed_tokens`, `model.layers.{i}.self_attn`,
`model.final_layernorm`) and the LM head has no bias (untied by default); the attention bias is
always there (no `attention_bias` key); `hidden_dropout` drops only the MLP's output (training only;
checked, not kept, as the canonical residual dropout drops both sublayers').
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.hf_config import Key
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import gptj, llama
from .gpt_neox import fused_qkv

WB = ("weight", "bias")
LAYER = "model.layers.{}"
TENSORS = TensorTable((
    Rule("model.embed_tokens.weight", "embed.weight"),
    *(Rule(f"{LAYER}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")) for p in WB),
    *(rule for p in WB for rule in fused_qkv(f"{LAYER}.self_attn.query_key_value.{p}")),
    *(Rule(f"{LAYER}.self_attn.{hf}.{p}", f"layers.{{}}.attn.{c}.{p}")
      for hf, c in (("dense", "o"), ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")) for p in WB),
    *(Rule(f"{LAYER}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
      for hf, c in (("dense_h_to_4h", "up"), ("dense_4h_to_h", "down")) for p in WB),
    *(Rule(f"model.final_layernorm.{p}", f"final_norm.{p}") for p in WB),
    Rule("lm_head.weight", "lm_head.weight"),
))

QK_NORMS = {False: "none", True: "head"}


def qk_layernorm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # projection-wide QK norms read back as none, so export refuses them by name
    return {"qk_layernorm": cfg.qk_norm == "head"}


CONFIG = llama.CONFIG.but(
    drop=("num_key_value_heads", "head_dim", "attention_bias", "mlp_bias"),
    add=(gptj.layer_norm("layer_norm_eps", 1e-5),
         llama.activation("hidden_act", "relu2"),
         rope(partial=True),
         Entry("qk_layernorm", (Key("qk_layernorm", bool, True),),
               lambda hf, _: {"qk_norm": QK_NORMS[hf.get("qk_layernorm")]}, qk_layernorm_to_hf),
         Entry("hidden_dropout", (Key("hidden_dropout", float, 0.0, bound="probability"),), lambda hf, _: {},
               lambda cfg: {"hidden_dropout": DEFAULT}),
         fixed("block", gated=False, q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True)),
    defaults={"vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 36,
              "num_attention_heads": 64, "max_position_embeddings": 16384, "partial_rotary_factor": 0.5},
    nullable={"attention_dropout": False},
)

# PersimmonAttention: q_layernorm / k_layernorm on the fused output viewed (B, T, H, D), then transposed
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("persimmon", ("persimmon",), "PersimmonForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
