"""The nanochat test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import FINAL_CAP, Spec

SPEC = Spec(
    "nanochat", dict(attention_bias=True, final_logit_softcapping=FINAL_CAP,
                     rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
    old_style={"rope_theta": 5e4},
    card=("QK norm: per head, after RoPE", "reversed rotation ([x2, -x1])", "no scale", "embedding norm",
          "FFN: squared ReLU", "final-logit soft-cap: 3", "biases: q, k, v, o"),
    config_variants=({}, dict(attention_bias=True, hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=True,
                              final_logit_softcapping=None, num_key_value_heads=2,
                              rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0})))
