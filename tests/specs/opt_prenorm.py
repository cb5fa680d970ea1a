"""OPT's pre-norm layout (opt-125m and the larger ones): its `final_layer_norm` runs on the hidden
states flattened to (B*T, d), which verify must declare (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(
    "opt", dict(hidden_size=80, num_hidden_layers=3, ffn_dim=96, do_layer_norm_before=True),
    old_style={}, rope=False, family="opt",
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "score scale applied to q before q.k",
          "absolute positions: learned, index offset 2", "FFN: ReLU, d_ff 96", "biases: q, k, v, o, mlp",
          "embeddings: tied"))
