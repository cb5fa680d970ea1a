"""The qwen2_moe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "qwen2_moe",
    kwargs=dict(num_hidden_layers=3, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1],
                      use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6}, old_drop=("layer_types",),
    card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [0, 2])", "FFN: SwiGLU, d_ff 96",
          "renormalised, weights in activation dtype", "one shared expert, sigmoid-gated, width 48",
          "biases: q, k, v", "sliding window 4 on local layers; pattern LGG"),
    layer_types=([F, S, S], ("global", "local", "local")))
