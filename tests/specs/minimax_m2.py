"""The minimax_m2 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import Spec

MOE = dict(num_local_experts=6, num_experts_per_tok=3)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "minimax_m2",
    kwargs=dict(MOE, head_dim=16, eos_token_id=1, bos_token_id=2,
                rope_parameters={"rope_type": "default", "rope_theta": 2e4, "partial_rotary_factor": 0.5}),
    old_style={"rope_theta": 2e4, "rotary_dim": 8},
    card=("mixture of experts: 6 experts, top-3, d_expert 96 (all layers)", "QK norm: over the whole projection",
          "sigmoid in fp32 then top-k, renormalised, weights in fp32, selection bias", "0.5 of head_dim"),
    config_variants=(dict(MOE, head_dim=16), dict(MOE, head_dim=32, num_key_value_heads=4, rms_norm_eps=1e-5,
                                                   tie_word_embeddings=True,
                                                   rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 1e6, "partial_rotary_factor": 0.25})),
    gguf={},
    tp_refusal="QK norm over the whole projection needs every head's values",
    selection_bias_buffer=True,
)  # llama.cpp's minimax-m2 holds the whole test model
