"""The gpt_bigcode test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # multi_query, as StarCoder: one K/V head; gpt_bigcode_mha has the head-by-head layout
    "gpt_bigcode", dict(num_hidden_layers=3, n_inner=96, eos_token_id=1, activation_function="gelu_new"),
    old_style={"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 128},
    old_drop=("n_embd", "n_layer", "n_head", "n_positions"), rope=False,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh, written out), d_ff 96",
          "absolute positions: learned", "attention: MQA", "biases: q, k, v, o, mlp", "embeddings: tied"),
    not_on_card=("index offset", "q.k in fp32"),
    config_variants=({}, dict(multi_query=False, scale_attn_weights=False, n_inner=80, layer_norm_epsilon=1e-6,
                              activation_function="relu", tie_word_embeddings=False, embd_pdrop=0.0,
                              resid_pdrop=0.0, attn_pdrop=0.0)),
    gguf=dict(activation_function="gelu_pytorch_tanh"),  # llama.cpp's starcoder: the tanh GELU
    own_spelling={"rms_norm_eps": "layer_norm_epsilon", "attention_dropout": "attn_pdrop"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "rope_parameters"))
