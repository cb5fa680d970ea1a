"""The granite_swa test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, GgufNaming, S, Spec

# layer 0 full with a theta of its own, 1 and 3 sliding with another, 2 sliding with no positions
THETAS = [5e5, 1e4, 0.0, 1e4]

# transformers scales each head's output by sigmoid(logsumexp(scores) - sink), after the softmax and the product
# with v; the decoder's sink is gpt-oss's extra softmax column, the same function in another op order: fp32 points
# differ by rounding (~1e-6), and bf16 is not bit for bit
SPEC = Spec(
    "granite_swa",
    dict(num_hidden_layers=4, sliding_window=WINDOW, layer_rope_theta=THETAS, embedding_multiplier=10.3,
         attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0, attention_bias=True,
         mlp_bias=True, bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4}, old_drop=("layer_types",),
    card=("attention sinks: a learned logit per head in each softmax (eager), as an output scale "
          "sigmoid(logsumexp - sink)", "sliding window 4 on local layers; pattern GLLL",
          "positions: none (layers [2])",
          "positions: RoPE half, theta=500000; local layers: RoPE half, theta=10000 (layers [0, 1, 3])",
          "residual scale: 0.22", "score scale: 0.0625", "embedding scale: 10.3", "logit scale: 0.125",
          "biases: q, k, v, o, mlp", "embeddings: tied"),
    layer_types=([S, F, S, F], ("local", "global", "local", "global")),
    sdpa=False,  # GraniteSWAPreTrainedModel._supports_sdpa is False: its sinks need its own eager attention
    # llama.cpp's granite_swa rotates every rotating layer with one RoPE base: one theta, and layer 2 unrotated
    gguf=dict(layer_rope_theta=[1e4, 1e4, 0.0, 1e4]),
    # GraniteSWAModel (llama.cpp's converter) adds `.weight` to the sinks
    gguf_naming=GgufNaming(converter_names={("self_attn.sinks", "attn"): "attn_sinks.weight"}),
    config_variants=({}, dict(num_hidden_layers=4, sliding_window=WINDOW, layer_rope_theta=[0, 1e4, 1e4, 1e4],
                              attention_multiplier=0.25,
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})),
)
