"""StarCoder2.

Same as mistral, except: LayerNorm with a bias (`norm_epsilon`, default 1e-5; torch's LayerNorm
applies weight and bias in fp32 and rounds once); one `use_bias` (default true) switches the q, k,
v, o and both MLP biases together; the MLP is plain, not gated (`c_fc`, `hidden_act`
(gelu_pytorch_tanh), `c_proj`); `sliding_window` (default none) covers every layer, and there is
no `layer_types`; `residual_dropout` and `embedding_dropout` (training only); tied by default.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..family import Family
from ..tables.config_table import Entry, fixed, plain
from ..tables.gguf import (
    PADDED,
    GgufArch,
    weight_and_bias,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import SLIDING_WINDOW_KEY, window_fields
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY
from . import llama, mistral

NORM_RULES = tuple(
    Rule(f"model.layers.{{}}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
    for hf, c in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"))
    for p in ("weight", "bias")
)
MLP_RULES = tuple(
    Rule(f"model.layers.{{}}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
    for hf, c in (("c_fc", "up"), ("c_proj", "down")) for p in ("weight", "bias")
)
TENSORS = TensorTable(llama.EDGE_RULES + (Rule("model.norm.bias", "final_norm.bias"),) + llama.ATTENTION_RULES
                      + MLP_RULES + NORM_RULES)

BIASES = ("q_bias", "k_bias", "v_bias", "o_bias", "mlp_bias")


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window")
    return window_fields(("local" if window is not None else "global",) * fields["n_layers"], window)


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # a local/global mix reads back as all local, so export refuses it by name
    return {"sliding_window": cfg.sliding_window}


def use_bias_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # true only when all five are there, so a partial set is reported as the biases it cannot express
    return {"use_bias": all(getattr(cfg, name) for name in BIASES)}


CONFIG = mistral.CONFIG.but(
    add=(Entry("norm", (Key("norm_epsilon", float, 1e-5),),
               lambda hf, _: {"norm": NormConfig(kind="layer", bias=True, eps=hf.get("norm_epsilon"),
                                                 dtype_order="scale_then_cast")},
               lambda cfg: {"norm_epsilon": cfg.norm.eps}),
         llama.activation("hidden_act", "gelu_pytorch_tanh"),
         Entry("layer kinds", (SLIDING_WINDOW_KEY,), window_from_hf, window_to_hf),
         Entry("use_bias", (Key("use_bias", bool, True),),
               lambda hf, _: dict.fromkeys(BIASES, hf.get("use_bias")), use_bias_to_hf),
         fixed("plain MLP", gated=False),
         plain("residual_dropout", "resid_dropout", float, 0.0, bound="probability"),
         plain("embedding_dropout", "embed_dropout", float, 0.0, bound="probability")),
    defaults={"vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
              "num_attention_heads": 24, "num_key_value_heads": 2, "max_position_embeddings": 4096,
              "tie_word_embeddings": True, "sliding_window": None},
    nullable={"num_key_value_heads": False},
)


# -- llama.cpp (GGUF)
def _starcoder2_table() -> TensorTable:
    """llama.cpp's StarCoder2 (`StarCoder2Model`): LayerNorms with biases, every linear with a bias,
    a plain MLP (`ffn_up`, `ffn_down`), q/k unpermuted; `output` only when untied."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(rule for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"),
                            ("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for rule in weight_and_bias(g, c, IDENTITY)),
    ))


# transformers' GGUF loader reads no RoPE base for StarCoder2 (its default, 10000, if the file has
# another: our reader takes the file's) and no window (llama.cpp's StarCoder2 has none either)
GGUF_STARCODER2 = GgufArch("starcoder2", arch="starcoder2", keys={"attention.layer_norm_epsilon": "norm_epsilon"},
                               defaults={"hidden_act": "gelu_pytorch_tanh", "sliding_window": None},
                               bias_flags={"use_bias": "blk.0.attn_q.bias"},
                               norm_eps="attention.layer_norm_epsilon", table=_starcoder2_table(),
                           head_dim_stated=False)


FAMILY = Family("starcoder2", ("starcoder2",), "Starcoder2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_STARCODER2,))
