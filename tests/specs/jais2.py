"""The jais2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, Spec

SPEC = Spec(
    "jais2", dict(head_dim=24, layer_norm_eps=1e-6, rope_parameters={**LLAMA3, "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5, "rope_scaling": LLAMA3},
    card=("LayerNorm, eps=1e-06, bias, weight in fp32", "squared ReLU", "head_dim 24", "biases: q, k, v, o, mlp",
          "llama3 x8"),
    config_variants=({}, dict(head_dim=None, num_key_value_heads=None, attention_bias=False, mlp_bias=False,
                              layer_norm_eps=1e-6, hidden_act="gelu", tie_word_embeddings=True,
                              rope_parameters={**LLAMA3, "rope_theta": 5e5}),
                     dict(head_dim=32, num_key_value_heads=1,
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})),
    gguf=dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}),  # no rope_freqs in jais2
    own_spelling={"rms_norm_eps": "layer_norm_eps"})
