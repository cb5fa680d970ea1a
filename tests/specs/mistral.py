"""The mistral test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(
    "mistral", dict(sliding_window=WINDOW, head_dim=24,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("sliding window 4 on local layers; pattern LL", "head_dim 24", "biases: none"),
    layer_types=([F, S], ("global", "local")))  # AutoConfig then loads it as Ministral
