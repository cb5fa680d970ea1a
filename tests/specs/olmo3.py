"""The olmo3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, YARN, F, S, Spec

SPEC = Spec(  # YaRN on the full layers with their own theta, as the long-context releases; sliding layers at 5e5
    "olmo3", dict(num_hidden_layers=4, sliding_window=WINDOW, attention_bias=True, eos_token_id=1,
                  rope_parameters={S: {"rope_type": "default", "rope_theta": 5e5},
                                   F: {**YARN, "rope_type": "yarn", "rope_theta": 2e4}}),
    old_style={"rope_theta": 2e4, "rope_scaling": {**YARN, "rope_type": "yarn"}}, old_drop=("layer_types",),
    card=("norm on sublayer output only", "QK norm: over the whole projection", "eps=1e-05", "weight in fp32",
          "biases: q, k, v, o", "sliding window 4 on local layers; pattern LLLG",
          "local layers: RoPE half, theta=500000", "yarn x4"),
    layer_types=([F, S, S, F], ("global", "local", "local", "global")),
    config_variants=(dict(num_hidden_layers=4),
                     dict(num_hidden_layers=4, sliding_window=WINDOW, attention_bias=True, rms_norm_eps=1e-6,
                          tie_word_embeddings=True, num_key_value_heads=1, hidden_act="gelu",
                          rope_parameters={S: {"rope_type": "default", "rope_theta": 1e4},
                                           F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}),
                     dict(num_hidden_layers=3, layer_types=[S, F, S], sliding_window=WINDOW)),
    # llama.cpp's olmo2 rotates the sliding layers with the full layers' theta (unscaled); it loads no o bias
    gguf=dict(attention_bias=False, rope_parameters={S: {"rope_type": "default", "rope_theta": 5e5},
                                                         F: {**YARN, "rope_type": "yarn", "rope_theta": 5e5}}),
    tp_refusal="QK norm over the whole projection needs every head's values",
)
