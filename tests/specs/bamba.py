"""The bamba test model (see tests/specs/__init__.py): 4 layers, layer 1 attending and the others Mamba2
(8 heads x 16 over 2 groups, state 16, conv 4, chunks of 8: the 28-token sequences run three chunks and a
partial fourth), biases on the mixer's projections, half the head rotated. dt is left unclamped
(time_step_limit (0, inf)): transformers clamps it in the chunked prefill only (see specs/mamba2.py)."""

from __future__ import annotations

from specs import GgufNaming, Spec

MIXER = dict(mamba_n_heads=8, mamba_d_head=16, mamba_expand=2, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
             mamba_chunk_size=8)
THETA = {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}
SPEC = Spec(
    "bamba", dict(MIXER, num_hidden_layers=4, attn_layer_indices=[1], mamba_proj_bias=True, eos_token_id=1,
                  rope_parameters=THETA),
    old_style={"rope_theta": 5e5},
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8",
          "layer pattern: MF AF MF MF", "biases: in_proj, conv, out_proj"),
    # llama.cpp's granitehybrid loads no in_proj or out_proj biases and rotates whole heads
    gguf=dict(mamba_proj_bias=False, rope_parameters={**THETA, "partial_rotary_factor": 1.0}),
    gguf_naming=GgufNaming(converter_names={("mamba.dt_bias", "mixer"): "ssm_dt.bias"}),  # Mamba2Model renames dt_bias
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(MIXER, attn_layer_indices=[1]),
        dict(MIXER, num_hidden_layers=3, attn_layer_indices=[0, 2], mamba_proj_bias=True, mamba_conv_bias=False,
             time_step_limit=[0.01, 3.0], mamba_n_groups=4, rms_norm_eps=1e-6, attention_bias=True, mlp_bias=True,
             tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 1.0}),
    ),
)
