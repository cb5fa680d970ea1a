"""The bailing_hybrid test model (see tests/specs/__init__.py): Ling 3's stack, two Kimi delta attention
layers then one latent attention layer (layer_group_size 3) twice, with Ling's full f_proj / g_proj, the
bounded forget gate and the per-head output gate on the MLA layers; the first layer dense, the others
mixtures of experts with DeepSeek-V3's grouped router and two shared experts. head_dim (the KDA heads')
equals qk_rope_head_dim: transformers writes head_dim back as qk_rope_head_dim, so only then does a file
it saved read back as the model it saved. A transformers 5 model type: no older config style."""

from __future__ import annotations

from specs import F, Spec

L = "linear_attention"
SIZES = dict(num_attention_heads=4, num_key_value_heads=4, head_dim=8, short_conv_kernel_size=4, kv_lora_rank=16,
             qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, pad_token_id=0, eos_token_id=1, bos_token_id=2)
MOE = dict(num_experts=8, num_experts_per_token=3, moe_intermediate_size=32, num_shared_experts=2,
           num_expert_group=4, topk_group=2, routed_scaling_factor=1.5, first_k_dense_replace=1)
SPEC = Spec(
    "bailing_hybrid",
    kwargs=dict(SIZES, **MOE, num_hidden_layers=6, layer_group_size=3, num_mtp_layers=0, kda_lower_bound=-3.0,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0}),
    old_style={}, old_styled=False,
    card=("mixer: Kimi delta attention, 4 heads x 8, conv 4 on q|k|v, q and k L2-normed, conv and A_log kept in fp32",
          "attention: latent (MLA), 4 heads, plain q projection, kv_lora_rank 16",
          "MLA head dims: q/k 12 + rotary 8, v 10",
          "attention output gate: sigmoid(a projection of the input, one per head) in fp32 times each head's output",
          "layer pattern: MF MF AF MF MF AF",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3, 4, 5])"),
    selection_bias_buffer=True, own_spelling={"max_position_embeddings": "model_max_length"},
    # transformers' defaults: head_dim 128 for the KDA heads, which to_dict writes back as qk_rope_head_dim (64)
    convertible={"head_dim": 64},
    tp_refusal="the kimi_delta mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(SIZES, **MOE, num_hidden_layers=4, layer_types=[L, F, L, F], kda_safe_gate=False),
        dict(SIZES, num_hidden_layers=2, q_lora_rank=24, attention_bias=True, mlp_layer_types=["dense", "dense"],
             layer_types=[F, F], rms_norm_eps=1e-5),
        dict(SIZES, num_hidden_layers=3, layer_types=[L, L, L], mlp_layer_types=["dense"] * 3,
             short_conv_kernel_size=3),
    ),
)
