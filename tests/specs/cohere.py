"""The cohere test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "cohere", dict(use_qk_norm=True, attention_bias=True, logit_scale=0.25, bos_token_id=2, eos_token_id=1,
                   rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4},
    card=("LayerNorm, eps=1e-05, mean/variance written out, weight in fp32", "parallel attn+MLP, shared norm",
          "QK norm: per head, a weight for each head", "RoPE interleaved, theta=20000, q/k rotated in fp32",
          "logit scale: 0.25", "biases: q, k, v, o", "embeddings: tied"),
    not_on_card=("bias, weight", "sliding"),
    own_spelling={"rms_norm_eps": "layer_norm_eps"})
