"""The arcee test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, Spec

SPEC = Spec(
    "arcee", dict(attention_bias=True, mlp_bias=True, rope_parameters={**LLAMA3, "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5, "rope_scaling": LLAMA3},
    card=("pre-norm", "FFN: squared ReLU, d_ff 96", "biases: q, k, v, o, mlp", "llama3 x8", "eps=1e-05",
          "weight after cast"),
    not_on_card=("SwiGLU",),
    config_variants=({}, dict(attention_bias=True, mlp_bias=True, rms_norm_eps=1e-6, hidden_act="relu",
                              head_dim=32, num_key_value_heads=1, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 32, "rope_theta": 1e6})),
    gguf=dict(attention_bias=False, mlp_bias=False))  # llama.cpp's arcee loads no biases
