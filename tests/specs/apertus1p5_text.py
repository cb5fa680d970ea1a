"""The apertus1p5_text test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, Spec

SPEC = Spec(
    "apertus1p5_text", dict(output_vocab_size=100, attention_bias=True, rope_parameters={**LLAMA3, "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6, "rope_scaling": LLAMA3},
    card=("LM head: the first 100 of 128 ids", "FFN: xIELU (learned alpha_p, alpha_n per layer)",
          "QK norm: per head", "llama3 x8", "biases: q, k, v, o"),
    config_variants=(dict(output_vocab_size=100),
                     dict(output_vocab_size=None, attention_bias=True, hidden_act="relu2", rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0})))
