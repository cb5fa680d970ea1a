"""The ernie4_5 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "ernie4_5", dict(use_bias=True, head_dim=16, eos_token_id=1,
                     rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4},
    card=("biases: q, k, v, o, mlp", "RoPE interleaved, theta=20000", "eps=1e-05", "embeddings: tied"),
    config_variants=({}, dict(use_bias=True, head_dim=None, num_key_value_heads=None, tie_word_embeddings=False,
                              rms_norm_eps=1e-6, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 1e6}),
                     dict(head_dim=32, num_key_value_heads=1)),
    gguf=dict(use_bias=False),  # llama.cpp's ernie4_5 loads an o bias only; use_bias switches them all
    not_a_key=("attention_dropout",))
