"""The gpt_bigcode_mha test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # multi_query false: c_attn head by head, [q_h; k_h; v_h]; unscaled scores
    "gpt_bigcode", dict(multi_query=False, scale_attn_weights=False, eos_token_id=1, n_inner=96),
    old_style={"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128},
    old_drop=("n_embd", "n_layer", "n_head", "n_positions"), rope=False, family="gpt_bigcode",
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh), d_ff 96",
          "attention: MHA, 4 heads", "biases: q, k, v, o, mlp", "embeddings: tied"))
