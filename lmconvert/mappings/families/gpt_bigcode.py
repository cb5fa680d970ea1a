"""GPTBigCode (bigcode/santacoder, bigcode/starcoder, starcoderbase, WizardCoder and other StarCoder
fine-tunes, gpt_bigcode-santacoder).

Same as gpt2 (pre-norm LayerNorms with a bias at `layer_norm_epsilon`, learned positions from 0
numbered from the sequence start, the `n_embd` / `n_layer` / `n_head` / `n_positions` / `n_inner`
keys also read as hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings,
scores scaled by head_dim ** -0.5 when `scale_attn_weights`, a plain MLP with biases, a tied LM head,
`add_cross_attention` refused), except: `c_attn`, `c_proj`, `mlp.c_fc` and `mlp.c_proj` are
`nn.Linear`s (weights [out, in], nothing transposed); `multi_query` (default true) gives one K/V
head shared by every query head, `c_attn` then being q | k | v with k and v one head wide; without
it, c_attn is laid out head by head, [q_h; k_h; v_h] (GPT-NeoX's layout), and there is no KV
grouping; the activation defaults to gelu_pytorch_tanh; attention is transformers' shared eager
attention (q.k * scale, the softmax in fp32 cast back) or SDPA, with no layer-index scaling or
reordered upcast, so `attention_softmax_in_fp32` and `scale_attention_softmax_in_fp32` change
nothing (checked, not kept); `num_key_value_heads` is derived from multi_query, never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed, unsupported
from ..tables.gguf import GgufArch, weight_and_bias
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Piece
from . import gpt2
from .gpt_neox import fused_qkv
from .llama import activation

WB = ("weight", "bias")
LAYER = "transformer.h.{}"
TENSORS = TensorTable((
    Rule("transformer.wte.weight", "embed.weight"),
    Rule("transformer.wpe.weight", "pos_embed.weight"),
    *(Rule(f"{LAYER}.{hf}.{p}", f"layers.{{}}.{c}.{p}") for hf, c in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm"))
      for p in WB),
    # head by head, [q_h; k_h; v_h]; with one K/V head (multi_query) that is q | k | v
    *(rule for p in WB for rule in fused_qkv(f"{LAYER}.attn.c_attn.{p}")),
    *(Rule(f"{LAYER}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down")) for p in WB),
    *(Rule(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in WB),
    Rule("lm_head.weight", "lm_head.weight"),
))


def attention_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"attn_scale": None if hf.get("scale_attn_weights") else 1.0,
            "n_kv_heads": 1 if hf.get("multi_query") else fields["n_heads"]}


def attention_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # another scale reads back as head_dim's own, other KV grouping as MHA: export refuses them by name
    return {"scale_attn_weights": cfg.attn_scale != 1.0, "multi_query": cfg.n_kv_heads == 1 < cfg.n_heads,
            "attention_softmax_in_fp32": DEFAULT, "scale_attention_softmax_in_fp32": DEFAULT}


CONFIG = gpt2.CONFIG.but(
    drop=("GPT-2 layers",),
    add=(activation("activation_function", "gelu_pytorch_tanh"),
         Entry("attention", (Key("scale_attn_weights", bool, True), Key("multi_query", bool, True),
                             Key("attention_softmax_in_fp32", bool, True),
                             Key("scale_attention_softmax_in_fp32", bool, True)), attention_from_hf, attention_to_hf),
         unsupported("add_cross_attention", bool, False, "cross attention to an encoder", "GPTBigCode"),
         fixed("GPTBigCode layers", gated=False, q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True)),
)


# -- llama.cpp (GGUF)
def _starcoder_table() -> TensorTable:
    """llama.cpp's starcoder (StarCoderModel in its converter, c_attn unchanged): `attn_qkv` rows
    [q | k | v], k and v `head_count_kv` heads wide (with multi_query, HF's own layout: one K/V head);
    LayerNorms with biases, every linear with a bias, `position_embd` the learned table."""
    return TensorTable((
        Rule("token_embd.weight", "embed.weight"), Rule("position_embd.weight", "pos_embed.weight"),
        *(Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "kv", "kv"), i))
          for p in WB for i, c in enumerate("qkv")),
        *(r for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for r in weight_and_bias(g, c, IDENTITY)),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in (("attn_norm", "attn_norm"),
                                                                        ("ffn_norm", "mlp_norm")) for p in WB),
        *(Rule(f"output_norm.{p}", f"final_norm.{p}") for p in WB), Rule("output.weight", "lm_head.weight"),
    ))


def _kv_heads(config: Mapping[str, Any]) -> dict[str, Any]:
    """multi_query from `head_count_kv`: one K/V head, or one per query head."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    if kv_heads not in (1, heads):
        raise MappingError(f"starcoder.attention.head_count_kv={kv_heads}: GPTBigCode has one K/V head (multi_query) "
                           f"or {heads}, one per query head")
    return {"multi_query": kv_heads == 1 < heads}


# llama.cpp's starcoder: its graph scales scores by head_dim ** -0.5 (scale_attn_weights) and runs the tanh GELU
GGUF_STARCODER = GgufArch("gpt_bigcode", arch="starcoder", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                                                  "feed_forward_length": "n_inner"},
                          defaults={"activation_function": "gelu_pytorch_tanh"}, transformers_reads=False,
                          norm_eps="attention.layer_norm_epsilon", table=_starcoder_table(), derived=_kv_heads,
                          unstated={"num_key_value_heads": lambda config: 1 if config.get("multi_query", True)
                                    else config.get("n_head", config.get("num_attention_heads"))})

FAMILY = Family("gpt_bigcode", ("gpt_bigcode",), "GPTBigCodeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_STARCODER,))
