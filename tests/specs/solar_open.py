"""The solar_open test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

MOE = dict(n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=2, n_group=4,
           topk_group=2)

# not renormalised here; renormalised in config_variants
SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "solar_open",
    kwargs=dict(MOE, norm_topk_prob=False, routed_scaling_factor=1.5, attention_bias=True, head_dim=16, eos_token_id=1,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("mixture of experts: 8 experts, top-3, d_expert 32 (all layers)", "biases: q, k, v",
          "not renormalised, weights in fp32, best 2 of 4 groups, selection bias, scaled x1.5",
          "shared experts, ungated, width 64"),
    config_variants=(MOE, dict(MOE, norm_topk_prob=False, routed_scaling_factor=2.5, attention_bias=True,
                               n_shared_experts=0, rms_norm_eps=1e-6,
                               rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
                     dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=32)),
    not_a_key=("intermediate_size",),
    selection_bias_buffer=True)
