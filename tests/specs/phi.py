"""The phi test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "phi", dict(qk_layernorm=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 2e4,
                                                                    "partial_rotary_factor": 0.5}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm",
          "parallel sum: attn+mlp+h", "QK norm: per head", "RoPE half, theta=20000, 0.5 of head_dim",
          "FFN: GeLU (tanh, written out), d_ff 96", "biases: q, k, v, o, mlp, lm_head"),
    own_spelling={"rms_norm_eps": "layer_norm_eps"})
