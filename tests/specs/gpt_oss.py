"""The gpt_oss test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, GgufNaming, S, Spec

# YaRN over 32 positions, untruncated, with betas of its own; a limit small enough that the clamps bite
ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16.0,
        "beta_slow": 2.0, "truncate": False, "rope_theta": 5e4}

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "gpt_oss",
    kwargs=dict(num_local_experts=4, num_experts_per_tok=3, sliding_window=WINDOW, swiglu_limit=1.5,
                swiglu_alpha=1.25, rope_parameters=ROPE),
    old_style={"rope_theta": 5e4, "rope_scaling": {k: v for k, v in ROPE.items() if k != "rope_theta"}},
    card=("attention sinks: a learned logit per head in each softmax", "mixture of experts: 4 experts, top-3",
          "router: top-k on logits then softmax over the k, weights in activation dtype, softmax in activation "
          "dtype, with a bias", "experts: clamped SwiGLU (alpha 1.25, limit 1.5, up + 1) over interleaved gate/up",
          "experts: biases on gate, up and down", "sliding window 4 on local layers; pattern LG",
          "yarn x4", "weight in fp32", "biases: q, k, v, o"),
    layer_types=([F, S], ("global", "local")),
    sdpa=False,  # GptOssPreTrainedModel._supports_sdpa is False: its sinks need its own eager attention
    config_variants=({}, dict(num_local_experts=4, num_experts_per_tok=3, sliding_window=WINDOW, swiglu_limit=1.5,
                              swiglu_alpha=1.25, attention_bias=False, rope_parameters=ROPE,
                              output_router_logits=True, router_aux_loss_coef=0.02)),
    # llama.cpp's gpt-oss hard-codes the SwiGLU's alpha and limit and YaRN's betas (stated, as gpt-oss's
    # config.json states them), and truncates YaRN's correction range
    gguf=dict(swiglu_limit=7.0, swiglu_alpha=1.702, rope_parameters={**ROPE, "beta_fast": 32.0, "beta_slow": 1.0,
                                                                     "truncate": True}),
    # GptOssModel adds `.weight` to the sinks and splits gate_up_proj (and its bias) into gate and up
    gguf_naming=GgufNaming(converter_names={
        ("self_attn.sinks", "attn"): "attn_sinks.weight",
        ("mlp.experts.gate_up_proj", "gate"): "ffn_gate_exps.weight",
        ("mlp.experts.gate_up_proj", "up"): "ffn_up_exps.weight",
        ("mlp.experts.gate_up_proj_bias", "gate"): "ffn_gate_exps.bias",
        ("mlp.experts.gate_up_proj_bias", "up"): "ffn_up_exps.bias",
        ("mlp.experts.down_proj", "down"): "ffn_down_exps.weight",
        ("mlp.experts.down_proj_bias", "down"): "ffn_down_exps.bias"}),
)
