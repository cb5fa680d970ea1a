"""The mamba2 test model (see tests/specs/__init__.py): 8 heads x 16 over 2 groups, state 16, conv 4,
chunks of 8 (the 28-token sequences run three chunks and a partial fourth), biases on in_proj and
out_proj. dt is left unclamped (time_step_limit (0, inf), transformers' default): transformers clamps
it in the chunked prefill only, so a clamp that bites makes its own cached decoding differ from its
full forward (tests/test_mamba.py holds both paths, clamped, to transformers')."""

from __future__ import annotations

from specs import GgufNaming, Spec

# attention's and the FFN's keys, which Mamba2Config does not read
NOT_KEYS = ("num_key_value_heads", "num_attention_heads", "intermediate_size", "max_position_embeddings",
            "attention_dropout", "rope_parameters")
MIXER = dict(num_heads=8, head_dim=16, expand=2, state_size=16, n_groups=2, conv_kernel=4, chunk_size=8)
SPEC = Spec(
    "mamba2", dict(MIXER, use_bias=True, layer_norm_epsilon=1e-6, eos_token_id=1),
    old_style={}, old_styled=False, rope=False, sdpa=False,
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8",
          "residual stream in fp32", "layer pattern: M M", "biases: in_proj, conv, out_proj"),
    own_spelling={"rms_norm_eps": "layer_norm_epsilon"}, not_a_key=NOT_KEYS,
    # llama.cpp's mamba2 loads no in_proj or out_proj biases; its converter reads a stated intermediate_size (the
    # tiny models' 96, kept by Mamba2Config though unused) as d_inner: stated as d_inner here
    gguf=dict(use_bias=False, intermediate_size=128),
    gguf_naming=GgufNaming(converter_names={("mixer.dt_bias", "mixer"): "ssm_dt.bias"}),  # Mamba2Model renames it
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(MIXER),
        dict(MIXER, use_bias=True, use_conv_bias=False, residual_in_fp32=False, tie_word_embeddings=True,
             time_step_limit=[0.01, 3.0], layer_norm_epsilon=1e-6, n_groups=4),
    ),
)
