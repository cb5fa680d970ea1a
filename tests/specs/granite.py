"""The granite test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "granite", dict(embedding_multiplier=10.3, attention_multiplier=0.0625, residual_multiplier=0.22,
                    logits_scaling=8.0, attention_bias=True, mlp_bias=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4},
    card=("residual scale: 0.22", "score scale: 0.0625", "embedding scale: 10.3", "logit scale: 0.125",
          "pre-norm", "SwiGLU", "biases: q, k, v, o, mlp"))
