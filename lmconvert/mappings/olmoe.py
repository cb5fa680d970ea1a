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

from . import llama
from .config_table import fixed, unsupported
from .family import Family
from .hf_config import Key
from .hf_moe import expert_rules, experts
from .table import TensorTable

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

FAMILY = Family("olmoe", ("olmoe",), "OlmoeForCausalLM", TENSORS, CONFIG)
