"""The flex_olmo test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "flex_olmo",
    kwargs=dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True, eos_token_id=1,
                pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("mixture of experts: 6 experts, top-3, d_expert 96 (all layers)", "norm on sublayer output only",
          "QK norm: over the whole projection", "renormalised, weights in activation dtype", "eps=1e-06",
          "weight in fp32", "biases: q, k, v, o"),
    config_variants=({}, dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True,
                              rms_norm_eps=1e-5, rope_parameters=LINEAR)),
    tp_refusal="QK norm over the whole projection needs every head's values",
)
