"""The gpt2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "gpt2", dict(num_hidden_layers=3, n_inner=96, scale_attn_by_inverse_layer_idx=True),
    old_style={"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 128},
    old_drop=("n_embd", "n_layer", "n_head", "n_positions"), rope=False, bf16_exact=True,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh, written out), d_ff 96",
          "absolute positions: learned", "positions: none (all layers)", "score scale divided by layer index + 1",
          "biases: q, k, v, o, mlp", "embeddings: tied", "linears as Conv1D (addmm over weights held [in, out])"),
    not_on_card=("index offset", "q.k in fp32"),
    own_spelling={"rms_norm_eps": "layer_norm_epsilon", "attention_dropout": "attn_pdrop"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "rope_parameters"),
    gguf_spelling={"intermediate_size": "n_inner"})
