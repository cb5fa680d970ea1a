"""The helium test model (see tests/specs/__init__.py): heads x head_dim is hidden_size, as its o_proj needs."""

from __future__ import annotations

from specs import Spec

LINEAR = {"rope_type": "linear", "factor": 2.0}

SPEC = Spec(
    "helium", dict(head_dim=16, attention_bias=True, mlp_bias=True, rope_parameters={**LINEAR, "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "rope_scaling": LINEAR},
    card=("RoPE interleaved", "linear x2", "biases: q, k, v, mlp", "weight in fp32", "eps=1e-08"),
    config_variants=(dict(head_dim=16),
                     dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, attention_bias=True,
                          mlp_bias=True, rms_norm_eps=1e-6, tie_word_embeddings=True,
                          rope_parameters={**LINEAR, "rope_theta": 2e4}),
                     dict(head_dim=16, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 32, "rope_theta": 1e4})))
