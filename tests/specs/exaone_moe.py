"""The exaone_moe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, WINDOW, F, S, Spec

MOE = dict(num_hidden_layers=4, first_k_dense_replace=1, num_experts=8, num_experts_per_tok=3,
           moe_intermediate_size=32, num_shared_experts=2, n_group=4, topk_group=2)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    # 3 sliding layers with RoPE : 1 full layer without positions
    "exaone_moe",
    kwargs=dict(MOE, sliding_window=WINDOW, routed_scaling_factor=1.5, eos_token_id=1,
                rope_parameters={**LLAMA3, "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6, "rope_scaling": LLAMA3}, old_drop=("layer_types", "mlp_layer_types"),
    card=("mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3])", "QK norm: per head",
          "sliding window 4 on local layers; pattern LLLG", "positions: none (layers [3])",
          "renormalised, weights in fp32, best 2 of 4 groups, selection bias, scaled x1.5",
          "shared experts, ungated, width 64"),
    layer_types=([F, S, S, F], ("global", "local", "local", "global")),
    config_variants=(dict(MOE, layer_types=[S, S, S, F]),
                     dict(MOE, sliding_window=WINDOW, layer_types=[S, F, S, F], mlp_layer_types=["dense", "sparse",
                                                                                                 "dense", "sparse"],
                          num_shared_experts=0, norm_topk_prob=False, routed_scaling_factor=1.0, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
                     dict(MOE, layer_types=[F, F, F, F], first_k_dense_replace=2)),
    # llama.cpp's exaone-moe: no group-limited choice, RoPE unscaled (its converter states no scaling)
    gguf=dict(n_group=1, topk_group=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    selection_bias_buffer=True)
