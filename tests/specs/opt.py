"""The opt test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # the opt-350m layout: post-norm, 48-wide embeddings projected in and out; head_dim 20, whose
    # scale is no power of two, so scaling q rather than q.k bites in bf16
    "opt", dict(hidden_size=80, num_hidden_layers=3, ffn_dim=96, do_layer_norm_before=False,
                word_embed_proj_dim=48),
    old_style={}, rope=False, bf16_exact=True,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "post-norm", "score scale applied to q before q.k",
          "absolute positions: learned, index offset 2", "embedding width 48, projected in and out of d_model 80",
          "FFN: ReLU, d_ff 96", "biases: q, k, v, o, mlp", "embeddings: tied"),
    own_spelling={"intermediate_size": "ffn_dim"},
    not_a_key=("num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters"))
