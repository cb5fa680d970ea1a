"""The granitemoe_swa test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, GgufNaming, S, Spec

KWARGS = dict(num_hidden_layers=4, sliding_window=WINDOW, layer_rope_theta=[0, 2e4, 2e4, 0], num_local_experts=4,
              num_experts_per_tok=3, shared_intermediate_size=48, embedding_multiplier=12.0,
              attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0, attention_bias=True,
              rope_parameters={"rope_type": "default", "rope_theta": 2e4})

# as granite_swa's: transformers' sink is an output scale sigmoid(logsumexp(scores) - sink), the decoder's gpt-oss's
# extra softmax column, the same function in another op order (fp32 points differ by rounding, bf16 not bit for bit)
SPEC = Spec(
    "granitemoe_swa", KWARGS,
    old_style={"rope_theta": 2e4}, old_drop=("layer_types",),
    card=("attention sinks: a learned logit per head in each softmax (eager), as an output scale "
          "sigmoid(logsumexp - sink)", "sliding window 4 on local layers; pattern GLLL",
          "positions: none (layers [0, 3])", "positions: RoPE half, theta=20000 (layers [1, 2])",
          "mixture of experts: 4 experts, top-3, d_expert 96 (all layers)",
          "router: top-k on logits then softmax over the k, weights in activation dtype",
          "shared experts, ungated, width 48, gate and up as one projection's halves", "residual scale: 0.22",
          "embedding scale: 12", "logit scale: 0.125", "biases: q, k, v, o"),
    layer_types=([S, S, F, F], ("local", "local", "global", "global")),
    sdpa=False,  # GraniteMoeSWAPreTrainedModel._supports_sdpa is False: its sinks need its own eager attention
    config_variants=({}, KWARGS),
    gguf={},  # llama.cpp's granite_swa holds it whole: one RoPE theta, the shared expert, the biases
    # GraniteMoeSWAModel (llama.cpp's converter) adds `.weight` to the sinks and keeps the experts' and the shared
    # expert's gate and up fused
    gguf_naming=GgufNaming(converter_names={
        ("self_attn.sinks", "attn"): "attn_sinks.weight",
        ("block_sparse_moe.experts.gate_up_proj", "gate"): "ffn_gate_up_exps.weight",
        ("block_sparse_moe.experts.gate_up_proj", "up"): "ffn_gate_up_exps.weight",
        ("block_sparse_moe.experts.down_proj", "down"): "ffn_down_exps.weight",
        ("shared_mlp.input_linear.weight", "gate"): "ffn_up_shexp.weight",
        ("shared_mlp.input_linear.weight", "up"): "ffn_up_shexp.weight"}),
)
