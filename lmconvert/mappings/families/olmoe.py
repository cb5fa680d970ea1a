"""OLMoE (OLMoE-1B-7B), without `clip_qkv`.

Same as llama, except: every layer's FFN is a mixture of `num_experts` SwiGLU experts, each
`intermediate_size` wide, with a router (`mlp.gate`) whose softmax is in fp32 and whose top
`num_experts_per_tok` weights are renormalised only if `norm_topk_prob`, then cast to the
activation dtype; `q_norm` / `k_norm` normalise the whole q and k projections (all heads together,
llama-style RMSNorm, weight after the cast) before the head split; `rms_norm_eps` defaults to
1e-5; `attention_bias` switches the q, k, v and o biases; the MLP has no bias. `clip_qkv` is
refused, as for OLMo.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed, unsupported
from ..tables.gguf import (
                          ATTENTION_BIAS_FLAG,
                          written,
)
from ..tables.hf_config import Key
from ..tables.hf_moe import expert_rules, experts
from ..tables.points import QK_NORM_PROJECTION
from ..tables.table import TensorTable
from . import llama

TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + llama.QK_NORM_RULES
                      + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate"))

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-5), fixed("QK norm", qk_norm="projection"),
         unsupported("clip_qkv", float, None, "clamping q, k and v", "OLMoE", nullable=True),
         experts(Key("num_experts", int, 64), Key("num_experts_per_tok", int, 8), norm_key=Key("norm_topk_prob", bool,
                                                                                                 False),
                 aux_default=0.01)),
    defaults={"vocab_size": 50304, "intermediate_size": 2048, "max_position_embeddings": 4096,
              "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not an OlmoeConfig key, read if stated
)


# -- llama.cpp (GGUF)
# OLMoE: llama.cpp's graph never renormalises the top-k weights; feed_forward_length is the expert width
GGUF_OLMOE = written("olmoe", arch="olmoe",
                     keys={"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok"},
                          defaults={"hidden_act": "silu", "norm_topk_prob": False}, bias_flags=ATTENTION_BIAS_FLAG,
                          experts=True, head_dim_stated=False)


# q_norm(q_proj(x)) over the whole projection, viewed afterwards, as OLMo 2's
REFERENCE_LAYOUTS = QK_NORM_PROJECTION

FAMILY = Family("olmoe", ("olmoe",), "OlmoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_OLMOE,),
                reference_layouts=REFERENCE_LAYOUTS)
