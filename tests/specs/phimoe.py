"""The phimoe test model (see tests/specs/__init__.py): longrope past its 16 original positions (long
factors that transformers' PhiMoE never uses), a router eps wide enough that SparseMixer's masks bite."""

from __future__ import annotations

from specs import LONGROPE, WINDOW, Spec

ROPE = {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 16, "short_mscale": 1.2,
        "long_mscale": 1.2, **LONGROPE}
SPEC = Spec(
    "phimoe", dict(head_dim=8, num_local_experts=6, num_experts_per_tok=2, router_jitter_noise=0.3,
                   attention_bias=True, lm_head_bias=True, sliding_window=WINDOW, max_position_embeddings=64,
                   rope_parameters=ROPE),
    old_style={"rope_theta": 1e4, "rope_scaling": {**{k: v for k, v in ROPE.items() if k != "rope_theta"},
                                                   "type": "longrope"}},
    card=("mixture of experts: 6 experts, top-2", "SparseMixer", "masked beyond a relative 2 x 0.3",
          "not renormalised", "LayerNorm", "biases: q, k, v, o, lm_head", "sliding window 4 on local layers"),
    config_variants=(
        dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0, sliding_window=None,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
        dict(head_dim=8, num_experts_per_tok=2, attention_bias=True, lm_head_bias=True, output_router_logits=True,
             router_aux_loss_coef=0.01, sliding_window=6, max_position_embeddings=64,
             rope_parameters={**ROPE, "long_factor": LONGROPE["short_factor"]}),
    ))
