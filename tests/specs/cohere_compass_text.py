"""The cohere_compass_text test model (see tests/specs/__init__.py): sliding layers with RoPE, full ones with
YaRN; a variant with NoPE full layers as Cohere 2's."""

from __future__ import annotations

from specs import WINDOW, YARN, F, S, Spec

ROPE = {S: {"rope_type": "default", "rope_theta": 5e4, "mrope_section": [4, 2, 2]},
        F: {"rope_type": "yarn", "rope_theta": 1e6, **YARN}}
SPEC = Spec(
    "cohere_compass_text", dict(num_hidden_layers=4, sliding_window=WINDOW, attention_bias=True, logit_scale=0.25,
                                layer_types=[S, S, F, S], bos_token_id=2, eos_token_id=1, rope_parameters=ROPE),
    old_style={}, old_styled=False,  # CohereCompassTextConfig reads no older RoPE keys
    card=("LayerNorm, eps=1e-05, mean/variance written out, weight in fp32", "parallel attn+MLP, shared norm",
          "sliding window 4 on local layers; pattern LLGL", "yarn x4", "local layers: RoPE half, theta=50000",
          "logit scale: 0.25", "embeddings: tied", "biases: q, k, v, o"),
    not_on_card=("QK norm", "q/k rotated in fp32"),
    config_variants=(
        dict(num_hidden_layers=3, layer_types=[S, F, S], sliding_window=6, layer_norm_eps=1e-6,
             tie_word_embeddings=False, rope_parameters={S: {"rope_type": "default", "rope_theta": 1e4}, F: None}),
        dict(layer_types=[F, F], sliding_window=None, logit_scale=None,
             rope_parameters={F: {"rope_type": "linear", "rope_theta": 2e5, "factor": 2.0}}),
    ),
    own_spelling={"rms_norm_eps": "layer_norm_eps"},
    # no RoPE of its own: its rotary embedding needs an entry per layer type (null: none)
    convertible={"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}})
