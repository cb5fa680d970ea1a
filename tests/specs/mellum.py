"""The mellum test model (see tests/specs/__init__.py): sliding and full layers with their own RoPE
(YaRN on the full ones), dense and sparse FFN layers."""

from __future__ import annotations

from specs import WINDOW, YARN, F, S, Spec

ROPE = {F: {"rope_type": "yarn", "rope_theta": 1e6, **YARN}, S: {"rope_type": "default", "rope_theta": 1e4}}
SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "mellum",
    kwargs=dict(num_hidden_layers=4, num_local_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                head_dim=16, attention_bias=True, sliding_window=WINDOW, layer_types=[S, F, S, S],
                mlp_layer_types=["dense", "sparse", "sparse", "dense"], norm_topk_prob=False, rope_parameters=ROPE),
    old_style={}, old_styled=False,  # MellumConfig reads no older RoPE keys
    card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [1, 2])", "not renormalised",
          "QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern LGLL", "yarn x4",
          "local layers: RoPE half, theta=10000"),
    config_variants=(
        dict(layer_types=[F, S], sliding_window=6, head_dim=8, rope_parameters=ROPE),
        dict(num_hidden_layers=3, layer_types=[S, S, F], mlp_layer_types=["sparse", "dense", "sparse"],
             num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
             output_router_logits=True, router_aux_loss_coef=0.01, tie_word_embeddings=True, rms_norm_eps=1e-5,
             rope_parameters={F: {"rope_type": "default", "rope_theta": 2e5},
                              S: {"rope_type": "linear", "rope_theta": 5e3, "factor": 2.0}}),
    ),
    # llama.cpp's mellum graph: experts on every layer, renormalised, no biases; it reads rope.freq_base_swa but
    # rotates the sliding layers with the full layers' theta (and no scaling)
    gguf=dict(attention_bias=False, mlp_layer_types=None, norm_topk_prob=True, layer_types=[S, F, S, F],
              rope_parameters={F: ROPE[F], S: {"rope_type": "default", "rope_theta": 1e6}}))
