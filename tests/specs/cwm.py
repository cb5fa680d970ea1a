"""The cwm test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, WINDOW, F, S, Spec

SPEC = Spec(
    "cwm", dict(num_hidden_layers=5, sliding_window=WINDOW, head_dim=24, mlp_bias=True,
                rope_parameters={**LLAMA3, "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5, "rope_scaling": LLAMA3}, old_drop=("layer_types",),
    card=("sliding window 4 on local layers; pattern GLLLG", "head_dim 24", "biases: mlp", "llama3 x8",
          "theta=500000"),
    layer_types=([S, F, S, S, F], ("local", "global", "local", "local", "global")),
    config_variants=({}, dict(num_hidden_layers=5, sliding_window=WINDOW, head_dim=24, mlp_bias=True,
                              rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=16384,
                              rope_parameters={**LLAMA3, "rope_theta": 5e5}),
                     dict(layer_types=[F, F], head_dim=16, num_key_value_heads=1,
                          rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                           "rope_theta": 1e4})))
