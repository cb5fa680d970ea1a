"""The qwen2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, YARN, F, S, Spec

SPEC = Spec(
    "qwen2", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                  tie_word_embeddings=True, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, **YARN}),
    old_style={"rope_theta": 1e6, "rope_scaling": {"type": "yarn", **YARN}}, old_drop=("layer_types",),
    card=("biases: q, k, v", "sliding window 4 on local layers; pattern GLL", "yarn x4", "embeddings: tied"),
    layer_types=([S, F, S], ("local", "global", "local")))
