"""The glm4_moe_lite test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import YARN, Spec

# YaRN with mscale_all_dim, so the score scale is multiplied by mscale squared
ROPE = {**YARN, "rope_type": "yarn", "mscale": 0.8, "mscale_all_dim": 0.7}
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
MOE = dict(num_hidden_layers=3, mlp_layer_types=["sparse", "dense", "sparse"], n_routed_experts=8,
           num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=2, n_group=4, topk_group=2)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "glm4_moe_lite",
    kwargs=dict(MLA, **MOE, q_lora_rank=24, attention_bias=True, norm_topk_prob=False, routed_scaling_factor=1.5,
                rope_parameters={**ROPE, "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "rope_scaling": ROPE}, old_drop=("qk_head_dim",),
    card=("attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16",
          "q/k 12 + rotary 8, v 10; score scale 0.26911", "biases: q_a, kv_a, o", "rotary dims in pairs",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [0, 2])",
          "not renormalised, weights in fp32, best 2 of 4 groups, selection bias, scaled x1.5"),
    config_variants=(dict(MLA, **MOE), dict(MLA, **MOE, q_lora_rank=None, attention_bias=True, rope_interleave=False,
                                            norm_topk_prob=False, rms_norm_eps=1e-6,
                                            rope_parameters={**ROPE, "rope_theta": 1e6}),
                     dict(MLA, num_hidden_layers=2, mlp_layer_types=["dense", "dense"])),
    # llama.cpp's deepseek2: no biases, unscaled RoPE, the MLA norms' eps 1e-6 for every norm; dense layers first
    gguf=dict(attention_bias=False, rms_norm_eps=1e-6, mlp_layer_types=["dense", "sparse", "sparse"],
              rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    selection_bias_buffer=True)
