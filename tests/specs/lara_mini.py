"""The lara_mini test model (see tests/specs/__init__.py): the released pattern of period 5 (gated delta-net,
sliding attention with RoPE, gated delta-net, full attention without positions, sliding), two value heads per
key head and a conv of 4, a window of 4, biases on, and every layer a mixture of 4 experts (top 2, fp32
router logits) beside a plain shared expert."""

from __future__ import annotations

from specs import WINDOW, F, S, Spec
from specs.qwen3_next import GDN, L

THETA = {"rope_type": "default", "rope_theta": 5e5}
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
SPEC = Spec(
    "lara_mini", dict(num_hidden_layers=5, layer_types=[L, S, L, F, S], head_dim=16, sliding_window=WINDOW,
                      attention_bias=True, eos_token_id=1, rope_parameters=THETA, **GDN, **EXPERTS),
    old_style={"rope_theta": 5e5},
    not_a_key=("intermediate_size",),  # LaraMiniConfig has none: every FFN is the mixture
    card=("norm: RMSNorm, eps=1e-06, weight in fp32", "QK norm: per head",
          "mixer: gated delta-net, 2 q/k heads x 8, 4 value heads x 16 (2 value heads per key head), conv 4",
          "output RMSNorm per value head (eps=1e-06, weight in fp32) times SiLU(z)",
          "layer schedule: attention on 3 (1, 3-4); gated_deltanet on 2 (0, 2); FFN on all layers",
          "sliding window 4 on local layers; pattern GLGGL", "positions: none (layers [3])",
          "mixture of experts: 4 experts, top-2, d_expert 32 (all layers)",
          "router: softmax then top-k, renormalised, weights in activation dtype, logits in fp32, kept in fp32: "
          "nothing", "shared experts, ungated, width 48", "biases: q, k, v, o", "embeddings: tied"),
    tp_refusal="the gated_deltanet mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(head_dim=16, sliding_window=WINDOW, **GDN, **EXPERTS),
        dict(head_dim=16, num_hidden_layers=4, layer_types=[S, L, F, L], sliding_window=6, linear_num_key_heads=1,
             linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=3,
             rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=False, norm_topk_prob=False,
             rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, **EXPERTS),
    ),
)
