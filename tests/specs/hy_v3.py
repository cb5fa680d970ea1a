"""The hy_v3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

MOE = dict(num_hidden_layers=3, mlp_layer_types=["sparse", "dense", "sparse"], num_experts=6, num_experts_per_tok=3,
           moe_intermediate_size=32, num_shared_experts=2)
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "hy_v3",
    kwargs=dict(MOE, head_dim=16, router_scaling_factor=1.5, attention_bias=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [0, 2])", "QK norm: per head",
          "biases: q, k, v, o", "renormalised, weights in fp32, selection bias, scaled x1.5"),
    config_variants=(dict(MOE, head_dim=16), dict(MOE, head_dim=32, router_scaling_factor=2.5, attention_bias=True,
                                                  rms_norm_eps=1e-6, rope_parameters=LINEAR),
                     dict(num_hidden_layers=2, mlp_layer_types=["dense", "dense"], mlp_bias=True, head_dim=16)),
    selection_bias_buffer=True)
