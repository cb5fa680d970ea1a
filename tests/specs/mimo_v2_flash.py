"""The mimo_v2_flash test model (see tests/specs/__init__.py): 4 layers, full (2 KV heads, no sink) on 0 and 3,
sliding (window 4, 4 KV heads, a sink per head) on 1 and 2; q/k heads of 24, values of 16 scaled by 0.6; the full
layers rotate a third of each head (8 dims, theta 5e4), the sliding ones half (12 dims, theta 2e4); layer 0 dense,
1 to 3 mixtures of 8 experts in 4 groups (the best 2 groups, top-3), scaled by 1.5."""

from __future__ import annotations

from specs import WINDOW, F, GgufNaming, S, Spec

ROPE = {F: {"rope_type": "default", "rope_theta": 5e4},  # partial_rotary_factor absent: MiMo's 0.334
        S: {"rope_type": "default", "rope_theta": 2e4, "partial_rotary_factor": 0.5}}
MOE = dict(num_hidden_layers=4, head_dim=24, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=3,
           moe_intermediate_size=32, n_group=4, topk_group=2)

SPEC = Spec(
    "mimo_v2_flash",
    kwargs=dict(MOE, sliding_window=WINDOW, routed_scaling_factor=1.5, attention_value_scale=0.6, eos_token_id=1,
                layer_types=[F, S, S, F], rope_parameters=ROPE),
    old_style={}, old_styled=False,  # MiMoV2FlashConfig reads no older RoPE keys (convert_rope_params_to_dict: none)
    # the sliding layers' geometry first, then the full layers' own; the KV cache per token in fp32: full layers
    # 2 x (24 + 16), sliding layers 4 x (24 + 16), two of each, x 4 bytes = 1,920
    card=("attention: MHA, 4 heads / 4 kv heads, head_dim 24, v head_dim 16, v scaled x0.6",
          "global layers: 4 heads / 2 kv heads, head_dim 24", "KV cache          1,920 bytes per token (float32)",
          "theta=50000, 0.334 of head_dim; local layers: RoPE half, theta=20000, 0.5 of head_dim",
          "attention sinks: a learned logit per head in each softmax (eager) (sliding layers only",
          "sliding window 4 on local layers; pattern GLLG",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3])"),
    sdpa=False,  # MiMoV2FlashPreTrainedModel._supports_sdpa is False: its sinks need its own eager attention
    config_variants=(
        {},
        dict(MOE, layer_types=[S, S, S, S], sliding_window=5, attention_bias=True, attention_value_scale=None,
             routed_scaling_factor=None, norm_topk_prob=False, rms_norm_eps=1e-6, tie_word_embeddings=True,
             mlp_layer_types=["sparse", "dense", "sparse", "dense"],
             rope_parameters={S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6,
                                  "partial_rotary_factor": 1.0}}),
        dict(MOE, layer_types=[F, F, F, F], v_head_dim=24, num_key_value_heads=4,
             rope_parameters={F: {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}}),
        dict(MOE, sliding_window_size=6),
    ),
    # llama.cpp's mimo2: one rotated width for every layer, its weights unscaled (it reads no expert_weights_scale);
    # transformers' default RoPE, which llama.cpp's converter reads from the Hub's rope_theta, swa_rope_theta and
    # partial_rotary_factor (test_llamacpp.py's _hub_spelling)
    gguf=dict(routed_scaling_factor=1.0, rope_parameters=None),
    # MimoV2Model names the Hub's sinks with `.weight` added (filter_tensors)
    gguf_naming=GgufNaming(converter_names={("self_attn.attention_sink_bias", "attn"): "attn_sinks.weight"}),
    selection_bias_buffer=True,  # MiMoV2FlashTopkRouter's e_score_correction_bias is a buffer
    tp_refusal="per-layer head geometry (the global layers' own head_dim and KV heads) has no tensor-parallel plan",
)
