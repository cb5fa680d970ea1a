"""The smollm3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(
    "smollm3", dict(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=WINDOW,
                    attention_bias=True, mlp_bias=True, bos_token_id=2, eos_token_id=1,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6}, old_drop=("layer_types", "no_rope_layers"),
    card=("positions: none (layers [1, 3])", "positions: RoPE half, theta=1e+06 (layers [0, 2])",
          "sliding window 4 on local layers; pattern GLGL", "biases: q, k, v, o, mlp", "embeddings: tied"),
    layer_types=([S, F, F, F], ("local", "global", "global", "global")))
