"""The mamba test model (see tests/specs/__init__.py): d_inner 96 (TINY's intermediate_size, which wins
over expand 2), state 16, a dt rank of 6
(not the derived 4), conv 4, biases on in_proj and out_proj, untied embeddings."""

from __future__ import annotations

from specs import Spec

# attention's keys, which MambaConfig does not read
NOT_KEYS = ("num_key_value_heads", "num_attention_heads", "max_position_embeddings",
            "attention_dropout", "rope_parameters", "head_dim")
SPEC = Spec(
    "mamba", dict(state_size=16, expand=2, conv_kernel=4, time_step_rank=6, use_bias=True, layer_norm_epsilon=1e-6,
                  tie_word_embeddings=False, eos_token_id=1),
    old_style={}, old_styled=False, rope=False, sdpa=False,
    card=("mixer: Mamba (selective scan), d_inner 96, state 16, dt rank 6, conv 4", "residual stream in fp32",
          "layer pattern: M M"),
    own_spelling={"rms_norm_eps": "layer_norm_epsilon"}, not_a_key=NOT_KEYS,
    # llama.cpp's mamba loads no in_proj or out_proj biases; its converter asserts d_inner = 2 x hidden_size
    gguf=dict(use_bias=False, intermediate_size=128),
    tp_refusal="the mamba mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(),
        dict(state_size=8, intermediate_size=80, conv_kernel=3, time_step_rank=5, use_bias=True, use_conv_bias=False,
             residual_in_fp32=False, tie_word_embeddings=False, layer_norm_epsilon=1e-6),
    ),
)
