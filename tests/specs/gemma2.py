"""The gemma2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import ATTN_CAP, FINAL_CAP, WINDOW, F, S, Spec

SPEC = Spec(
    "gemma2", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24, attention_bias=True,
                   attn_logit_softcapping=ATTN_CAP, final_logit_softcapping=FINAL_CAP),
    old_style={"rope_theta": 10000.0}, old_drop=("layer_types",),
    card=("sandwich", "scale (w + 1)", "weight in fp32", "attention soft-cap: 2", "final-logit soft-cap: 3",
          "sliding window 4 on local layers; pattern LG", "GeGLU (tanh)", "embedding scale: 8",
          "score scale: 0.204124"),
    layer_types=([F, S], ("global", "local")),
    sdpa=False)  # transformers refuses SDPA for its soft-capped scores
