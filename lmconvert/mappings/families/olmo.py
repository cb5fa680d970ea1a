"""OLMo (1): OLMo-1B/7B and OLMo-1.7 (`clip_qkv`).

Same as llama, except: the norms are LayerNorms with neither weight nor bias, eps fixed at 1e-5
(no config key), computed in fp32 and cast back, so there are no norm tensors at all; RoPE
cos/sin stay in fp32 (q and k rotate in fp32, as in OLMo 2); `attention_bias` switches the q, k,
v and o biases; the MLP has no bias; `clip_qkv` (null: none) clamps the q, k and v projections
to [-clip_qkv, clip_qkv] before the head split.
"""

from __future__ import annotations

from lmconvert.arch import NormConfig

from ..family import Family
from ..tables.config_table import fixed, plain
from ..tables.gguf import (
                          tensor_table,
                          written,
)
from ..tables.hf_rope import rope
from ..tables.table import TensorTable
from . import llama

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(fixed("norm", norm=NormConfig(kind="layer", eps=1e-5, weight=False)), rope(fp32_tables=True),
         plain("clip_qkv", "clip_qkv", float, None, nullable=True)),
    defaults={"vocab_size": 50304},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not an OlmoConfig key, read if stated
)


# -- llama.cpp (GGUF)
GGUF_OLMO = written("olmo", arch="olmo", constants={"attention.layer_norm_epsilon": 1e-5},
                    keys={"attention.clamp_kqv": "clip_qkv"}, defaults={"hidden_act": "silu"},
                         norm_eps="attention.layer_norm_epsilon", permute_qk=True,
                         table=TensorTable(tuple(r for r in tensor_table(True, 0.0, True).rules
                                                 if not r.stored.endswith("norm.weight"))),  # norms without weights
                         head_dim_stated=False)


FAMILY = Family("olmo", ("olmo",), "OlmoForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_OLMO,))
