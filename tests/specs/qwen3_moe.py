"""The qwen3_moe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, Spec

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "qwen3_moe",
    kwargs=dict(num_hidden_layers=4, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                      decoder_sparse_step=2, head_dim=16, attention_bias=True, use_sliding_window=True,
                      sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [1, 3])", "not renormalised",
          "QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern LLLL"))
