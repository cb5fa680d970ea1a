"""The iquestcoder test model (see tests/specs/__init__.py): LLaMA modules under IQuestCoderConfig."""

from __future__ import annotations

from specs import YARN, Spec

SPEC = Spec(
    "iquestcoder", dict(head_dim=24, attention_bias=True, mlp_bias=True,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, **YARN}),
    old_style={"rope_theta": 5e5, "rope_scaling": {"type": "yarn", **YARN}},
    card=("head_dim 24", "biases: q, k, v, o, mlp", "yarn x4", "eps=1e-05", "weight after cast"),
    config_variants=({}, dict(head_dim=None, num_key_value_heads=None, attention_bias=True, mlp_bias=True,
                              rms_norm_eps=1e-6, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, **YARN}),
                     dict(head_dim=32, num_key_value_heads=1, attention_bias=True,
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})),
    gguf={})  # llama.cpp's llama holds it whole
