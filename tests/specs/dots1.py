"""The dots1 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
           moe_intermediate_size=32, n_shared_experts=2, n_group=4, topk_group=2)
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "dots1",
    kwargs=dict(MOE, norm_topk_prob=True, routed_scaling_factor=1.5, attention_bias=True, sliding_window=WINDOW,
                max_window_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6}, old_drop=("layer_types",),
    card=("mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2])", "QK norm: per head",
          "biases: q, k, v, o", "sliding window 4 on local layers; pattern GLL"),
    layer_types=([S, F, S], ("local", "global", "local")),
    config_variants=(MOE, dict(MOE, norm_topk_prob=True, routed_scaling_factor=2.5, attention_bias=True,
                              sliding_window=4, max_window_layers=2, rope_parameters=LINEAR),
                     dict(MOE, first_k_dense_replace=0, n_group=1, topk_group=1)),
    # llama.cpp's dots1: no o bias, no window, k and v as wide as q, an output matrix; head_dim 32 as the
    # qwen3_moe model's (test_llamacpp's q8_0 note: with head_dim 16 llama.cpp's q8_0 error is 2.2x ours)
    gguf=dict(attention_bias=False, sliding_window=None, num_key_value_heads=4, tie_word_embeddings=False,
              head_dim=32),
    convertible={"first_k_dense_replace": 62},
    selection_bias_buffer=True)  # its expert counts have no defaults
