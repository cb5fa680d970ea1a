"""The internlm3 test model (see tests/specs/__init__.py): LLaMA modules under InternLM3Config, its
biases under InternLM's own names in the older style."""

from __future__ import annotations

from specs import Spec

LINEAR = {"rope_type": "linear", "factor": 2.0}

SPEC = Spec(
    "internlm3", dict(head_dim=24, qkv_bias=True, bias=True, rope_parameters={**LINEAR, "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5, "rope_scaling": LINEAR, "qkv_bias": True, "bias": True},
    old_drop=("attention_bias", "mlp_bias"),
    card=("head_dim 24", "biases: q, k, v, o, mlp", "linear x2", "eps=1e-05", "weight after cast"),
    config_variants=({}, dict(head_dim=None, num_key_value_heads=None, qkv_bias=True, bias=True, rms_norm_eps=1e-6,
                              tie_word_embeddings=True, rope_parameters={**LINEAR, "rope_theta": 5e5}),
                     dict(head_dim=32, num_key_value_heads=1, rope_parameters={
                         "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32, "rope_theta": 5e5})),
    gguf={})  # llama.cpp's llama holds it whole
