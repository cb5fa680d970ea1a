"""The llama test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, Spec

SPEC = Spec(
    "llama", dict(attention_bias=True, mlp_bias=True, rope_parameters={**LLAMA3, "rope_theta": 500000.0}),
    old_style={"rope_theta": 500000.0, "rope_scaling": LLAMA3},
    card=("pre-norm", "SwiGLU", "biases: q, k, v, o, mlp", "llama3 x8", "weight after cast"))
