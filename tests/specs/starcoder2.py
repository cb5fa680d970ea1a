"""The starcoder2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, Spec

SPEC = Spec(
    "starcoder2", dict(sliding_window=WINDOW, bos_token_id=2, eos_token_id=1,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
    old_style={"rope_theta": 1e5},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh), d_ff 96",
          "biases: q, k, v, o, mlp", "sliding window 4 on local layers; pattern LL", "embeddings: tied"),
    own_spelling={"rms_norm_eps": "norm_epsilon"})
