"""The gemma3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import ATTN_CAP, FINAL_CAP, WINDOW, F, S, Spec

SPEC = Spec(
    "gemma3_text", dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                        sliding_window_pattern=2, attn_logit_softcapping=ATTN_CAP,  # ignored by transformers
                        final_logit_softcapping=FINAL_CAP,
                        rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0},
                                         F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 500000.0}}),
    old_style={"rope_theta": 500000.0, "rope_local_base_freq": 20000.0,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 2},
    old_drop=("layer_types", "_sliding_window_pattern"),
    card=("sandwich", "QK norm: per head", "sliding window 4 on local layers; pattern LGL",
          "local layers: RoPE half, theta=20000", "linear x8", "final-logit soft-cap: 3"),
    not_on_card=("attention soft-cap",),
    layer_types=([F, F, S], ("global", "global", "local")))
