"""DeepSeek-V2 (and V2-Lite).

Same as deepseek_v3, except: RoPE always reads the rotary dims in pairs and rotates them in place
(a complex multiplication in transformers' `apply_rotary_emb`; there is no `rope_interleave` key);
the MLP has `mlp_bias`; `first_k_dense_replace` defaults to 0 (every layer mixture-of-experts) and
`v_head_dim` is never null; LLaMA's sizes are the defaults. The router (DeepseekV2TopkRouter) takes
a softmax of fp32 logits, never renormalises (`norm_topk_prob` is not read), and with `topk_method`
"group_limited_greedy" chooses within the best `topk_group` of `n_group` groups, each scored by its
best expert (the others' scores set to 0); there is no selection bias; `num_experts_per_tok` has no
default. MoE layers with `mlp_bias` (biased shared experts beside unbiased experts) are refused.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, plain
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import rope
from ..tables.points import LATENT, SHARED_UNFLATTENED
from . import deepseek_v3

FIRST_DENSE = Key("first_k_dense_replace", int, 0, bound="non_negative")
METHODS = {"greedy": False, "group_limited_greedy": True}  # whether the choice is group-limited
KEYS = (Key("n_routed_experts", int, 64), Key("num_experts_per_tok", int, None, nullable=True),
        Key("moe_intermediate_size", int, 1407), Key("n_shared_experts", int, 2),
        Key("routed_scaling_factor", float, 1.0), Key("topk_method", str, "greedy", nullable=True, choices=METHODS),
        Key("n_group", int, None, nullable=True), Key("topk_group", int, None, nullable=True))


def v2_moe(hf: HfConfig, first: int, n: int) -> MoeConfig:
    grouped = METHODS[hf.get("topk_method") or "greedy"]
    needed = ("num_experts_per_tok", "n_group", "topk_group") if grouped else ("num_experts_per_tok",)
    deepseek_v3.required(hf, needed, first, n)
    if hf.get("mlp_bias"):
        raise MappingError("config.json: mlp_bias=true with mixture-of-experts layers (biased shared experts and "
                           "dense layers beside unbiased experts) is not supported")
    width = hf.get("moe_intermediate_size")
    return MoeConfig(n_experts=hf.get("n_routed_experts"), top_k=hf.get("num_experts_per_tok"), d_expert=width,
                     norm_topk=False, weights_fp32=True, shared="plain", d_shared=hf.get("n_shared_experts") * width,
                     dense_layers=tuple(range(first)), n_group=hf.get("n_group") if grouped else 1,
                     topk_group=hf.get("topk_group") if grouped else 1, scale=hf.get("routed_scaling_factor"),
                     router_fp32=True)


def v2_to_hf(moe: MoeConfig) -> dict[str, Any]:
    grouped = moe.n_group > 1
    return {"n_routed_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "n_shared_experts": deepseek_v3.shared_count(moe), "routed_scaling_factor": moe.scale,
            "topk_method": "group_limited_greedy" if grouped else "greedy",
            "n_group": moe.n_group if grouped else DEFAULT, "topk_group": moe.topk_group if grouped else DEFAULT}


CONFIG = deepseek_v3.CONFIG.but(
    add=(
        rope(layout="interleaved", complex_product=True),
        deepseek_v3.latent("deepseek_v2", deinterleave=False, v_head_dim_nullable=False),
        deepseek_v3.experts_row("experts", FIRST_DENSE, KEYS, v2_moe, v2_to_hf),
        plain("mlp_bias", "mlp_bias", bool, False),
    ),
    defaults={"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": None, "max_position_embeddings": 2048},
)

# DeepseekV2Attention: kv_b_proj on the latent viewed as (B, 1, T, C) in `expand_kv`, as ours;
# DeepseekV2Moe runs the shared experts on the unflattened input
REFERENCE_LAYOUTS = {**LATENT, **SHARED_UNFLATTENED}

FAMILY = Family("deepseek_v2", ("deepseek_v2",), "DeepseekV2ForCausalLM", deepseek_v3.TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)


