"""The gpt_neox_japanese test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # partial RoPE, the o bias of the last layer only, an MLP width of 2 x hidden_size
    "gpt_neox_japanese", dict(num_hidden_layers=3, intermediate_multiple_size=2, eos_token_id=1, bos_token_id=2,
                              tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 2e4,
                                               "partial_rotary_factor": 0.5}),
    old_style={"rotary_emb_base": 2e4, "rotary_pct": 0.5}, sdpa=False,  # transformers has its own attention only
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "RoPE half, theta=20000, 0.5 of head_dim",
          "FFN: GeLU (erf), d_ff 128", "biases: o (layers [2])", "score scale inside q.k's product (baddbmm)",
          "linear biases added after the matmul", "attention: MHA, 4 heads", "embeddings: untied"),
    config_variants=({}, dict(intermediate_multiple_size=3, layer_norm_eps=1e-6, hidden_act="gelu_new",
                              num_attention_heads=8, attention_dropout=0.0, hidden_dropout=0.1,
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                               "partial_rotary_factor": 1.0})),
    own_spelling={"rms_norm_eps": "layer_norm_eps", "intermediate_size": "intermediate_multiple_size"},
    not_a_key=("num_key_value_heads", "head_dim"))
