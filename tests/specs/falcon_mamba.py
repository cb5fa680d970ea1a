"""The falcon_mamba test model (see tests/specs/__init__.py): the mamba one, its dt/B/C norms' eps 1e-5."""

from __future__ import annotations

from specs import Spec
from specs.mamba import NOT_KEYS

SPEC = Spec(
    "falcon_mamba", dict(state_size=16, expand=2, conv_kernel=4, time_step_rank=6, use_bias=True,
                         layer_norm_epsilon=1e-6, mixer_rms_eps=1e-5, tie_word_embeddings=False, eos_token_id=1),
    old_style={}, old_styled=False, rope=False, sdpa=False,
    card=("mixer: Mamba (selective scan), d_inner 96, state 16, dt rank 6, conv 4; dt, B, C RMS-normed (no weights, "
          "eps=1e-05)", "residual stream in fp32", "layer pattern: M M"),
    own_spelling={"rms_norm_eps": "layer_norm_epsilon"}, not_a_key=NOT_KEYS,
    # as mamba's; llama.cpp normalises dt, B and C with the model's norm eps
    gguf=dict(use_bias=False, intermediate_size=128, mixer_rms_eps=1e-6),
    tp_refusal="the mamba mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(),
        dict(state_size=8, intermediate_size=80, conv_kernel=3, time_step_rank=5, use_bias=True, use_conv_bias=False,
             residual_in_fp32=False, tie_word_embeddings=False, layer_norm_epsilon=1e-6, mixer_rms_eps=1e-4),
    ),
)
