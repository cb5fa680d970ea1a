"""Hy3 (HYV3ForCausalLM).

Same as llama, except: a per-head QK norm (`q_norm` / `k_norm` over head_dim after the heads move
before time, llama-style RMSNorm with the weight after the cast, before RoPE); head_dim defaults to
128 and is never null; `rope_theta` defaults to 11158840 and `rms_norm_eps` to 1e-5.
`mlp_layer_types` ("dense" or "sparse" per layer; absent, the first layer dense and the others
sparse) says which layers are mixtures of `num_experts` SwiGLU experts (`moe_intermediate_size`
wide) with `num_shared_experts` ungated shared experts (one FFN of their summed width, run on the
flattened input). The router (`mlp.router.gate` on the Hub, `mlp.gate` in transformers 5; weight
and the selection bias, `mlp.expert_bias` / `mlp.e_score_correction_bias`, kept in fp32) takes fp32
logits from the fp32 input, scores experts by their sigmoid, chooses `num_experts_per_tok` on those
scores plus the bias (no groups), always renormalises the chosen scores (plus 1e-20) and multiplies
them by `router_scaling_factor`, all in fp32; each expert's output is weighted in fp32 before the
cast back. `enable_moe_fp32_combine` adds the routed and shared outputs in fp32 and casts the sum
back, which rounds as the activation dtype's own add does (torch computes that add in fp32 too), so
it is read and changes nothing. Mixture-of-experts layers with `mlp_bias` (biased shared experts
beside unbiased experts) are refused. The multi-token-prediction layer, which transformers does not
load, is not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import FUSED_RULES, dense_layers
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from . import deepseek_v3, llama

MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
KEYS = (Key("num_experts", int, 192, nullable=True), Key("num_experts_per_tok", int, 8, nullable=True),
        Key("moe_intermediate_size", int, 1536), Key("num_shared_experts", int, 1, nullable=True),
        Key("router_scaling_factor", float, 2.826), Key("enable_moe_fp32_combine", bool, True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """transformers makes layer i a mixture of experts where mlp_layer_types[i] is "sparse"."""
    n = fields["n_layers"]
    dense = dense_layers(hf, n, 1)
    if len(dense) == n:
        return {}
    for name in ("num_experts", "num_experts_per_tok", "num_shared_experts"):
        if hf.get(name) is None:
            raise MappingError(f"config.json: {name}=null, but mlp_layer_types makes layers "
                               f"{[i for i in range(n) if i not in dense]} mixture-of-experts layers, which need it; "
                               "state it from the model card")
    if hf.get("mlp_bias"):
        raise MappingError("config.json: mlp_bias=true with mixture-of-experts layers (biased shared experts and "
                           "dense layers beside unbiased experts) is not supported")
    width = hf.get("moe_intermediate_size")
    return {"moe": MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_tok"), d_expert=width,
                             router="sigmoid", norm_topk=True, weights_fp32=True, shared="plain",
                             d_shared=hf.get("num_shared_experts") * width, dense_layers=dense, selection_bias=True,
                             scale=hf.get("router_scaling_factor"), router_fp32=True)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    dense = range(cfg.n_layers) if moe is None else moe.dense_layers
    types = ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]
    if moe is None:
        return {"mlp_layer_types": types, **{k.name: DEFAULT for k in KEYS}}
    # not renormalised, grouped, or without the selection bias: read back, a different model
    routed = moe.norm_topk and moe.n_group == 1 and moe.selection_bias
    return {"mlp_layer_types": types, "num_experts": moe.n_experts if routed else DEFAULT,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "num_shared_experts": deepseek_v3.shared_count(moe), "router_scaling_factor": moe.scale,
            "enable_moe_fp32_combine": DEFAULT}


CONFIG = llama.CONFIG.but(
    add=(llama.norm(1e-5), fixed("QK norm", qk_norm="head"),
         Entry("experts", (MLP_LAYER_TYPES, *KEYS), experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 120832, "hidden_size": 4096, "intermediate_size": 13312, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
              "rope_theta": 11158840.0},
    nullable={"head_dim": False, "num_key_value_heads": False, "attention_dropout": False},
)

# the Hub's names first (what export writes), then transformers 5's
MOE_RULES = (
    Rule("model.layers.{}.mlp.router.gate.weight", "layers.{}.mlp.router.weight"),
    Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),
    Rule("model.layers.{}.mlp.expert_bias", "layers.{}.mlp.router.selection_bias"),
    Rule("model.layers.{}.mlp.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),
    *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    *(Rule(f"model.layers.{{}}.mlp.{s}.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for s in ("shared_mlp", "shared_experts") for n in ("gate", "up", "down")),
    *FUSED_RULES,
)
TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES + MOE_RULES)

# q_norm on q_proj(x).view(B, T, -1, D).transpose(1, 2); HYV3MoE runs the shared experts on the
# flattened input, as ours
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("hy_v3", ("hy_v3",), "HYV3ForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS)
