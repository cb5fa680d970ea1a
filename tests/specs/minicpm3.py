"""The minicpm3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LONGROPE, Spec

SPEC = Spec(  # longrope in its short regime (the long one: test_minicpm3.py); scaled embeddings,
    # residuals and LM-head input
    "minicpm3", dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
                     qk_rope_head_dim=8, v_head_dim=10, scale_emb=12, scale_depth=1.4, dim_model_base=24,
                     attention_bias=True, mlp_bias=True, eos_token_id=1,
                     rope_parameters={**LONGROPE, "rope_type": "longrope", "rope_theta": 2e4,
                                      "original_max_position_embeddings": 64}),
    old_style={"rope_theta": 2e4, "rope_scaling": {**LONGROPE, "type": "longrope",
                                                   "original_max_position_embeddings": 64}},
    old_drop=("qk_head_dim",),
    card=("attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16", "q/k 12 + rotary 8, v 10",
          "biases: q_a, kv_a, o", "RoPE half, theta=20000, longrope x2",
          # c_kv 16 + k_rot 8 against MHA's 4 heads x (20 + 10)
          "latent KV cache: 24 entries per token and layer (c_kv 16 + k_rot 8); MHA with these heads: 120; "
          "20.0% of it", "KV cache          192 bytes per token (float32)",
          "embedding scale: 12 (rounded to weight dtype)", "residual scale: 0.989949 (each sublayer's output)",
          "LM-head input divided by 2.66667", "biases: mlp", "embeddings: tied"),
    not_on_card=("mixture of experts", "logit scale"),
    # llama.cpp's minicpm3: no biases, unscaled RoPE, eps 1e-6 for every norm (the MLA norms' own), base 256
    gguf=dict(attention_bias=False, mlp_bias=False, rms_norm_eps=1e-6, dim_model_base=256,
              rope_parameters={"rope_type": "default", "rope_theta": 2e4}))
