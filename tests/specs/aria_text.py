"""The aria_text test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "aria_text",
    kwargs=dict(moe_num_experts=4, moe_topk=3, moe_num_shared_experts=2, attention_bias=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4},
    card=("mixture of experts: 4 experts, top-3, d_expert 96 (all layers)",
          "router: top-k on logits then softmax over the k, weights in activation dtype, softmax in activation dtype",
          "shared experts, ungated, width 192", "biases: q, k, v, o"),
    config_variants=({}, dict(moe_num_experts=4, moe_topk=3, moe_num_shared_experts=1, attention_bias=True,
                              head_dim=32, tie_word_embeddings=True)))
