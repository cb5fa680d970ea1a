"""The stablelm_qk test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # qk_layernorm: one bias-free LayerNorm per head, stored one tensor per head
    "stablelm", dict(qk_layernorm=True, use_qkv_bias=True, eos_token_id=1,
                     rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.25},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "QK norm: per head, a weight for each head, "
          "no bias", "RoPE half, theta=20000, 0.25 of head_dim", "biases: q, k, v", "embeddings: untied"),
    not_on_card=("parallel",), family="stablelm")
