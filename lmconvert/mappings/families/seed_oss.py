"""Seed-OSS (ByteDance-Seed/Seed-OSS-36B).

Same as llama, except: `attention_bias` (default true) switches the q, k and v biases only, and
`attention_out_bias` (default false) the o bias; `residual_dropout` (default 0.1) drops each
sublayer's output (after o_proj, after down_proj) before the residual add, in training only;
`attention_dropout` defaults to 0.1 and is never null; its own defaults (155136 tokens, 64 layers,
80 heads and 8 KV heads of head_dim 128, 27648 FFN width, 524288 positions). The dtype order is
llama's: the RMSNorm statistics in fp32, cast back, then the weight multiplies in the activation
dtype.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import Entry, plain
from ..tables.gguf import ATTENTION_BIAS_FLAG, tensor_table, written
from ..tables.hf_config import Key
from ..tables.table import Rule, TensorTable
from . import llama


def qkv_bias(default: bool) -> Entry:
    """`attention_bias` switching the q, k and v biases (not o's), shared with helium."""
    return Entry("attention_bias", (Key("attention_bias", bool, default),),
                 lambda hf, _: dict.fromkeys(("q_bias", "k_bias", "v_bias"), hf.get("attention_bias")),
                 # true only when all three are there, so a partial set is reported as the biases it cannot express
                 lambda cfg: {"attention_bias": cfg.q_bias and cfg.k_bias and cfg.v_bias})


CONFIG = llama.CONFIG.but(
    add=(qkv_bias(True), plain("attention_out_bias", "o_bias", bool, False),
         plain("residual_dropout", "resid_dropout", float, 0.1, bound="probability")),
    defaults={"vocab_size": 155136, "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 80,
              "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 524288,
              "attention_dropout": 0.1},
    nullable={"attention_dropout": False},
)



# -- llama.cpp (GGUF)
def _seed_oss_table() -> TensorTable:
    """llama.cpp's seed_oss: the MLP's pre-norm (HF's post_attention_layernorm) is stored as
    `post_attention_norm`, there is no `ffn_norm`; q/k unpermuted (NeoX-style rotation)."""
    mlp_norm, rules = "blk.{}.post_attention_norm.weight", tensor_table(False, 0.0, True).rules
    return TensorTable(tuple(Rule(r.stored, "layers.{}.mlp_norm.weight", r.transform) if r.stored == mlp_norm else r
                             for r in rules if r.stored != "blk.{}.ffn_norm.weight"))


# its loader reads the q, k and v biases only
GGUF_SEED_OSS = written("seed_oss", arch="seed_oss", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG,
                        table=_seed_oss_table())

FAMILY = Family("seed_oss", ("seed_oss",), "SeedOssForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_SEED_OSS,))
