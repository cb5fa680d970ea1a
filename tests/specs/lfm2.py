"""The lfm2 test model (see tests/specs/__init__.py): a hybrid whose first layer convolves, biases on
the convolution, a kernel of 4 (so the state is wider than transformers' default of 3), and the FFN
width derived (int(2/3 x 96) x 1.5, a multiple of 32: 96)."""

from __future__ import annotations

from specs import F, Spec

C = "conv"
THETA = {"rope_type": "default", "rope_theta": 5e5}
SPEC = Spec(
    "lfm2", dict(num_hidden_layers=4, layer_types=[C, F, C, C], conv_bias=True, conv_L_cache=4,
                 block_multiple_of=32, block_ffn_dim_multiplier=1.5, eos_token_id=1, rope_parameters=THETA),
    # transformers 4's files name the attention layers, spell the FFN width and the tying their older way
    old_style={"rope_theta": 5e5, "full_attn_idxs": [1], "block_ff_dim": 96, "tie_embedding": True},
    old_drop=("layer_types", "intermediate_size", "tie_word_embeddings"),
    card=("short convolution (LFM2): in_proj to B, C, x (3 x 64); B*x through a depthwise causal conv of width 4",
          "layer schedule: attention on 1 (1); short_conv on 3 (0, 2-3); FFN on all layers",
          "layer pattern: MF AF MF MF", "QK norm: per head", "FFN: SwiGLU, d_ff 96", "embeddings: tied",
          "decoding state: 64 entries per token (KV cache, 1 layer of attention) + 768 entries per sequence",
          "mixer state       3,072 bytes per sequence (float32)"),
    own_spelling={"rms_norm_eps": "norm_eps"}, not_a_key=("attention_dropout",),
    gguf=dict(conv_bias=False),  # llama.cpp's lfm2 loads no convolution biases
    tp_refusal="the short_conv mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(block_auto_adjust_ff_dim=False),  # export writes the width itself, so the derived one cannot come back
        dict(block_auto_adjust_ff_dim=False, layer_types=[C, F], conv_bias=True, conv_L_cache=5, norm_eps=1e-6,
             tie_word_embeddings=False, rope_parameters=THETA),
    ),
)
