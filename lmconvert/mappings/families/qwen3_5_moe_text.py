"""Qwen3.5 mixture-of-experts text decoders: Qwen3_5MoeForCausalLM (model_type qwen3_5_moe_text) and
the text half of the published Qwen3_5MoeForConditionalGeneration (qwen3_5_moe).

Same as qwen3_5_text, except: every layer's FFN is a mixture of `num_experts` experts
(`moe_intermediate_size` wide, the width config.json states and the only one: there is no
`intermediate_size`) with a sigmoid-gated shared expert, as Qwen3-Next's, whose top-k weights are
always renormalised (no `norm_topk_prob`, `decoder_sparse_step` or `mlp_only_layers`). The wrapper
is qwen3_5_moe (Qwen3_5MoeForConditionalGeneration), its vision tower left out.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import plain
from ..tables.gguf import QWEN_MOE_KEYS
from ..tables.hf_config import Key
from ..tables.hf_moe import expert_rules, experts
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.table import TensorTable
from . import qwen2_moe, qwen3_5_text, qwen3_next

TENSORS = TensorTable(qwen3_5_text.TENSORS.rules + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate")
                      + qwen2_moe.SHARED_RULES)

CONFIG = qwen3_5_text.CONFIG.but(
    drop=("intermediate_size",),
    add=(plain("moe_intermediate_size", "d_ff", int, 512),  # the experts' width, the only FFN width
         experts(Key("num_experts", int, 256), Key("num_experts_per_tok", int, 8),
                 shared_width=Key("shared_expert_intermediate_size", int, 512), shared="gated", aux_default=0.001,
                 norm_topk=True)),
    defaults={"hidden_size": 2048, "num_hidden_layers": 40, "num_key_value_heads": 2},
    decoder=lambda data: nested_text_config(data, "qwen3_5_moe", ("qwen3_5_moe_text",), {}, tie=False),
)

NOTES = {"qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration (model_type qwen3_5_moe): only the text decoder is "
                        "read; the vision tower and its patch merger are left out"}

# -- llama.cpp (GGUF): its qwen35moe architecture, qwen35's with the experts and the gated shared expert
GGUF_QWEN35MOE = qwen3_5_text.gguf_entry(
    "qwen3_5_moe_text", "qwen35moe", True,
    {**QWEN_MOE_KEYS, "expert_shared_feed_forward_length": "shared_expert_intermediate_size"})

FAMILY = Family("qwen3_5_moe_text", ("qwen3_5_moe_text", "qwen3_5_moe"), "Qwen3_5MoeForCausalLM",
                wrapped(TENSORS, "visual", legacy=False), CONFIG, notes=NOTES,
                gguf=(GGUF_QWEN35MOE,), reference_layouts=qwen3_next.REFERENCE_LAYOUTS)
