"""The stablelm test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "stablelm", dict(use_parallel_residual=True, use_qkv_bias=True, eos_token_id=1,
                     rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.25},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm", "SwiGLU",
          "RoPE half, theta=20000, 0.25 of head_dim", "biases: q, k, v", "embeddings: untied"),
    own_spelling={"rms_norm_eps": "layer_norm_eps"})
