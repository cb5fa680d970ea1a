"""The gemma4_text MoE test model (see tests/specs/__init__.py): gemma4_text's (per-layer geometry, K = V,
proportional RoPE, KV sharing with double-wide MLPs, layer scalars) with the MoE block on every layer (the 26B-A4B
layout): 6 experts of width 32, top 3, beside each layer's dense MLP."""

from __future__ import annotations

from specs import Spec
from specs.gemma4_text import SPEC as TEXT

MOE = dict(enable_moe_block=True, num_experts=6, top_k_experts=3, moe_intermediate_size=32)
SPEC = Spec(
    "gemma4_text", {**TEXT.kwargs, **MOE},
    old_style=TEXT.old_style, old_drop=TEXT.old_drop,
    card=(*TEXT.card, "mixture of experts: 6 experts, top-3, d_expert 32 (all layers)",
          "router: softmax then top-k, renormalised, weights in fp32, input normalised and scaled, per-expert scale",
          "experts beside the dense MLP: each output normalised, then summed"),
    not_on_card=TEXT.not_on_card,
    convertible={"hidden_size_per_layer_input": 0},
    tp_refusal=TEXT.tp_refusal, family="gemma4_text",
)
