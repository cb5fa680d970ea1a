"""The qwen3_5_moe_text test model (see tests/specs/__init__.py): qwen3_5_text's, every FFN four experts
and the gated shared expert (the top-k weights always renormalised)."""

from __future__ import annotations

from specs import F, GgufNaming, Spec
from specs.qwen3_5_text import ROPE, TEXT_ROPE
from specs.qwen3_next import GDN, L

EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
SPEC = Spec(
    "qwen3_5_moe_text", dict(num_hidden_layers=4, layer_types=[L, F, L, F], head_dim=16, attention_bias=True,
                             eos_token_id=1, rope_parameters=ROPE, **GDN, **EXPERTS),
    old_style={"rope_theta": 5e5, "partial_rotary_factor": 0.5, "full_attention_interval": 2},
    old_drop=("layer_types",),
    card=("mixer: gated delta-net, 2 q/k heads x 8, 4 value heads x 16 (2 value heads per key head), conv 4",
          "layer schedule: attention on 2 (1, 3); gated_deltanet on 2 (0, 2); FFN on all layers",
          "QK norm: per head", "biases: q, k, v, o"),
    not_a_key=("intermediate_size",),  # the experts' moe_intermediate_size is its only width
    # llama.cpp's qwen35 / qwen35moe: no attention biases, value heads as wide as keys
    gguf=dict(attention_bias=False, linear_value_head_dim=8),
    gguf_naming=GgufNaming(converter_names={("linear_attn.dt_bias", "mixer"): "ssm_dt.bias",  # its dt_proj.bias
                                            ("linear_attn.A_log", "mixer"): "ssm_a"}),
    tp_refusal="the gated_deltanet mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(head_dim=16, **GDN),
        dict(head_dim=16, num_hidden_layers=3, layer_types=[L, L, F], linear_num_key_heads=1, linear_num_value_heads=2,
             linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=3, rms_norm_eps=1e-5,
             attention_bias=True, tie_word_embeddings=True, rope_parameters=TEXT_ROPE, **EXPERTS),
    ),
)
