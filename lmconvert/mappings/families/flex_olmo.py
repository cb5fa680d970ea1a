"""FlexOlmo (FlexOlmo-7x7B-1T).

Same as olmo2, except: every layer's FFN is OLMoE's mixture of `num_experts` SwiGLU experts (the
config class also reads `num_local_experts`), each `intermediate_size` wide, with a router
(`mlp.gate`) whose logits are in the activation dtype, whose softmax is in fp32 and whose top
`num_experts_per_tok` weights are renormalised in fp32 only if `norm_topk_prob`, then cast to the
activation dtype before they weight each expert's output; `rms_norm_eps` defaults to 1e-6 and
`rope_theta` to 5e5; `attention_dropout` may be null.
"""

from __future__ import annotations

from ..family import Family
from ..tables.hf_config import Key
from ..tables.hf_moe import expert_rules, experts
from ..tables.points import QK_NORM_PROJECTION
from ..tables.table import TensorTable
from . import llama, olmo2

TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + olmo2.OUTPUT_NORM_RULES + llama.QK_NORM_RULES
                      + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate"))

CONFIG = olmo2.CONFIG.but(
    add=(llama.norm(1e-6, dtype_order="scale_then_cast"),
         experts(Key("num_experts", int, 7), Key("num_experts_per_tok", int, 5),
                 norm_key=Key("norm_topk_prob", bool, False), aux_default=0.01)),
    defaults={"vocab_size": 100352, "max_position_embeddings": 4096, "rope_theta": 5e5},
    nullable={"attention_dropout": True},
)

# q_norm(q_proj(x)) over the whole projection, viewed afterwards, as OLMo 2's
REFERENCE_LAYOUTS = QK_NORM_PROJECTION

FAMILY = Family("flex_olmo", ("flex_olmo",), "FlexOlmoForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
