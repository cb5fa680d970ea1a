"""The axk1 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import YARN, Spec

ROPE = {**YARN, "rope_type": "yarn", "mscale": 0.8, "mscale_all_dim": 0.7}
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
MOE = dict(num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
           n_shared_experts=2)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "axk1",
    kwargs=dict(MLA, **MOE, mlp_layer_types=["dense", "sparse", "sparse"], n_group=4, topk_group=2, q_lora_rank=24,
                attention_bias=True, routed_scaling_factor=1.5, norm_topk_prob=False, eos_token_id=1,
                bos_token_id=2, rope_parameters={**ROPE, "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "rope_scaling": {**YARN, "type": "yarn", "mscale": 0.8, "mscale_all_dim": 0.7}},
    card=("attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2])",
          "not renormalised, weights in fp32, best 2 of 4 groups, selection bias, scaled x1.5",
          "the mixture's output normalised (sparse layers)"),
    config_variants=(dict(MLA, **MOE, n_group=1, topk_group=1),
                     dict(MLA, **MOE, mlp_layer_types=["sparse", "dense", "sparse"], n_group=4, topk_group=2,
                          q_lora_rank=12, attention_bias=True, rope_interleave=False, norm_topk_prob=False,
                          rms_norm_eps=1e-5, rope_parameters={**ROPE, "rope_theta": 1e6}),
                     dict(MLA, num_hidden_layers=2, mlp_layer_types=["dense", "dense"])),
    selection_bias_buffer=True)
