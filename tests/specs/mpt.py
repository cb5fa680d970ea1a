"""The mpt test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # six heads: MPT's slopes over eight, odd-numbered first
    "mpt", dict(hidden_size=72, num_attention_heads=6, attn_config={"softmax_scale": 0.2, "clip_qkv": 1.5},
                eos_token_id=1), rope=False,
    old_style={"hidden_size": 72, "num_hidden_layers": 2, "num_attention_heads": 6},
    old_drop=("d_model", "n_layers", "n_heads"),
    card=("LayerNorm, eps=1e-05, weight in fp32", "pre-norm", "score scale: 0.2", "q, k, v clamped to +-1.5",
          "positions: ALiBi (MPT's slopes, slope x (k - last k), in fp32) (all layers)",
          "FFN: GeLU (erf), d_ff 288", "biases: none", "embeddings: tied"),
    not_on_card=("RoPE", "embedding norm"),
    tp_refusal="n_heads=6 does not divide by 4 ranks",
    own_spelling={"hidden_size": "d_model", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
                  "max_position_embeddings": "max_seq_len", "rms_norm_eps": "layer_norm_epsilon"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "rope_parameters", "attention_dropout"),
    sdpa=False,  # transformers runs MPT's ALiBi eagerly only
)
