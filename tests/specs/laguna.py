"""The laguna test model (see tests/specs/__init__.py): 4 layers of 4, 8, 2 and 4 query heads over 2 KV heads of
16; full on 0 and 3 (half of each head rotated, theta 5e4), sliding (window 4, the whole head, theta 2e4) on 1
and 2; a softplus gate per head; layer 0 dense, 1 to 3 mixtures of 8 experts (top-3, router logits capped at 2,
the weighted sum x1.5) and a shared expert of 48."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

ROPE = {F: {"rope_type": "default", "rope_theta": 5e4, "partial_rotary_factor": 0.5},
        S: {"rope_type": "default", "rope_theta": 2e4}}  # partial_rotary_factor absent: 1
MOE = dict(num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)

SPEC = Spec(
    "laguna",
    kwargs=dict(MOE, num_attention_heads_per_layer=[4, 8, 2, 4], sliding_window=WINDOW, layer_types=[F, S, S, F],
                moe_routed_scaling_factor=1.5, moe_router_logit_softcapping=2.0, eos_token_id=1,
                rope_parameters=ROPE),
    old_style={}, old_styled=False,  # LagunaConfig reads no older RoPE keys (convert_rope_params_to_dict: none)
    # the KV cache per token in fp32: 4 layers x 2 KV heads x (16 + 16) x 4 bytes = 1,024
    card=("query heads per layer: [4, 8, 2, 4]", "QK norm: per head",
          "attention output gate: softplus(a projection of the input, one per head) in fp32 times each head's output",
          "sliding window 4 on local layers; pattern GLLG", "KV cache          1,024 bytes per token (float32)",
          "theta=50000, 0.5 of head_dim; local layers: RoPE half, theta=20000",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3])",
          "sigmoid in fp32 then sorted top-k, renormalised, weights in activation dtype, selection bias, scaled x1.5 "
          "(the weighted sum), logits soft-capped at 2 in fp32, renormalised by the sum + 0",
          "shared experts, ungated, width 48"),
    # every stated key takes effect: both layer types where rope_parameters is transformers' default (both types),
    # partial_rotary_factor stated in each (export writes it)
    config_variants=(
        dict(layer_types=[F, S], head_dim=16),
        dict(MOE, num_attention_heads_per_layer=[2, 4, 6, 2], gating=False, attention_bias=True,
             moe_router_logit_softcapping=0.0, moe_routed_scaling_factor=1.0, rms_norm_eps=1e-5,
             tie_word_embeddings=True, mlp_layer_types=["sparse", "dense", "sparse", "dense"],
             output_router_logits=True, router_aux_loss_coef=0.02, layer_types=[S, S, F, F], sliding_window=5,
             rope_parameters={F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6,
                                  "partial_rotary_factor": 1.0},
                              S: {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}),
        dict(MOE, layer_types=[S, S, S, S],
             rope_parameters={S: {"rope_type": "default", "rope_theta": 3e4, "partial_rotary_factor": 0.25}}),
    ),
    # llama.cpp's laguna: the window on every layer but each fourth from the first, no router soft-cap
    gguf=dict(MOE, num_attention_heads_per_layer=[4, 8, 2, 4], sliding_window=WINDOW, layer_types=[F, S, S, S],
              moe_routed_scaling_factor=1.5, moe_router_logit_softcapping=0.0, eos_token_id=1, rope_parameters=ROPE),
    tp_refusal="query heads that differ by layer have no tensor-parallel plan",
)
