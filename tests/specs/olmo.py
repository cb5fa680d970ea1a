"""The olmo test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "olmo", dict(attention_bias=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5},
    card=("LayerNorm, eps=1e-05, no scale", "pre-norm", "SwiGLU", "biases: q, k, v, o", "embeddings: untied"),
    not_a_key=("rms_norm_eps",))
