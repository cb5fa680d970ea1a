"""The nemotron_h test model (see tests/specs/__init__.py): five single-mixer blocks, Mamba2, MLP,
attention, MLP, Mamba2 (M-*-M); Mamba2 of 8 heads x 16 over 2 groups, state 16, conv 4, chunks of 8,
biases on its projections; dt left unclamped (see specs/mamba2.py); the MLP ungated relu2 with biases."""

from __future__ import annotations

from specs import GgufNaming, Spec

M, A, P = "linear_attention", "full_attention", "mlp"
MIXER = dict(mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=8,
             head_dim=16)
SPEC = Spec(
    "nemotron_h", dict(MIXER, layers_block_type=[M, P, A, P, M], use_bias=True, mlp_bias=True, eos_token_id=1),
    old_style={"hybrid_override_pattern": "M-*-M"}, old_drop=("layers_block_type",), rope=False,
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8", "layer pattern: M -F A -F M",
          "weight in fp32", "FFN: squared ReLU, d_ff 96", "positions: none (all layers)"),
    not_a_key=("rope_parameters", "num_hidden_layers"),
    convertible={"layers_block_type": [M, A, P]},  # transformers' default pattern has a MoE block
    own_spelling={"rms_norm_eps": "layer_norm_epsilon"},
    gguf=dict(use_bias=False),  # llama.cpp's nemotron_h loads no in_proj or out_proj biases
    # Mamba2Model renames dt_bias; NemotronHModel stacks a MoE block's experts under transformers 5's mlp.experts names
    gguf_naming=GgufNaming(converter_names={("mixer.dt_bias", "mixer"): "ssm_dt.bias",
                                            **{(f"mixer.experts.1.{n}_proj.weight", n): f"ffn_{n}_exps.weight"
                                               for n in ("up", "down")}}),
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(MIXER, layers_block_type=[M, A, P]),
        dict(MIXER, layers_block_type=[A, P, M, P], use_bias=True, use_conv_bias=False, mlp_bias=True,
             time_step_limit=[0.01, 3.0], n_groups=4, layer_norm_epsilon=1e-6, mlp_hidden_act="silu",
             tie_word_embeddings=True, num_attention_heads=8, num_key_value_heads=4),
    ),
)
