"""The cohere2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

SPEC = Spec(
    "cohere2", dict(num_hidden_layers=4, sliding_window=WINDOW, attention_bias=True, logit_scale=0.25,
                    bos_token_id=2, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
    old_style={"rope_theta": 5e4, "sliding_window_pattern": 4}, old_drop=("layer_types",),
    card=("LayerNorm, eps=1e-05, mean/variance written out, weight in fp32", "parallel attn+MLP, shared norm",
          "sliding window 4 on local layers; pattern LLLG", "positions: none (layers [3])",
          "positions: RoPE interleaved, theta=50000, q/k rotated in fp32 (layers [0, 1, 2])",
          "logit scale: 0.25", "embeddings: tied"),
    not_on_card=("QK norm",),
    layer_types=([F, S, S, F], ("global", "local", "local", "global")),
    own_spelling={"rms_norm_eps": "layer_norm_eps"})
