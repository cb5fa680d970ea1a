"""The llama4_text test model (see tests/specs/__init__.py): 4 layers, RoPE (llama3-scaled, complex pairs) on
layers 0 and 2, none on 1 and 3 (no_rope_layer_interval 2); the RoPE layers attend within chunks of 8 positions
(the 28-token sequences span four chunks) with the weightless L2 QK norm; the NoPE layers scale their queries by
1 + 0.5 log1p(floor((pos + 1) / 8)), which changes at positions 7, 15 and 23; layers 1 and 2 are mixtures of 4
experts (top-3, input-weighted, a shared expert), 0 and 3 dense MLPs of intermediate_size_mlp."""

from __future__ import annotations

from specs import LLAMA3, GgufNaming, Spec

ROPE = {**LLAMA3, "rope_theta": 5e5, "original_max_position_embeddings": 16}
KWARGS = dict(num_hidden_layers=4, head_dim=16, intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4,
              num_experts_per_tok=3, moe_layers=[1, 2], no_rope_layer_interval=2, attention_chunk_size=8,
              floor_scale=8, attn_scale=0.5, rope_parameters=ROPE)
SPEC = Spec(
    "llama4_text", KWARGS,
    old_style={"rope_theta": 5e5, "rope_scaling": {k: v for k, v in ROPE.items() if k != "rope_theta"}},
    card=("chunked local attention: chunks of 8 positions (layers [0, 2])",
          "QK norm: weightless L2 (RMS) per head after RoPE, rotary layers only, eps=1e-05",
          "attention temperature: q x (1 + 0.5 log1p(floor((pos + 1) / 8))), in fp32, layers without positions only",
          "RoPE interleaved", "pairs rotated as fp32 complex products", "llama3 x8", "(layers [0, 2])",
          "positions: none (layers [1, 3])", "mixture of experts: 4 experts, top-3, d_expert 32 (layers [1, 2])",
          "router: top-k on logits then their sigmoids in fp32, not renormalised",
          "experts: router weight multiplies each expert's input, not its output",
          "shared experts, ungated, width 32", "d_ff 96 on dense layers", "biases: none", "eps=1e-05"),
    config_variants=(
        # first: no chunk size, so that a null key means what transformers resolves it to (with a chunk size,
        # transformers-written layer_types name chunked layers, which a null chunk size leaves it unable to run)
        dict(num_hidden_layers=4, head_dim=16, intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4,
             num_experts_per_tok=2, use_qk_norm=False, attn_temperature_tuning=False, attention_bias=True,
             tie_word_embeddings=True, interleave_moe_layer_step=2, no_rope_layers=[1, 0, 0, 1],
             attention_chunk_size=None, rms_norm_eps=1e-6, rope_parameters=ROPE),
        {"num_hidden_layers": 2, "intermediate_size": 32, "intermediate_size_mlp": 96, "num_local_experts": 4,
         "head_dim": 16, "num_key_value_heads": 2},
        dict(KWARGS, layer_types=["chunked_attention", "full_attention", "full_attention", "chunked_attention"],
             moe_layers=[0, 3], num_experts_per_tok=1, floor_scale=4, attn_scale=0.25),
    ),
    # llama.cpp's llama4 hard-codes chunks of 8192 on three layers of four, the fourth without RoPE, with its
    # queries' temperature 0.1 over 8192 positions; it reads the experts' interleave step (layers 1 and 3 here)
    gguf=dict(no_rope_layer_interval=4, attention_chunk_size=8192, floor_scale=8192, attn_scale=0.1,
              moe_layers=None, interleave_moe_layer_step=2),
    # Llama4Model splits gate_up_proj into gate and up and adds `.weight` to the experts' down_proj
    gguf_naming=GgufNaming(converter_names={
        ("feed_forward.experts.gate_up_proj", "gate"): "ffn_gate_exps.weight",
        ("feed_forward.experts.gate_up_proj", "up"): "ffn_up_exps.weight",
        ("feed_forward.experts.down_proj", "down"): "ffn_down_exps.weight"}),
)
