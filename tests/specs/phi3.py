"""The phi3 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LONGROPE, WINDOW, Spec

SPEC = Spec(  # longrope in its short regime (SEQ < original 64); the long one: test_family_variants
    "phi3", dict(sliding_window=WINDOW, original_max_position_embeddings=64, bos_token_id=2, eos_token_id=1,
                 rope_parameters={**LONGROPE, "rope_type": "longrope", "rope_theta": 2e4,
                                  "partial_rotary_factor": 0.5}),
    old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5,
               "rope_scaling": {**LONGROPE, "type": "su", "original_max_position_embeddings": 64}},
    card=("pre-norm", "SwiGLU", "RoPE half, theta=20000, 0.5 of head_dim, longrope x2 (short factors up to 64 "
          "positions, long beyond; cos/sin x1.08012)", "sliding window 4 on local layers; pattern LL",
          "biases: none", "weight after cast", "embeddings: untied"))
