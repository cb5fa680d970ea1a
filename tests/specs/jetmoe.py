"""The jetmoe test model (see tests/specs/__init__.py): 2 layers, each a mixture of attention heads (4 experts
of 4 query heads over 4 shared kv heads, top-3 per token: 12 heads) and a mixture of 4 SwiGLU experts (top-3),
each with its output bias; untied, RoPE at theta 5e4. Tensor parallel over 2 and 4 ranks: by the kv heads."""

from __future__ import annotations

from specs import Spec

ROPE = {"rope_type": "default", "rope_theta": 5e4}
MOE = dict(num_key_value_heads=4, kv_channels=16, num_local_experts=4, num_experts_per_tok=3)

SPEC = Spec(  # bf16: bit-exact with its experts (one index_add over the rows sorted by expert), the only ones it has
    "jetmoe",
    kwargs=dict(MOE, tie_word_embeddings=False, rope_parameters=ROPE),
    old_style={"rope_theta": 5e4},
    card=("attention: mixture of attention heads (MoA), 4 experts of 4 query heads, top-3 per token (12 heads), "
          "over 4 shared kv heads, head_dim 16",
          "MoA router: top-k on logits then softmax over the k, weights in activation dtype; each chosen expert's "
          "q and o, the outputs weighted and summed, then a bias",
          "mixture of experts: 4 experts, top-3, d_expert 96 (all layers)",
          "router: top-k on logits then softmax over the k, weights in activation dtype",
          "experts: a bias added to their weighted sum", "biases: o", "embeddings: untied", "eps=1e-06"),
    config_variants=({}, dict(MOE, num_experts_per_tok=2, tie_word_embeddings=False, activation_function="gelu",
                              output_router_logits=True, aux_loss_coef=0.02, attention_dropout=0.1,
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})),
    own_spelling={"head_dim": "kv_channels"},
    not_a_key=("num_attention_heads",),
    hub_experts_only=True,  # transformers 5 keeps JetMoE's parallel experts (input_linear, output_linear) as they are
    aux_loss_key="aux_loss_coef",  # its load balance counts the attention's routers too
)
