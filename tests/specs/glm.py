"""The glm test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

LINEAR = {"rope_type": "linear", "factor": 2.0}

SPEC = Spec(  # a partial RoPE other than the default half, scaled, and GLM's q/k/v biases without an o bias
    "glm", dict(head_dim=16, eos_token_id=1,
                rope_parameters={**LINEAR, "rope_theta": 2e4, "partial_rotary_factor": 0.75}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.75, "rope_scaling": LINEAR},
    card=("pre-norm", "SwiGLU", "RoPE interleaved, theta=20000, 0.75 of head_dim, linear x2", "biases: q, k, v",
          "weight after cast", "embeddings: untied"),
    config_variants=({}, dict(attention_bias=False, head_dim=32, num_key_value_heads=4, tie_word_embeddings=True,
                              hidden_act="gelu", rms_norm_eps=1e-5,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                               "original_max_position_embeddings": 32, "partial_rotary_factor": 1.0})),
    gguf={})  # llama.cpp's chatglm holds it whole
