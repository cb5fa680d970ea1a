"""The mixtral test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import WINDOW, Spec

# mixtures of experts: more experts than chosen per token, each chosen somewhere in IDS
# (tests/test_moe.py checks that), top-3 where the family allows it so the order of the adds shows
SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    "mixtral",
    kwargs=dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6},
    card=("mixture of experts: 4 experts, top-2, d_expert 96 (all layers)",
          "router: softmax then top-k, renormalised, weights in fp32", "sliding window 4 on local layers",
          "active per token"))
