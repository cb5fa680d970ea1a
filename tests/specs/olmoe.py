"""The olmoe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "olmoe",
    kwargs=dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True, eos_token_id=1,
                  rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5},
    card=("mixture of experts: 6 experts, top-3, d_expert 96 (all layers)", "QK norm: over the whole projection",
          "renormalised, weights in activation dtype", "eps=1e-05", "biases: q, k, v, o"),
    tp_refusal="QK norm over the whole projection needs every head's values",
)
