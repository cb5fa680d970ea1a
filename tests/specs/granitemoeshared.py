"""The granitemoeshared test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import GgufNaming, Spec

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "granitemoeshared",
    kwargs=dict(num_local_experts=4, num_experts_per_tok=3, shared_intermediate_size=48, embedding_multiplier=12.0,
                attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0, attention_bias=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4},
    card=("mixture of experts: 4 experts, top-3, d_expert 96 (all layers)",
          "router: top-k on logits then softmax over the k, weights in activation dtype",
          "shared experts, ungated, width 48, gate and up as one projection's halves", "residual scale: 0.22",
          "embedding scale: 12", "logit scale: 0.125"),
    config_variants=({}, dict(num_local_experts=4, num_experts_per_tok=3, shared_intermediate_size=48,
                              embedding_multiplier=12.0, attention_multiplier=0.0625, residual_multiplier=0.22,
                              logits_scaling=8.0, attention_bias=True)),
    gguf=dict(attention_bias=False),
    # GraniteMoeModel (llama.cpp's converter) splits each fused input_linear into gate and up
    gguf_naming=GgufNaming(converter_names={
        ("block_sparse_moe.input_linear.weight", "gate"): "ffn_gate_exps.weight",
        ("block_sparse_moe.input_linear.weight", "up"): "ffn_up_exps.weight",
        ("shared_mlp.input_linear.weight", "gate"): "ffn_gate_shexp.weight",
        ("shared_mlp.input_linear.weight", "up"): "ffn_up_shexp.weight"}))
