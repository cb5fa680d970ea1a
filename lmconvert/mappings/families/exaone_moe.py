"""K-EXAONE (ExaoneMoeForCausalLM: K-EXAONE-236B-A23B).

Same as exaone4, except: the norms are pre-norm (`input_layernorm` before attention,
`post_attention_layernorm` before the FFN, as llama's) instead of on each sublayer's output;
`sliding_window` cannot be null (every model has one: its full-attention layers have no positions);
and the layers `mlp_layer_types` calls "sparse"
(absent: from `first_k_dense_replace` on, default 1) are DeepSeek-V3's mixture of experts:
`num_experts` experts `moe_intermediate_size` wide, `num_shared_experts` ungated shared experts (one
FFN of their summed width, run on the unflattened input and added last; 0: none), the router
(`mlp.gate`, weight and `e_score_correction_bias` kept in fp32) taking fp32 logits, sigmoid scores,
the choice of `num_experts_per_tok` on scores plus the bias within the best `topk_group` of
`n_group` groups, renormalised plus 1e-20 when `norm_topk_prob`, times `routed_scaling_factor`,
each expert's output weighted in fp32 before the cast back. `output_router_logits` adds no loss in
transformers' K-EXAONE and is not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import MOE_RULES as GGUF_MOE_RULES
from ..tables.gguf import tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import dense_layers
from ..tables.points import QK_NORM_HEADS_FIRST, SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from . import deepseek_v3, exaone4, llama

MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
KEYS = (Key("first_k_dense_replace", int, 1, bound="non_negative"), Key("num_experts", int, 64),
        Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 1024),
        Key("num_shared_experts", int, 1, bound="non_negative"), Key("routed_scaling_factor", float, 2.5),
        Key("n_group", int, 1), Key("topk_group", int, 1), Key("norm_topk_prob", bool, True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    dense = dense_layers(hf, n, hf.get("first_k_dense_replace"))
    if len(dense) == n:
        return {}
    width, shared = hf.get("moe_intermediate_size"), hf.get("num_shared_experts")
    return {"moe": MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_tok"), d_expert=width,
                             router="sigmoid", norm_topk=hf.get("norm_topk_prob"), weights_fp32=True,
                             shared="plain" if shared else "none", d_shared=shared * width if shared else None,
                             dense_layers=dense, n_group=hf.get("n_group"), topk_group=hf.get("topk_group"),
                             selection_bias=True, scale=hf.get("routed_scaling_factor"), router_fp32=True)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    dense = range(cfg.n_layers) if moe is None else moe.dense_layers
    types = ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]
    leading = next((i for i, kind in enumerate(types) if kind == "sparse"), cfg.n_layers)
    if moe is None:
        return {"mlp_layer_types": types, "first_k_dense_replace": leading,
                **{k.name: DEFAULT for k in KEYS[1:]}}
    v3 = deepseek_v3.v3_to_hf(moe)
    return {"mlp_layer_types": types, "first_k_dense_replace": leading, "num_experts": moe.n_experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "num_shared_experts": 0 if moe.d_shared is None else v3["n_shared_experts"],
            **{k: v3[k] for k in ("routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob")}}


CONFIG = exaone4.CONFIG.but(
    add=(fixed("output norms", qk_norm="head"), Entry("experts", (MLP_LAYER_TYPES, *KEYS), experts_from_hf,
                                                      experts_to_hf)),
    nullable={"sliding_window": False},
)

# transformers' save_pretrained writes the bias beside the router (its conversion mapping reversed); in memory it
# is the router's
TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES
                      + (Rule("model.layers.{}.mlp.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),)
                      + deepseek_v3.MOE_RULES)

# q_proj(x).view(B, T, -1, D).transpose(1, 2), then q_norm; the shared experts on the unflattened input
REFERENCE_LAYOUTS = {**QK_NORM_HEADS_FIRST, **SHARED_UNFLATTENED}


# -- llama.cpp (GGUF): exaone-moe. Sliding layers as one flag each (period 4 when absent), NoPE on the others;
# the first `leading_dense_block_count` layers dense, the rest sparse (no other pattern); the router's sigmoid
# gating stated, its selection bias as exp_probs_b, renormalised when expert_weights_norm, scaled by
# expert_weights_scale; no group-limited choice (a model with n_group > 1 reads back otherwise: refused)
SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
SHARED_FFN = "lmconvert_shared_ffn"  # the shared experts' summed width, which config.json does not state


def _exaone_moe(config: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("expert_gating_func") != SIGMOID:
        raise MappingError(f"exaone-moe.expert_gating_func={config.get('expert_gating_func')}: K-EXAONE's router is a "
                           "sigmoid (2); lmconvert reads no other")
    width, shared = config.get("moe_intermediate_size", 1024), config.get(SHARED_FFN) or 0
    if shared != width * (config.get("num_shared_experts") or 0):
        raise MappingError(f"exaone-moe.expert_shared_feed_forward_length={shared} is not expert_shared_count x "
                           f"expert_feed_forward_length")
    return {"n_group": 1, "topk_group": 1}


GGUF_EXAONE_MOE = written(
    "exaone_moe", arch="exaone-moe",
    keys={"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
          "expert_feed_forward_length": "moe_intermediate_size", "expert_shared_count": "num_shared_experts",
          "expert_shared_feed_forward_length": SHARED_FFN, "expert_weights_scale": "routed_scaling_factor",
          "expert_weights_norm": "norm_topk_prob", "leading_dense_block_count": "first_k_dense_replace",
          "expert_gating_func": "expert_gating_func", "attention.sliding_window": "sliding_window",
          "expert_group_count": "n_group", "expert_group_used_count": "topk_group"},
    defaults={"hidden_act": "silu", "norm_topk_prob": False, "routed_scaling_factor": 1.0}, swa_pattern=4,
    derived=_exaone_moe,
    constants={"expert_gating_func": SIGMOID, "nextn_predict_layers": 0, "rope.scaling.type": "none"},
    stated=exaone4.GGUF_EXAONE4.stated, head_dim_stated=False,  # ExaoneMoEModel is an Exaone4Model
    unstated={SHARED_FFN: lambda config: config.get("moe_intermediate_size", 1024)
              * (config.get("num_shared_experts") or 0)},
    table=TensorTable(tensor_table(False, 0.0, True).rules
                      + tuple(r for r in GGUF_MOE_RULES if "shared_gate" not in r.canonical)
                      + tuple(Rule(f"blk.{{}}.ffn_{n}_shexp.bias", f"layers.{{}}.mlp.shared.{n}.bias")
                              for n in ("gate", "up", "down"))  # llama.cpp loads none: refused
                      + (Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),)))

FAMILY = Family("exaone_moe", ("exaone_moe",), "ExaoneMoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_EXAONE_MOE,),
                reference_layouts=REFERENCE_LAYOUTS)
