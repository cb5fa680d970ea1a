"""The ministral3 test model (see tests/specs/__init__.py): YaRN over 8 original positions, so the
28-token sequences reach floor(pos / 8) = 3 and the query scale (beta 0.1, the published one) bites on every layer."""

from __future__ import annotations

from specs import WINDOW, Spec

ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8,
        "llama_4_scaling_beta": 0.1}
SPEC = Spec(
    "ministral3", dict(sliding_window=WINDOW, head_dim=24, max_position_embeddings=32, rope_parameters=ROPE),
    old_style={"rope_theta": 1e6, "rope_scaling": {k: v for k, v in ROPE.items() if k != "rope_theta"}},
    card=("attention temperature: q x (1 + 0.1 log(1 + floor(pos / 8)))", "sliding window 4 on local layers",
          "yarn x4", "head_dim 24", "biases: none", "eps=1e-05"),
    # (not the class defaults: their rope_parameters also state `type` and `max_position_embeddings`, which
    # transformers ignores; test_missing_keys_take_transformers_defaults reads them)
    config_variants=(
        dict(head_dim=16, sliding_window=None, tie_word_embeddings=True, rope_parameters=ROPE),
        dict(head_dim=8, sliding_window=WINDOW, rms_norm_eps=1e-6,
             rope_parameters={"rope_type": "default", "rope_theta": 5e5, "llama_4_scaling_beta": 0.25,
                              "original_max_position_embeddings": 6}),
        dict(max_position_embeddings=64, rope_parameters={**ROPE, "llama_4_scaling_beta": 0.0}),
    ),
    # llama.cpp's mistral3 has no window; mscale and mscale_all_dim as published (llama.cpp takes mscale as 1)
    gguf=dict(sliding_window=None, rope_parameters={**ROPE, "mscale": 1.0, "mscale_all_dim": 1.0}))
