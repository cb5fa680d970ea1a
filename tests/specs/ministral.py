"""The ministral test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(
    "ministral", dict(num_hidden_layers=3, sliding_window=WINDOW, head_dim=24, layer_types=[S, F, S],
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("sliding window 4 on local layers; pattern LGL", "head_dim 24", "biases: none", "theta=1e+06"),
    layer_types=([F, S, F], ("global", "local", "global")),
    config_variants=(dict(head_dim=16), dict(head_dim=16, layer_types=[F, F]),
                     dict(num_hidden_layers=3, sliding_window=WINDOW, head_dim=24, layer_types=[F, S, S],
                          rms_norm_eps=1e-5, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                           "original_max_position_embeddings": 32})))
