"""The bloom test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import GgufNaming, Spec

SPEC = Spec(  # six heads: ALiBi's interleaved extra slopes
    "bloom", dict(hidden_size=72, num_attention_heads=6, apply_residual_connection_post_layernorm=True,
                  eos_token_id=1), rope=False,
    old_style={"num_hidden_layers": 2, "num_attention_heads": 6}, old_drop=("n_layer", "n_head"),
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "residual taken after the norm",
          "embedding norm", "positions: ALiBi (BLOOM's: slope x k, inside the score matmul) (all layers)",
          "FFN: GeLU (tanh, BLOOM's constants), d_ff 288", "biases: q, k, v, o, mlp", "embeddings: tied"),
    not_on_card=("RoPE",),
    tp_refusal="n_heads=6 does not divide by 4 ranks",
    own_spelling={"num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
                  "rms_norm_eps": "layer_norm_epsilon"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings", "rope_parameters"),
    sdpa=False,  # transformers runs BLOOM's ALiBi eagerly only
    gguf_naming=GgufNaming(stripped="transformer."),  # BloomModel's converter names without it
)
