"""The lfm2_moe test model (see tests/specs/__init__.py): convolution first, a dense first layer, then
sigmoid-routed experts with a perturbed expert bias (a buffer: `selection_bias_buffer`) and a scale."""

from __future__ import annotations

from specs import F, GgufNaming, Spec

C = "conv"
THETA = {"rope_type": "default", "rope_theta": 5e5}
MOE = dict(num_dense_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           routed_scaling_factor=1.5)
SPEC = Spec(
    "lfm2_moe", dict(num_hidden_layers=4, layer_types=[C, F, C, C], conv_bias=True, conv_L_cache=4, eos_token_id=1,
                     rope_parameters=THETA, **MOE),
    old_style={"rope_theta": 5e5, "tie_embedding": True}, old_drop=("tie_word_embeddings",),
    card=("short convolution (LFM2): in_proj to B, C, x (3 x 64); B*x through a depthwise causal conv of width 4",
          "layer schedule: attention on 1 (1); short_conv on 3 (0, 2-3); FFN on all layers",
          "mixture of experts: 4 experts, top-2, d_expert 32 (layers [1, 2, 3])",
          "router: sigmoid then sorted top-k (sum guarded by 1e-6), renormalised, weights in activation dtype, "
          "selection bias, scaled x1.5", "QK norm: per head", "embeddings: tied"),
    own_spelling={"rms_norm_eps": "norm_eps"}, not_a_key=("attention_dropout",),
    # llama.cpp's lfm2moe: no conv biases, the expert bias required, always renormalised, no scale
    gguf=dict(conv_bias=False, routed_scaling_factor=1.0),
    # LFM2MoeModel (llama.cpp's converter) stacks each layer's experts itself and names the stack as Mixtral's
    # merged experts; gguf names the expert bias whole
    gguf_naming=GgufNaming(converter_names={
        ("feed_forward.experts.1.w1.weight", "gate"): "ffn_gate_exps.weight",
        ("feed_forward.experts.1.w3.weight", "up"): "ffn_up_exps.weight",
        ("feed_forward.experts.1.w2.weight", "down"): "ffn_down_exps.weight",
        ("feed_forward.expert_bias", "router"): "exp_probs_b.bias"}),
    tp_refusal="the short_conv mixer layers have no tensor-parallel plan",
    selection_bias_buffer=True,
    config_variants=(
        dict(layer_types=[C, F]),
        dict(layer_types=[F, C], conv_bias=True, conv_L_cache=5, norm_eps=1e-6, tie_word_embeddings=False,
             rope_parameters=THETA, num_dense_layers=1, num_experts=8, num_experts_per_tok=3,
             moe_intermediate_size=16, norm_topk_prob=False, use_expert_bias=False, routed_scaling_factor=2.0),
    ),
)
