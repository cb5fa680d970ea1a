"""The youtu test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import YARN, Spec

# YaRN with mscale_all_dim, so the score scale is multiplied by mscale squared
ROPE = {**YARN, "rope_type": "yarn", "mscale": 0.8, "mscale_all_dim": 0.7}
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)

SPEC = Spec(  # dense latent attention (MLA) with q LoRA, interleaved rotary dims and its biases; no pad token
    # (YoutuConfig's default): transformers zeroes the pad token's embedding row on loading (the family's docstring)
    "youtu", dict(MLA, q_lora_rank=24, attention_bias=True, eos_token_id=1, bos_token_id=2, pad_token_id=None,
                  rope_parameters={**ROPE, "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "rope_scaling": ROPE}, old_drop=("qk_head_dim",),
    card=("attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16",
          "q/k 12 + rotary 8, v 10; score scale 0.26911", "biases: q_a, kv_a, o", "rotary dims in pairs",
          "yarn x4", "pre-norm", "SwiGLU", "embeddings: tied"),
    not_on_card=("mixture of experts",),
    config_variants=(dict(num_key_value_heads=4),
                     dict(MLA, q_lora_rank=None, attention_bias=True, rope_interleave=False, tie_word_embeddings=False,
                          hidden_act="gelu", rms_norm_eps=1e-5,
                          rope_parameters={**ROPE, "rope_theta": 1e6})),
    # llama.cpp's deepseek2: no biases, unscaled RoPE, the MLA norms' eps 1e-6 for every norm
    gguf=dict(attention_bias=False, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 2e4}))
