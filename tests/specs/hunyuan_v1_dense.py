"""The hunyuan_v1_dense test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

# HunYuan's NTK-alpha RoPE as its checkpoints spell it ("dynamic" with an alpha): a static base
NTK_ALPHA = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 1.0, "alpha": 1000.0}

SPEC = Spec(
    "hunyuan_v1_dense", dict(head_dim=16, attention_bias=True, rope_parameters=NTK_ALPHA),
    old_style={"rope_theta": 1e4, "rope_scaling": {"type": "dynamic", "factor": 1.0, "alpha": 1000.0}},
    card=("QK norm: per head, after RoPE", "NTK alpha 1000: static base", "biases: q, k, v, o", "eps=1e-05"),
    config_variants=(dict(head_dim=16), dict(head_dim=32, attention_bias=True, rms_norm_eps=1e-6,
                                             tie_word_embeddings=True, rope_parameters=NTK_ALPHA),
                     dict(head_dim=16, rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0})),
    # llama.cpp holds NTK alpha as its static base (tests/test_hunyuan.py), which reads back as plain RoPE
    gguf=dict(attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
