"""The codegen test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

# head_dim 44 with 30 rotary dims, as gptj's; 176 = 4 shards of 44
SPEC = Spec(  # q.k in fp32: our layers run eager under either backend, so compared with transformers' eager
    "codegen", dict(hidden_size=176, rotary_dim=30, n_inner=80, eos_token_id=1), sdpa=False, rope=False,
    old_style={"hidden_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
               "max_position_embeddings": 128},
    old_drop=("n_embd", "n_layer", "n_head", "n_positions"),
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm",
          "parallel sum: attn+mlp+h", "RoPE interleaved, theta=10000, 30 rotary dims", "q.k in fp32",
          "FFN: GeLU (tanh, written out), d_ff 80", "biases: mlp, lm_head", "embeddings: untied"),
    config_variants=(dict(rotary_dim=16), dict(rotary_dim=8, n_inner=80, layer_norm_epsilon=1e-6,
                                               activation_function="relu", resid_pdrop=0.1, embd_pdrop=0.1,
                                               attn_pdrop=0.1)),
    own_spelling={"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
                  "max_position_embeddings": "n_positions", "rms_norm_eps": "layer_norm_epsilon",
                  "attention_dropout": "attn_pdrop"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "rope_parameters"))
