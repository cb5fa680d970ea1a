"""The seed_oss test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import YARN, Spec

SPEC = Spec(
    "seed_oss", dict(head_dim=24, attention_out_bias=True, mlp_bias=True,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 1e7, **YARN}),
    old_style={"rope_theta": 1e7, "rope_scaling": {"type": "yarn", **YARN}},
    card=("head_dim 24", "biases: q, k, v, o, mlp", "yarn x4", "theta=1e+07"),
    config_variants=({}, dict(head_dim=None, num_key_value_heads=None, attention_bias=False, attention_out_bias=True,
                              mlp_bias=True, residual_dropout=0.2, attention_dropout=0.0, rms_norm_eps=1e-5,
                              tie_word_embeddings=True,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 1e7, **YARN}),
                     dict(head_dim=32, num_key_value_heads=1, residual_dropout=0.0,
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})),
    gguf=dict(attention_out_bias=False, mlp_bias=False))  # llama.cpp's seed_oss loads q, k, v biases only
