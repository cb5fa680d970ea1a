"""The xglm test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

SPEC = Spec(  # sqrt(48) is not a bf16 number: the unrounded embedding scale bites
    "xglm", dict(hidden_size=48, num_hidden_layers=3, ffn_dim=96),
    old_style={"hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4},
    old_drop=("d_model", "num_layers", "attention_heads"), sdpa=False, rope=False, bf16_exact=True,
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm",
          "absolute positions: sinusoidal (fairseq: sin half, cos half), index offset 2",
          "embedding scale: 6.9282 (a float multiply)",
          "score scale applied to q before q.k", "FFN: GeLU (erf), d_ff 96", "biases: q, k, v, o, mlp"),
    own_spelling={"intermediate_size": "ffn_dim"},
    not_a_key=("num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters"))
