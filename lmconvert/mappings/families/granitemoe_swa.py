"""GraniteMoeSWA (GraniteMoeSWAForCausalLM: GraniteMoeShared with sliding windows and attention sinks).

Same as granitemoeshared, except for granite_swa's attention: a learned sink per head
(`self_attn.sinks` [heads], transformers' output scale sigmoid(logsumexp(scores) - sink), computed by
the decoder as gpt-oss's extra softmax column), `layer_types` (default: layer i full where i % 4 == 0,
sliding elsewhere) within `sliding_window` (default 128), and `layer_rope_theta`, a RoPE theta per
layer (0: no positions), one for the full layers and one for the sliding ones (several within one kind
are refused by name); the experts and the router are read and written under transformers 5's names
only (`block_sparse_moe.experts.gate_up_proj`, `.experts.down_proj`, `.router.weight`), which has no
renaming of GraniteMoE's Hub names for this type.
"""

from __future__ import annotations

from ..family import Family
from ..tables.table import TensorTable
from . import granite_swa, granitemoe, granitemoeshared, llama
from .gpt_oss import SINK_RULES

# transformers has no renaming of the Hub's per-layer names for this type (conversion_mapping.py): its checkpoints
# hold its own, `block_sparse_moe.experts.gate_up_proj` / `down_proj` and `block_sparse_moe.router.weight`
EXPERT_RULES = tuple(r for r in granitemoe.EXPERT_RULES
                     if ".experts." in r.stored or r.stored.endswith(".router.weight"))
TENSORS = TensorTable(llama.EDGE_RULES + SINK_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + EXPERT_RULES
                      + granitemoeshared.SHARED_RULES)

CONFIG = granitemoeshared.CONFIG.but(drop=("rope",), add=granite_swa.SWA_ROWS, defaults={"sliding_window": 128})


# llama.cpp's granite_swa runs it too: granite_swa.GGUF_MOE_SWA
FAMILY = Family("granitemoe_swa", ("granitemoe_swa",), "GraniteMoeSWAForCausalLM", TENSORS, CONFIG,
                gguf=(granite_swa.GGUF_MOE_SWA,), reference_layouts=granitemoeshared.REFERENCE_LAYOUTS)
