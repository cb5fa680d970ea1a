"""The persimmon test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

LINEAR = {"rope_type": "linear", "factor": 2.0}

SPEC = Spec(  # a fraction other than the default half, and a scaled RoPE that reads it too
    "persimmon", dict(eos_token_id=1, rope_parameters={**LINEAR, "rope_theta": 2e4, "partial_rotary_factor": 0.75}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.75, "rope_scaling": LINEAR},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "QK norm: per head",
          "RoPE half, theta=20000, 0.75 of head_dim, linear x2", "FFN: squared ReLU, d_ff 96",
          "biases: q, k, v, o, mlp", "attention: MHA, 4 heads", "embeddings: untied"),
    config_variants=({}, dict(qk_layernorm=False, hidden_act="gelu", layer_norm_eps=1e-6, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                               "partial_rotary_factor": 0.25})),
    own_spelling={"rms_norm_eps": "layer_norm_eps"},
    not_a_key=("num_key_value_heads", "head_dim"))
