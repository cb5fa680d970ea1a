"""The gemma test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "gemma", dict(head_dim=16, attention_bias=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 20000.0}),
    old_style={"rope_theta": 20000.0, "hidden_act": "gelu"},  # the legacy spelling of tanh GELU
    card=("pre-norm", "scale (w + 1)", "weight in fp32", "GeGLU (tanh)", "embedding scale: 8",
          "biases: q, k, v, o", "embeddings: tied"),
    not_on_card=("soft-cap", "sliding"))
