"""The gpt_neox test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "gpt_neox", dict(eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 2e4,
                                                      "partial_rotary_factor": 0.5}),
    old_style={"rotary_emb_base": 2e4, "rotary_pct": 0.5},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, separate norms",
          "parallel sum: mlp+attn+h", "RoPE half, theta=20000, 0.5 of head_dim", "FFN: GeLU (erf), d_ff 96",
          "biases: q, k, v, o, mlp", "attention: MHA, 4 heads"),
    own_spelling={"rms_norm_eps": "layer_norm_eps"},
    not_a_key=("num_key_value_heads", "head_dim"))
