"""The gpt_neo test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, Spec

SPEC = Spec(
    "gpt_neo", dict(num_hidden_layers=3, attention_types=[[["global", "local"], 1], [["local"], 1]],
                    window_size=WINDOW, intermediate_size=96),
    old_style={"num_hidden_layers": 3, "num_attention_heads": 4}, old_drop=("num_layers", "num_heads"),
    sdpa=False, rope=False, bf16_exact=True,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "sliding window 4 on local layers; pattern GLL",
          "score scale: 1", "q.k in fp32", "FFN: GeLU (tanh, written out), d_ff 96", "absolute positions: learned",
          "biases: o, mlp", "embeddings: tied"),
    not_on_card=("score scale applied to q",),
    own_spelling={"rms_norm_eps": "layer_norm_epsilon"},
    not_a_key=("num_key_value_heads", "head_dim", "rope_parameters"),
    null_is_default=("intermediate_size",))
