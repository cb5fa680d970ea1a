"""The hyperclovax test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # Granite's four multipliers (logits multiplied, not divided) on sandwich norms (use_post_norm); an
    # embedding multiplier bf16 cannot hold, multiplied unrounded
    "hyperclovax", dict(embedding_multiplier=10.3, attention_multiplier=0.0625, residual_multiplier=0.22,
                        logits_scaling=0.125, attention_bias=True, mlp_bias=True, head_dim=16, eos_token_id=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4},
    card=("sandwich", "residual scale: 0.22", "score scale: 0.0625", "embedding scale: 10.3 (a float multiply)",
          "logit scale: 0.125",
          "SwiGLU", "biases: q, k, v, o, mlp", "embeddings: untied"),
    config_variants=({}, dict(use_post_norm=False, attention_multiplier=None, head_dim=32, num_key_value_heads=4,
                              tie_word_embeddings=True, rms_norm_eps=1e-5, hidden_act="gelu",
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})))
