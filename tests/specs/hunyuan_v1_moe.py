"""The hunyuan_v1_moe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec
from specs.hunyuan_v1_dense import NTK_ALPHA

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "hunyuan_v1_moe",
    kwargs=dict(head_dim=16, num_experts=6, moe_topk=3, attention_bias=True, rope_parameters=NTK_ALPHA),
    old_style={"rope_theta": 1e4, "rope_scaling": {"type": "dynamic", "factor": 1.0, "alpha": 1000.0}},
    card=("mixture of experts: 6 experts, top-3, d_expert 96 (all layers)", "QK norm: per head, after RoPE",
          "renormalised, weights in fp32", "NTK alpha 1000: static base", "biases: q, k, v, o"),
    config_variants=(dict(head_dim=16, num_experts=4, moe_topk=2),
                     dict(head_dim=32, num_experts=6, moe_topk=3, attention_bias=True, rms_norm_eps=1e-6,
                          rope_parameters=NTK_ALPHA)),
    gguf=dict(attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
