"""The afmoe test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, GgufNaming, S, Spec

# layer 0 dense, 1 to 3 mixtures; 0 to 2 sliding (RoPE), 3 full (no positions)
MOE = dict(num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
           num_shared_experts=2)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "afmoe",
    kwargs=dict(MOE, sliding_window=WINDOW, route_scale=1.5, mup_enabled=True, eos_token_id=1,
                rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4}, old_drop=("layer_types",),
    card=("attention output gate: sigmoid(a projection of the input)", "QK norm: per head",
          "placement: sandwich norm (pre + post)", "norm: RMSNorm, eps=1e-05, weight in fp32",
          "sliding window 4 on local layers; pattern LLLG", "positions: none (layers [3])",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3])",
          "sigmoid in fp32 then sorted top-k, renormalised, weights in fp32, selection bias, scaled x1.5",
          "shared experts, ungated, width 64", "embedding scale: 8 (a float multiply)"),
    layer_types=([F, S, S, F], ("global", "local", "local", "global")),
    config_variants=(dict(MOE, layer_types=[S, S, S, F]),
                     dict(MOE, sliding_window=WINDOW, layer_types=[S, F, S, F], num_dense_layers=2,
                          num_shared_experts=1, route_scale=1.0, rms_norm_eps=1e-6, attention_bias=True,
                          mup_enabled=False, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
                     dict(MOE, global_attn_every_n_layers=2, num_dense_layers=0)),
    gguf={},  # llama.cpp's afmoe holds the model as it is: every fourth layer full, muP, renormalised experts
    # AfmoeModel names the router's expert_bias with `.bias` added (filter_tensors)
    gguf_naming=GgufNaming(converter_names={("mlp.expert_bias", "router"): "exp_probs_b.bias"}),
)
