"""The kolibri1 test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import LLAMA3, WINDOW, F, S, Spec

MOE = dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=48)

SPEC = Spec(  # bf16: bit-exact with transformers' default experts (grouped_mm) and its eager ones (test_moe.py)
    # 4 sliding layers with RoPE : 1 full layer without positions
    "kolibri1",
    kwargs=dict(MOE, num_hidden_layers=5, sliding_window=WINDOW, norm_topk_prob=True, head_dim=16, eos_token_id=1,
                rope_parameters={**LLAMA3, "rope_theta": 1e6}),
    old_style={"rope_theta": 1e6, "rope_scaling": LLAMA3}, old_drop=("layer_types",),
    card=("mixture of experts: 8 experts, top-3, d_expert 32 (all layers)", "QK norm: per head",
          "sandwich norm (pre + post)", "sliding window 4 on local layers; pattern LLLLG",
          "positions: none (layers [4])",
          "top-k on logits, then sigmoid, renormalised, weights in fp32, selection bias, logits in fp32, "
          "kept in fp32: selection_bias", "shared experts, ungated, width 48"),
    layer_types=([F, S, S, F, S], ("global", "local", "local", "global", "local")),
    config_variants=(dict(MOE, num_hidden_layers=4, layer_types=[F, F, F, F]),  # first: a null window runs
                     dict(MOE, num_hidden_layers=5),
                     dict(MOE, num_hidden_layers=4, sliding_window=WINDOW, layer_types=[S, F, S, F],
                          norm_topk_prob=True, rms_norm_eps=1e-5, head_dim=32, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
                     dict(MOE, num_hidden_layers=4, sliding_window=None, layer_types=[F, F, F, F])),
    not_a_key=("intermediate_size",),
    selection_bias_buffer=True)
