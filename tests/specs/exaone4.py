"""The exaone4 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, WINDOW, F, S, Spec

SPEC = Spec(  # 3 sliding layers with RoPE : 1 full layer without positions, llama3-scaled RoPE as the releases
    "exaone4", dict(num_hidden_layers=4, sliding_window=WINDOW, eos_token_id=1,
                    rope_parameters={**LLAMA3, "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6, "rope_scaling": LLAMA3}, old_drop=("layer_types",),
    card=("norm on sublayer output only", "QK norm: per head", "eps=1e-05", "weight after cast",
          "sliding window 4 on local layers; pattern LLLG", "positions: none (layers [3])",
          "positions: RoPE half, theta=1e+06, llama3 x8 (layers [0, 1, 2])", "biases: none", "embeddings: untied"),
    layer_types=([F, S, S, F], ("global", "local", "local", "global")),
    config_variants=(dict(num_hidden_layers=4, layer_types=[S, S, S, F]),
                     dict(num_hidden_layers=4, sliding_window=WINDOW, layer_types=[S, F, S, F], rms_norm_eps=1e-6,
                          sliding_window_pattern="LFLF",
                          head_dim=32, tie_word_embeddings=True, hidden_act="gelu",
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
                     dict(num_hidden_layers=4, sliding_window=None, layer_types=[F, F, F, F])),
    gguf=dict(sliding_window=None, layer_types=[F] * 4))  # llama.cpp's exaone4 below 64 layers: no window
