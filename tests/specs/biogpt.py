"""The biogpt test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # sqrt(48) is not a bf16 number: the unrounded embedding scale bites
    "biogpt", dict(hidden_size=48, num_hidden_layers=3, hidden_act="gelu_new"),
    old_style={}, rope=False,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "absolute positions: learned, index offset 2",
          "embedding scale: 6.9282 (a float multiply)", "FFN: GeLU (tanh, written out), d_ff 96",
          "biases: q, k, v, o, mlp", "embeddings: tied"),
    not_on_card=("score scale applied to q",),
    config_variants=({}, dict(scale_embedding=False, tie_word_embeddings=False, hidden_act="relu",
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    own_spelling={"rms_norm_eps": "layer_norm_eps", "attention_dropout": "attention_probs_dropout_prob"},
    not_a_key=("num_key_value_heads", "head_dim", "rope_parameters"))
