"""The exaone test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, Spec

SPEC = Spec(  # EXAONE 3.x: llama under the original names; the old style is the released files' spelling
    "exaone", dict(attention_bias=True, mlp_bias=True, eos_token_id=1,
                   rope_parameters={**LLAMA3, "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6, "rope_scaling": LLAMA3, "num_layers": 2, "layer_norm_epsilon": 1e-5,
               "activation_function": "silu"},
    old_drop=("num_hidden_layers", "rms_norm_eps", "hidden_act"),
    card=("pre-norm", "SwiGLU", "biases: q, k, v, o, mlp", "llama3 x8", "eps=1e-05", "weight after cast",
          "embeddings: untied"),
    config_variants=({}, dict(attention_bias=True, mlp_bias=True, rms_norm_eps=1e-6, hidden_act="gelu",
                              head_dim=32, num_key_value_heads=1, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 32, "rope_theta": 1e4})),
    gguf=dict(attention_bias=False, mlp_bias=False))  # llama.cpp's exaone loads no o or MLP bias
