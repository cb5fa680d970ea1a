"""The modernbert-decoder test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

THETAS = {"full_attention": 2e4, "sliding_attention": 5e3}
ROPE = {k: {"rope_type": "default", "rope_theta": t} for k, t in THETAS.items()}

SPEC = Spec(  # every bias on, LayerNorms with biases, 2 sliding : 1 full layers with their own thetas
    "modernbert-decoder", dict(num_hidden_layers=4, local_attention=2 * WINDOW, norm_bias=True, attention_bias=True,
                               mlp_bias=True, classifier_bias=True, eos_token_id=1, bos_token_id=2, cls_token_id=2,
                               sep_token_id=1, rope_parameters=ROPE),
    old_style={"global_rope_theta": 2e4, "local_rope_theta": 5e3}, old_drop=("layer_types",),
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "embedding norm", "gate and up as one fused output",
          "no attention norm on layers [0]",
          "sliding window 4 on local layers; pattern GLLG", "FFN: GeGLU (erf), d_ff 96",
          "RoPE half, theta=20000, q/k rotated in fp32; local layers: RoPE half, theta=5000, q/k rotated in fp32",
          "biases: q, k, v, o, mlp, lm_head", "embeddings: tied",
          "LM-head transform: dense, with a bias, GeLU (erf), norm"),
    layer_types=([F, S, F, S], ("global", "local", "global", "local")),
    config_variants=({}, dict(num_hidden_layers=4, global_attn_every_n_layers=2, local_attention=16, norm_eps=1e-6,
                              hidden_activation="gelu_pytorch_tanh", classifier_activation="silu", decoder_bias=False,
                              tie_word_embeddings=False, embedding_dropout=0.1,
                              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 1e5},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
                     dict(num_hidden_layers=2, layer_types=[F, F])),
    own_spelling={"rms_norm_eps": "norm_eps"},
    not_a_key=("num_key_value_heads", "head_dim"))
