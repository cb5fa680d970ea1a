"""The apertus test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, Spec

SPEC = Spec(
    "apertus", dict(attention_bias=True, rope_parameters={**LLAMA3, "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6, "rope_scaling": LLAMA3},
    card=("FFN: xIELU (learned alpha_p, alpha_n per layer)", "QK norm: per head", "llama3 x8", "eps=1e-05",
          "biases: q, k, v, o"),
    config_variants=({}, dict(attention_bias=True, hidden_act="relu2", rms_norm_eps=1e-6, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
                     dict(rope_parameters={**LLAMA3, "rope_theta": 5e5})))
