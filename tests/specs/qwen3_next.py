"""The qwen3_next test model (see tests/specs/__init__.py): gated delta-net layers around two gated
attention layers (two value heads per key head, a conv of 4), experts with a gated shared expert and
one dense layer (`mlp_only_layers`), the top-k weights not renormalised, biases on, half of each head
rotated."""

from __future__ import annotations

from specs import F, GgufNaming, Spec

L = "linear_attention"
# Qwen3NextModel.modify_tensors names these itself: in_proj_qkvz split into attn_qkv and attn_gate, dt_bias as
# dt_proj.bias, A_log as ssm_a
NAMING = GgufNaming(converter_names={("linear_attn.in_proj_qkvz.weight", "in_proj_qkv"): "attn_qkv.weight",
                                     ("linear_attn.in_proj_qkvz.weight", "in_proj_z"): "attn_gate.weight",
                                     ("linear_attn.dt_bias", "mixer"): "ssm_dt.bias",
                                     ("linear_attn.A_log", "mixer"): "ssm_a"})
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
           linear_conv_kernel_dim=4)
ROPE = {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
SPEC = Spec(
    "qwen3_next", dict(num_hidden_layers=4, layer_types=[L, F, L, F], head_dim=16, attention_bias=True,
                       mlp_only_layers=[2], norm_topk_prob=False, eos_token_id=1, rope_parameters=ROPE,
                       **GDN, **EXPERTS),
    # transformers 4's files: rope_theta and the rotated fraction at the top level, the schedule as an interval
    old_style={"rope_theta": 5e5, "partial_rotary_factor": 0.5, "full_attention_interval": 2},
    old_drop=("layer_types",),
    card=("mixer: gated delta-net, 2 q/k heads x 8, 4 value heads x 16 (2 value heads per key head), conv 4",
          "layer schedule: attention on 2 (1, 3); gated_deltanet on 2 (0, 2); FFN on all layers",
          "QK norm: per head", "biases: q, k, v, o"),
    # llama.cpp's qwen3next: experts on every layer, renormalised, no attention biases, value heads as wide as keys
    gguf=dict(mlp_only_layers=[], norm_topk_prob=True, attention_bias=False, linear_value_head_dim=8),
    gguf_naming=NAMING,
    tp_refusal="the gated_deltanet mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(head_dim=16, **GDN),
        dict(head_dim=16, num_hidden_layers=3, layer_types=[L, L, F], linear_num_key_heads=1, linear_num_value_heads=2,
             linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=3, rms_norm_eps=1e-5,
             num_experts=0, attention_bias=True, tie_word_embeddings=True, rope_parameters=ROPE),
        dict(head_dim=16, full_attention_interval=2, decoder_sparse_step=2, norm_topk_prob=False, **GDN, **EXPERTS),
    ),
)
