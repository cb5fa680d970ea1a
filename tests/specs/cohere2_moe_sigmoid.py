"""The cohere2_moe test model with its other choices (see tests/specs/__init__.py): the sigmoid router
renormalised, shared experts summed, llama's RMSNorm, and dense full-attention layers without RoPE."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "cohere2_moe", family="cohere2_moe",
    kwargs=dict(num_hidden_layers=3, head_dim=16, num_experts=4, num_experts_per_tok=3, num_shared_experts=1,
                shared_expert_combination_strategy="sum", expert_selection_fn="sigmoid", norm_topk_prob=True,
                rms_norm_eps=1e-6, prefix_dense_intermediate_size=48, mlp_layer_types=["dense", "sparse", "sparse"],
                prefix_dense_sliding_window_pattern=2, layer_types=[F, S, F], sliding_window=WINDOW,
                logit_scale=0.25, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4},
    card=("mixture of experts: 4 experts, top-3, d_expert 96 (layers [1, 2])",
          "router: top-k on logits then their sigmoids, renormalised, weights in activation dtype",
          "shared experts, ungated, width 96", "RMSNorm, eps=1e-06"),
    layer_types=([S, F, S], ("local", "global", "local")))
