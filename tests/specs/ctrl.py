"""The ctrl test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # sqrt(d) embedding scale, CTRL's sinusoidal halves, the tied head's own bias
    "ctrl", dict(dff=96, eos_token_id=1),
    old_style={"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128},
    old_drop=("n_embd", "n_layer", "n_head", "n_positions"), rope=False,
    card=("LayerNorm, eps=1e-06, bias, weight in fp32", "pre-norm", "FFN: ReLU, d_ff 96",
          "absolute positions: sinusoidal (CTRL: sin half, cos half, 10000^(-2i/d))", "positions: none (all layers)",
          "biases: q, k, v, o, mlp, lm_head", "embeddings: tied", "embedding scale: 8 (a float multiply)"),
    config_variants=({}, dict(tie_word_embeddings=False, embd_pdrop=0.0, resid_pdrop=0.0, dff=200)),
    own_spelling={"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
                  "max_position_embeddings": "n_positions", "rms_norm_eps": "layer_norm_epsilon",
                  "intermediate_size": "dff"},
    not_a_key=("num_key_value_heads", "head_dim", "rope_parameters", "attention_dropout"))
