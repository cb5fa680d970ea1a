"""The olmo2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "olmo2", dict(attention_bias=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    old_style={"rope_theta": 500000.0},
    card=("norm on sublayer output only", "QK norm: over the whole projection", "eps=1e-05", "weight in fp32",
          "biases: q, k, v, o"),
    tp_refusal="QK norm over the whole projection needs every head's values",
)
