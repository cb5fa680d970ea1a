"""The ernie4_5_moe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

# sparse layers 1 and 3 (every second layer from 1), a norm_min the chosen probabilities' sum often falls below
MOE = dict(num_hidden_layers=4, moe_num_experts=6, moe_k=3, moe_intermediate_size=32, moe_num_shared_experts=2,
           moe_layer_start_index=1, moe_layer_interval=2, moe_norm_min=0.3)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "ernie4_5_moe",
    kwargs=dict(MOE, head_dim=16, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4},
    card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [1, 3])", "RoPE interleaved, theta=20000",
          "softmax then top-k, renormalised, weights in activation dtype, selection bias, logits in fp32, "
          "sum clamped to >= 0.3", "shared experts, ungated, width 64", "embeddings: tied"),
    config_variants=(MOE, dict(MOE, moe_layer_start_index=0, moe_layer_end_index=2, moe_layer_interval=1,
                               moe_num_shared_experts=0, moe_norm_min=1e-6, tie_word_embeddings=False,
                               rms_norm_eps=1e-6, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                   "rope_theta": 1e6}),
                     dict(num_hidden_layers=2, moe_layer_start_index=2, use_bias=True)),
    # llama.cpp's ernie4_5-moe: experts on every layer from the first sparse one, to the last, and its norm_min
    gguf=dict(moe_layer_interval=1, moe_norm_min=1e-12),
    not_a_key=("attention_dropout",))
