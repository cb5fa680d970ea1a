"""The nemotron test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "nemotron", dict(attention_bias=True, mlp_bias=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5},
    card=("LayerNorm, eps=1e-05, scale (w + 1), bias, weight in fp32", "pre-norm", "FFN: squared ReLU, d_ff 96",
          "RoPE half, theta=20000, 0.5 of head_dim", "biases: q, k, v, o, mlp", "embeddings: untied"),
    own_spelling={"rms_norm_eps": "norm_eps"})
