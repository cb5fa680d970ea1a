"""The falcon test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # Falcon-40B/180B's layout; the 7B, RW and sequential ones are in test_parallel_alibi.py
    "falcon", dict(new_decoder_architecture=True, num_kv_heads=2, eos_token_id=1,
                   rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, separate norms",
          "parallel sum: mlp+attn+h", "GQA (2 q heads per kv head)", "RoPE half, theta=20000",
          "FFN: GeLU (erf), d_ff 256", "biases: none", "embeddings: tied"))
