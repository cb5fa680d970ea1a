"""The nemotron_h_moe test model (see tests/specs/__init__.py): Nemotron-H with MoE blocks (Nemotron 3's layout):
Mamba2, MoE, attention, MLP, MoE (M E * - E); 8 ungated relu2 experts of 24, top-3 within the best 1 of 2 groups,
renormalised, scaled by 1.5, a perturbed selection bias, a shared expert of 40; biases on the MLP, the shared expert
and the Mamba2 projections; otherwise nemotron_h's spec model."""

from __future__ import annotations

from specs import GgufNaming, Spec
from specs.nemotron_h import MIXER, A, M, P

E = "moe"
EXPERTS = dict(n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
               moe_shared_expert_intermediate_size=40, n_group=2, topk_group=1, routed_scaling_factor=1.5,
               norm_topk_prob=True)
SPEC = Spec(
    "nemotron_h", dict(MIXER, **EXPERTS, layers_block_type=[M, E, A, P, E], use_bias=True, mlp_bias=True,
                       eos_token_id=1),
    old_style={"hybrid_override_pattern": "ME*-E"}, old_drop=("layers_block_type",), rope=False, family="nemotron_h",
    card=("layer pattern: M -F A -F -F", "mixture of experts: 8 experts, top-3, d_expert 24 (layers [1, 4])",
          "router: sigmoid then top-k, renormalised, weights in fp32, best 1 of 2 groups, selection bias, scaled x1.5, "
          "logits in fp32", "shared experts, ungated, width 40", "FFN: squared ReLU, d_ff 96 on dense layers"),
    not_a_key=("rope_parameters", "num_hidden_layers"), own_spelling={"rms_norm_eps": "layer_norm_epsilon"},
    selection_bias_buffer=True,
    # llama.cpp's nemotron_h_moe reads every FFN block as a mixture (no MLP block) and loads no in_proj, out_proj or
    # shared-expert biases
    gguf=None,
    gguf_naming=GgufNaming(converter_names={("mixer.dt_bias", "mixer"): "ssm_dt.bias"}),
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
)
