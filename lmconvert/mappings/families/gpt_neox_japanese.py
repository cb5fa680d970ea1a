"""GPT-NeoX-Japanese (abeja/gpt-neox-japanese).

Same as gpt_neox, except: always sequential pre-norm blocks (no `use_parallel_residual`); no
biases but one, the output projection's on the last layer only (`dense_bias`, added after the
matmul as `bias_dropout_add` does: `o_bias_layers`); RoPE rotates `partial_rotary_factor` of each
head with a default of 1.0 (older files: `rotary_pct`, `rotary_emb_base`); the MLP has no bias and
its width is `intermediate_multiple_size` x hidden_size; scores are `baddbmm(0, q, k^T, alpha=1 /
sqrt(head_dim))` (the scale inside the product); the LM head (`embed_out`) is tied to the
embeddings by default; `attention_dropout` (default 0.1) drops attention weights and
`hidden_dropout` each sublayer's output (training only).
"""

from __future__ import annotations

import math
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry, fixed, plain
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from . import gpt_neox, gptj, llama

P = "gpt_neox_japanese"
WB = ("weight", "bias")

TENSORS = TensorTable((
    Rule(f"{P}.embed_in.weight", "embed.weight"),
    *(Rule(f"{P}.layers.{{}}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm")) for p in WB),
    *gpt_neox.fused_qkv(f"{P}.layers.{{}}.attention.query_key_value.weight"),
    Rule(f"{P}.layers.{{}}.attention.dense.weight", "layers.{}.attn.o.weight"),
    Rule(f"{P}.layers.{{}}.attention.dense_bias", "layers.{}.attn.o.bias"),
    Rule(f"{P}.layers.{{}}.mlp.dense_h_to_4h.weight", "layers.{}.mlp.up.weight"),
    Rule(f"{P}.layers.{{}}.mlp.dense_4h_to_h.weight", "layers.{}.mlp.down.weight"),
    *(Rule(f"{P}.layers.{{}}.attention.{buffer}", None)  # buffers older files hold
      for buffer in ("bias", "masked_bias", "rotary_emb.inv_freq")),
    *(Rule(f"{P}.final_layer_norm.{p}", f"final_norm.{p}") for p in WB),
    Rule("embed_out.weight", "lm_head.weight"),
))

LEGACY_ROPE = (Key("rotary_emb_base", float, 10000.0, legacy=True),
               Key("rotary_pct", float, 1.0, bound="fraction", legacy=True))
ROPE = Entry("rope", (Key("rope_parameters", dict, None, nullable=True),
                      Key("rope_scaling", dict, None, nullable=True, legacy=True), *LEGACY_ROPE),
             gpt_neox.rope_from_neox, gpt_neox.ROPE.write)


def ffn_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"d_ff": int(fields["d_model"] * hf.get("intermediate_multiple_size"))}


def ffn_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # a width that is no multiple of hidden_size reads back otherwise, so export refuses it by name
    return {"intermediate_multiple_size": max(1, cfg.d_ff // cfg.d_model)}


def last_layer_bias(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """The o bias on the last layer only; the score scale 1 / math.sqrt(head_dim) (its norm_factor),
    kept where it is not head_dim ** -0.5 to the last bit."""
    head_dim = fields["d_model"] // fields["n_heads"]
    scale = 1.0 / math.sqrt(head_dim)
    return {"o_bias": True, "o_bias_layers": (fields["n_layers"] - 1,),
            "attn_scale": None if scale == head_dim ** -0.5 else scale}


CONFIG = llama.CONFIG.but(
    drop=("num_key_value_heads", "head_dim", "mlp_bias", "intermediate_size", "attention_bias"),
    add=(gptj.layer_norm("layer_norm_eps", 1e-5),
         llama.activation("hidden_act", "gelu"),
         ROPE,
         Entry("intermediate_multiple_size", (Key("intermediate_multiple_size", int, 4),), ffn_from_hf, ffn_to_hf),
         plain("attention_dropout", "attn_dropout", float, 0.1, bound="probability"),
         plain("hidden_dropout", "resid_dropout", float, 0.0, bound="probability"),
         Entry("last-layer o bias", (), last_layer_bias, lambda cfg: {}),
         fixed("GPT-NeoX-Japanese block", gated=False, bias_separate=True, scale_in_product=True)),
    defaults={"vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
              "tie_word_embeddings": True},
)


FAMILY = Family("gpt_neox_japanese", ("gpt_neox_japanese",), "GPTNeoXJapaneseForCausalLM", TENSORS, CONFIG)
