"""The glm4 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # sandwich norms on GLM's interleaved partial RoPE and q/k/v biases
    "glm4", dict(head_dim=16, eos_token_id=1,
                 rope_parameters={"rope_type": "default", "rope_theta": 2e4, "partial_rotary_factor": 0.75}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.75},
    card=("sandwich", "SwiGLU", "RoPE interleaved, theta=20000, 0.75 of head_dim", "biases: q, k, v",
          "weight after cast", "embeddings: untied"),
    config_variants=({}, dict(attention_bias=False, head_dim=32, num_key_value_heads=4, tie_word_embeddings=True,
                              hidden_act="gelu", rms_norm_eps=1e-5,
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6,
                                               "partial_rotary_factor": 1.0})),
    gguf={})  # llama.cpp's glm4 holds it whole
