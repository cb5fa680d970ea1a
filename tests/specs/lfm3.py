"""The lfm3 test model (see tests/specs/__init__.py): convolution (biases on, the default width of 7), sliding
attention (window 4, RoPE at theta 2e4) and full attention ("proportional" RoPE over half of each head), the
per-head output gate and the sandwich norms on, biases on the attention too."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

C = "conv"
ROPE = {S: {"rope_type": "default", "rope_theta": 2e4},
        F: {"rope_type": "proportional", "rope_theta": 5e5, "partial_rotary_factor": 0.5}}
SPEC = Spec(
    "lfm3", dict(num_hidden_layers=5, layer_types=[C, S, F, C, S], head_dim=16, sliding_window=WINDOW,
                 conv_bias=True, attention_bias=True, eos_token_id=1, bos_token_id=0, pad_token_id=0,
                 rope_parameters=ROPE),
    old_style={}, old_styled=False,  # Lfm3Config sets its nested rope_parameters before reading any older key
    card=("placement: sandwich norm (pre + post)", "QK norm: per head",
          "attention output gate: sigmoid(a projection of the input, one per head) times each head's output",
          "short convolution (LFM2): in_proj to B, C, x (3 x 64); B*x through a depthwise causal conv of width 7",
          "layer schedule: attention on 3 (1-2, 4); short_conv on 2 (0, 3); FFN on all layers",
          "sliding window 4 on local layers; pattern GLGGL",
          "positions: RoPE half, theta=500000, 0.5 of head_dim, proportional x1; local layers: RoPE half, "
          "theta=20000", "biases: q, k, v, o", "embeddings: tied"),
    own_spelling={"rms_norm_eps": "norm_eps"},
    tp_refusal="the short_conv mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(head_dim=16, num_hidden_layers=6),  # the default schedule, RoPE, gate and sandwich norms
        dict(head_dim=16, num_hidden_layers=4, layer_types=[F, C, S, C], sliding_window=6, conv_L_cache=3,
             conv_bias=True, attention_bias=True, norm_eps=1e-6, tie_word_embeddings=False,
             use_attention_gate=False, use_sandwich_norm=False,
             rope_parameters={S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                              F: {"rope_type": "default", "rope_theta": 5e4}}),
    ),
)
