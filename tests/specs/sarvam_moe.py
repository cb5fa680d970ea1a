"""The sarvam_moe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
           moe_intermediate_size=32, n_shared_experts=2, n_group=4, topk_group=2)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "sarvam_moe",
    kwargs=dict(MOE, routed_scaling_factor=1.5, attention_bias=True, head_dim=16, eos_token_id=1,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2])", "QK norm: per head",
          "biases: q, k, v", "renormalised, weights in fp32, best 2 of 4 groups, selection bias, scaled x1.5"),
    config_variants=(MOE, dict(MOE, norm_topk_prob=False, routed_scaling_factor=2.5, attention_bias=True,
                               use_qk_norm=False, rms_norm_eps=1e-5,
                               rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6,
                                                "partial_rotary_factor": 0.5}),
                     dict(MOE, first_k_dense_replace=0, n_group=1, topk_group=1)),
    selection_bias_buffer=True)
