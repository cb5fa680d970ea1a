"""The granitemoehybrid test model (see tests/specs/__init__.py): granitemoeshared's, 4 layers, layer 2
attending with RoPE and the others Mamba2 (8 heads x 16 over 2 groups, state 16, conv 4, chunks of 8),
biases on the mixer's projections; dt left unclamped (see specs/mamba2.py). A second model in
config_variants has no positions (position_embedding_type null, transformers' default)."""

from __future__ import annotations

from specs import GgufNaming, Spec

L, A = "linear_attention", "full_attention"
MIXER = dict(mamba_n_heads=8, mamba_d_head=16, mamba_expand=2, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
             mamba_chunk_size=8)
GRANITE = dict(num_local_experts=4, num_experts_per_tok=3, shared_intermediate_size=48, embedding_multiplier=12.0,
               attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0)
SPEC = Spec(  # bf16: see granitemoeshared
    "granitemoehybrid",
    kwargs=dict(MIXER, **GRANITE, num_hidden_layers=4, layer_types=[L, L, A, L], position_embedding_type="rope",
                mamba_proj_bias=True, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4},
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8",
          "mixture of experts: 4 experts, top-3, d_expert 96 (all layers)",
          "shared experts, ungated, width 48, gate and up as one projection's halves", "residual scale: 0.22",
          "layer pattern: MF MF AF MF"),
    # llama.cpp's granitehybrid loads no in_proj or out_proj biases; Granite 4 has no positions (llama.cpp's converter
    # writes it without RoPE whatever the config says: a second model, granitemoehybrid:rope, rotates)
    gguf=dict(mamba_proj_bias=False, position_embedding_type=None),
    gguf_naming=GgufNaming(converter_names={
        ("block_sparse_moe.input_linear.weight", "gate"): "ffn_gate_exps.weight",
        ("block_sparse_moe.input_linear.weight", "up"): "ffn_up_exps.weight",
        ("shared_mlp.input_linear.weight", "gate"): "ffn_gate_shexp.weight",
        ("shared_mlp.input_linear.weight", "up"): "ffn_up_shexp.weight",
        ("mamba.dt_bias", "mixer"): "ssm_dt.bias"}),  # Mamba2Model renames dt_bias
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(MIXER, **GRANITE, layer_types=[L, A], position_embedding_type="rope"),
        dict(MIXER, **GRANITE, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
             mamba_proj_bias=True, mamba_conv_bias=False, time_step_limit=[0.01, 3.0], rms_norm_eps=1e-5,
             attention_bias=True),
    ),
)
