"""The sarvam_mla test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import YARN, Spec

# YaRN with mscale_all_dim, so the score scale is multiplied by mscale squared; the older files spell it
# rope_scaling type "deepseek_yarn", and state q_head_dim and head_dim, which SarvamMLAConfig drops
ROPE = {**YARN, "rope_type": "yarn", "mscale": 0.8, "mscale_all_dim": 0.7}
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
           moe_intermediate_size=32, n_shared_experts=2)

# not renormalised (the default, renormalised, is in config_variants; glm4_moe's and dots1's models use the same
# router renormalised)
SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "sarvam_mla",
    kwargs=dict(MLA, **MOE, n_group=4, topk_group=2, q_lora_rank=24, attention_bias=True, routed_scaling_factor=1.5,
                norm_topk_prob=False, rope_parameters={**ROPE, "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "rope_scaling": {**YARN, "type": "deepseek_yarn", "mscale": 0.8,
                                                   "mscale_all_dim": 0.7},
               "q_head_dim": 20, "head_dim": 64},
    old_drop=("qk_head_dim",),
    card=("attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16",
          "q/k 12 + rotary 8, v 10; score scale 0.26911", "biases: q_a, kv_a, o", "rotary dims in pairs", "yarn x4",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2])",
          "not renormalised, weights in fp32, best 2 of 4 groups, selection bias, scaled x1.5"),
    config_variants=(dict(MLA, **MOE), dict(MLA, **MOE, n_group=4, topk_group=2, q_lora_rank=24, attention_bias=True,
                                            rope_interleave=False, norm_topk_prob=False, rms_norm_eps=1e-5,
                                            rope_parameters={**ROPE, "rope_theta": 1e6}),
                     dict(MLA, num_hidden_layers=2, first_k_dense_replace=2)),
    # llama.cpp's deepseek2: no biases, unscaled RoPE, the MLA norms' eps 1e-6 for every norm
    gguf=dict(attention_bias=False, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    selection_bias_buffer=True)
