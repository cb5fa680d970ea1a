"""The qwen3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(
    "qwen3", dict(head_dim=16, attention_bias=True, use_sliding_window=True, sliding_window=WINDOW,
                  max_window_layers=1, rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
    old_style={"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    old_drop=("layer_types",),
    card=("QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern GL", "linear x2"),
    layer_types=([S, F], ("local", "global")))
