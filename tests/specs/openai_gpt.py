"""The openai-gpt test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # post-norm without a final norm; head_dim 16, whose sqrt is a power of two, as GPT's own 64
    "openai-gpt", dict(num_hidden_layers=3, afn="gelu"),
    old_style={"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 128},
    old_drop=("n_embd", "n_layer", "n_head", "n_positions"), rope=False, sdpa=False,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "post-norm", "FFN: GeLU (tanh, written out), d_ff 256",
          "absolute positions: learned", "positions: none (all layers)", "biases: q, k, v, o, mlp",
          "embeddings: tied"),
    not_on_card=("index offset", "q.k in fp32"),
    config_variants=({}, dict(afn="relu", layer_norm_epsilon=1e-6, tie_word_embeddings=False, embd_pdrop=0.0,
                              resid_pdrop=0.0, attn_pdrop=0.0)),
    own_spelling={"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
                  "max_position_embeddings": "n_positions", "rms_norm_eps": "layer_norm_epsilon",
                  "attention_dropout": "attn_pdrop"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "rope_parameters"))
