"""The beam test model (see tests/specs/__init__.py): 4 layers, sliding (RoPE, window 4) on 0 to 2, full (no
positions, their queries scaled by exp(0.1 log1p((pos + 1) / 2048)), above 1 at every position) on 3;
layer 0 dense, 1 to 3 mixtures of 8 experts in 4 groups (the best 2 groups, top-3); the logits soft-capped."""

from __future__ import annotations

from specs import FINAL_CAP, WINDOW, F, S, Spec

ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 2e4}, "full_attention": None}
MOE = dict(num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
           n_group=4, topk_group=2, mlp_layer_types=["dense", "sparse", "sparse", "sparse"])

SPEC = Spec(
    "beam",
    kwargs=dict(MOE, sliding_window=WINDOW, routed_scaling_factor=1.5, final_logit_softcapping=FINAL_CAP,
                eos_token_id=1, rope_parameters=ROPE),
    old_style={}, old_styled=False,  # BeamConfig reads no older RoPE keys (convert_rope_params_to_dict: none)
    card=("attention output gate: sigmoid(a projection of the input + a bias per head)", "QK norm: per head",
          "placement: sandwich norm (pre + post)", "norm: RMSNorm, eps=1e-06, weight in fp32",
          "sliding window 4 on local layers; pattern LLLG", "positions: none (layers [3])",
          "attention temperature: q x exp(0.1 log1p((pos + 1) / 2048)), in fp32, layers without positions only",
          "residual: depth-scaled", "product in fp32",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3])",
          "sigmoid then sorted top-k, renormalised, weights in fp32, best 2 of 4 groups, selection bias, "
          "scaled x1.5 (the weighted sum), logits in fp32",
          "final-logit soft-cap: 3, in fp32"),
    layer_types=([S, F, S, F], ("local", "global", "local", "global")),
    config_variants=(dict(MOE, layer_types=[S, S, S, F]),
                     dict(MOE, sliding_window=WINDOW, layer_types=[F, S, F, S], norm_topk_prob=False,
                          routed_scaling_factor=1.0, rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=True,
                          final_logit_softcapping=None, mlp_layer_types=["sparse", "dense", "sparse", "dense"],
                          rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 1e6},
                                           "full_attention": {"rope_type": "default", "rope_theta": 5e4}}),
                     dict(MOE, sliding_window=WINDOW, rope_parameters={"sliding_attention": None, "full_attention":
                                                                       {"rope_type": "default", "rope_theta": 1e4}})),
)
