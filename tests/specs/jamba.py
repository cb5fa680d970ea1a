"""The jamba test model (see tests/specs/__init__.py): Jamba's own layout scaled to 4 layers, layer 2
attending (period 4, offset 2; Jamba's is 8 and 4) and the others Mamba (d_inner 128, state 16, dt
rank 6, conv 4, biases on its projections); experts on layers 1 and 3 (period 2, offset 1, Jamba's),
4 of them, top 2; the others dense. transformers has no SDPA path for Jamba: our SDPA is compared with
its eager attention (3.6e-6 apart in fp32; with two attention layers of four, 1.2e-5)."""

from __future__ import annotations

from specs import Spec

SCHEDULE = dict(attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2, expert_layer_offset=1)
SPEC = Spec(
    "jamba", dict(SCHEDULE, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, mamba_dt_rank=6,
                  mamba_proj_bias=True, eos_token_id=1),
    old_style={}, rope=False,
    card=("mixer: Mamba (selective scan), d_inner 128, state 16, dt rank 6, conv 4; dt, B, C RMS-normed (weights, "
          "eps=1e-06)", "mixture of experts: 4 experts, top-2", "layer pattern: MF MF AF MF"),
    not_a_key=("rope_parameters", "attention_bias"),
    # llama.cpp's jamba loads no in_proj or out_proj biases
    gguf=dict(mamba_proj_bias=False),
    tp_refusal="the mamba mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(SCHEDULE, num_hidden_layers=4, num_experts=4),
        dict(num_hidden_layers=6, attn_layer_period=3, attn_layer_offset=2, expert_layer_period=3,
             expert_layer_offset=1, num_experts=4, num_experts_per_tok=3, mamba_d_state=8, mamba_d_conv=3,
             mamba_expand=3, mamba_dt_rank=5, mamba_conv_bias=False, mamba_proj_bias=True, rms_norm_eps=1e-5,
             tie_word_embeddings=True),
    ),
)
