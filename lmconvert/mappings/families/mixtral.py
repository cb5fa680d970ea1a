"""Mixtral 8x7B, 8x22B and other MixtralForCausalLM checkpoints.

Same as mistral, except: every layer's FFN is a mixture of `num_local_experts` SwiGLU experts
(`block_sparse_moe.experts.{e}.w1` gate, `w3` up, `w2` down on the Hub; transformers 5's fused
`mlp.experts.gate_up_proj` / `down_proj` also read), each `intermediate_size` wide, with a router
(`block_sparse_moe.gate`) whose softmax is taken in fp32 and whose top `num_experts_per_tok`
weights are always renormalised and stay fp32 (each expert's output is weighted in fp32, then cast
back); `rms_norm_eps` defaults to 1e-5, `rope_theta` to 1e6 and `sliding_window` to null.
`router_jitter_noise` and the auxiliary-loss keys act in training only and are not read.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import (
    STATES_VOCAB_AND_ROPE,
                          GgufArch,
)
from ..tables.hf_config import Key
from ..tables.hf_moe import expert_rules, experts
from ..tables.table import TensorTable
from . import llama, mistral

TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES
                      + expert_rules("block_sparse_moe", ("w1", "w3", "w2"), "gate"))

# MixtralConfig keeps a null head_dim (hidden / heads) as null
HEAD_DIM = Entry("head_dim", (Key("head_dim", int, None, nullable=True),),
                 lambda hf, fields: {"head_dim": hf.get("head_dim")},
                 lambda cfg: {"head_dim": None if cfg.head_dim * cfg.n_heads == cfg.d_model else cfg.head_dim})

CONFIG = mistral.CONFIG.but(
    add=(llama.norm(1e-5), HEAD_DIM,
         experts(Key("num_local_experts", int, 8), Key("num_experts_per_tok", int, 2), norm_topk=True,
                 weights_fp32=True, aux_default=0.001)),
    defaults={"sliding_window": None, "rope_theta": 1e6},
)


# -- llama.cpp (GGUF)
# Mixtral is llama.cpp's `llama` with stacked experts on every layer (feed_forward_length is the
# expert width), told apart by its general.name; its graph renormalises the top-k weights and has no window
GGUF_MIXTRAL = GgufArch("mixtral", arch="llama", named="mixtral", keys={"expert_count": "num_local_experts",
                                             "expert_used_count": "num_experts_per_tok"},
                            defaults={"hidden_act": "silu", "sliding_window": None}, permute_qk=True,
                            stated=STATES_VOCAB_AND_ROPE,
                            experts=True, transformers_reads=False)


FAMILY = Family("mixtral", ("mixtral",), "MixtralForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MIXTRAL,))
