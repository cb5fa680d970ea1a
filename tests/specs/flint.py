"""The flint test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec

# layers 0, 1 and 5 full (no positions), 2 to 4 sliding (RoPE); 0 and 1 dense, 2 to 5 mixtures
KWARGS = dict(num_hidden_layers=6, sliding_window=WINDOW, head_dim=16, num_experts=4, num_experts_per_tok=3,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, attention_bias=True,
              bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4})

SPEC = Spec(
    "flint", KWARGS,
    old_style={"rope_theta": 1e4}, old_drop=("layer_types", "mlp_only_layers"),
    card=("attention sinks: a learned logit per head in each softmax (eager), kept in fp32", "q.k in fp32",
          "QK norm: per head",
          "sliding window 4 on local layers; pattern GGLLLG", "positions: none (layers [0, 1, 5])",
          "positions: RoPE half, theta=10000 (layers [2, 3, 4])", "norm: RMSNorm, eps=1e-06, weight in fp32",
          "mixture of experts: 4 experts, top-3, d_expert 32 (layers [2, 3, 4, 5])",
          "router: sigmoid in fp32 then sorted top-k, renormalised, weights in fp32, logits in fp32",
          "shared experts, ungated, width 48", "biases: q, k, v, o"),
    layer_types=([F, S, S, F, S, F], ("global", "local", "local", "global", "local", "global")),
    sdpa=False,  # FlintPreTrainedModel._supports_sdpa is False: its sinks need its own eager attention
    # bf16: bit for bit; transformers keeps the sinks in fp32 in a bf16 model (_keep_in_fp32_modules_strict), and so
    # does the decoder (`sinks_fp32`): tests/test_moe.py::test_flint_keeps_its_fp32_sinks_in_bf16
    config_variants=({}, {**KWARGS, "mlp_only_layers": [1], "decoder_sparse_step": 2, "norm_topk_prob": False,
                          "output_router_logits": True, "router_aux_loss_coef": 0.02}),
)
