"""Cohere 2 MoE (Cohere2MoeForCausalLM).

Same as cohere2, except: the FFN of every layer `mlp_layer_types` calls "sparse" (without it, all
but the first `first_k_dense_replace`) is a mixture of `num_experts` SwiGLU experts, each
`intermediate_size` wide (`mlp.experts.{e}.gate_proj` / `up_proj` / `down_proj` on the Hub;
transformers 5's fused `mlp.experts.gate_up_proj` / `down_proj` also read), with a router
(`mlp.gate`) that takes the top `num_experts_per_tok` of the logits and weights them by the softmax
over those k in fp32 (`expert_selection_fn` "softmax"; `norm_topk_prob` then changes nothing) or by
their sigmoids in the activation dtype, renormalised if `norm_topk_prob` ("sigmoid"), cast to the
activation dtype; `num_shared_experts` > 0 adds shared experts (`mlp.shared_experts`, one SwiGLU MLP
`num_shared_experts * intermediate_size` wide) whose output is added to the routed experts' sum
(`shared_expert_combination_strategy` "sum") or averaged with it ("average", the default); the
dense layers' MLP is `prefix_dense_intermediate_size` wide (null: intermediate_size), and where
`prefix_dense_sliding_window_pattern` is 1 (the default) the dense layers' full attention has RoPE
too. Without `layer_types`, the first `first_k_dense_replace` layers slide but every
`prefix_dense_sliding_window_pattern`-th, the others but every `sliding_window_pattern`-th. The norm
is llama's RMSNorm where `rms_norm_eps` is stated, else Cohere's LayerNorm (`layer_norm_eps`);
`head_dim` defaults to 128 and RoPE's theta to 10000; `output_router_logits` adds no loss (its
model computes none) and is read and unused.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.hf_moe import dense_layers, expert_rules
from ..tables.table import Rule, TensorTable
from . import cohere

SHARED_RULES = tuple(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
                     for n in ("gate", "up", "down"))
TENSORS = TensorTable(cohere.TENSORS.rules + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate")
                      + SHARED_RULES)

FIRST_DENSE = Key("first_k_dense_replace", int, 0, bound="non_negative", legacy=True)  # popped by the config class
MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
PREFIX_PATTERN = Key("prefix_dense_sliding_window_pattern", int, 1)


def dense_of(hf: HfConfig, n_layers: int) -> tuple[int, ...]:
    return dense_layers(hf, n_layers, hf.get(FIRST_DENSE.name))


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    first, prefix, pattern = hf.get(FIRST_DENSE.name), hf.get(PREFIX_PATTERN.name), hf.get("sliding_window_pattern")
    kinds = layer_kinds_from_hf(hf, n, lambda i: (i + 1) % prefix != 0 if i < first else (i + 1 - first) % pattern != 0)
    dense = dense_of(hf, n)
    positions = tuple("rope" if kind == "local" or (i in dense and prefix == 1) else "none"
                      for i, kind in enumerate(kinds))
    return {**window_fields(kinds, hf.get("sliding_window")), "layer_positions": positions}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """layer_types and the window; the prefix pattern only says whether dense full-attention layers
    have RoPE (1) or not (2, which the explicit layer_types leaves otherwise unused)."""
    dense = cfg.moe.dense_layers if cfg.moe is not None else tuple(range(cfg.n_layers))
    forced = [cfg.layer_positions[i] == "rope" for i in dense if cfg.layer_kinds[i] == "global"]
    return {**layers_and_window_to_hf(cfg), "sliding_window_pattern": DEFAULT,
            PREFIX_PATTERN.name: DEFAULT if not forced or forced[0] else 2}


LAYERS = Entry("layer kinds",
               (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, Key("sliding_window_pattern", int, 4), PREFIX_PATTERN),
               layers_from_hf, layers_to_hf)

NORM_KEYS = (Key("layer_norm_eps", float, 1e-5), Key("rms_norm_eps", float, None, nullable=True))


def norm_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if hf.get("rms_norm_eps") is not None:  # llama's RMSNorm
        return {"norm": NormConfig(eps=hf.get("rms_norm_eps"))}
    return {"norm": NormConfig(kind="layer", bias=False, eps=hf.get("layer_norm_eps"), dtype_order="scale_then_cast",
                               written_out=True)}


def norm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    if cfg.norm.kind == "rms":
        return {"rms_norm_eps": cfg.norm.eps, "layer_norm_eps": DEFAULT}
    return {"layer_norm_eps": cfg.norm.eps, "rms_norm_eps": None}


SELECTION = {"softmax": "topk_softmax", "sigmoid": "topk_sigmoid"}
COMBINATION = {"sum": "plain", "average": "averaged"}
MOE_KEYS = (Key("num_experts", int, 8), Key("num_experts_per_tok", int, 2), Key("intermediate_size", int, 22528),
            Key("prefix_dense_intermediate_size", int, None, nullable=True),
            Key("num_shared_experts", int, 0, bound="non_negative"),
            Key("shared_expert_combination_strategy", str, "average", choices=COMBINATION),
            Key("expert_selection_fn", str, "softmax", choices=SELECTION), Key("norm_topk_prob", bool, True),
            MLP_LAYER_TYPES, FIRST_DENSE, Key("output_router_logits", bool, False))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    width, router = hf.get("intermediate_size"), SELECTION[hf.get("expert_selection_fn")]
    shared = hf.get("num_shared_experts")
    dense = dense_of(hf, fields["n_layers"])
    if len(dense) == fields["n_layers"]:
        raise MappingError("config.json: mlp_layer_types makes every layer dense; a Cohere2-MoE model without "
                           "experts is Cohere2's (model_type cohere2)")
    moe = MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_tok"), d_expert=width,
                    router=router, norm_topk=router == "topk_sigmoid" and hf.get("norm_topk_prob"),
                    shared=COMBINATION[hf.get("shared_expert_combination_strategy")] if shared else "none",
                    d_shared=shared * width if shared else None, dense_layers=dense)
    prefix = hf.get("prefix_dense_intermediate_size")
    return {"d_ff": width if prefix is None else prefix, "moe": moe}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:  # a dense model: Cohere2-MoE cannot express it; said through the lost field
        return {"num_experts": DEFAULT, "mlp_layer_types": ["dense"] * cfg.n_layers}
    selection = {v: k for k, v in SELECTION.items()}.get(moe.router, "softmax")
    shared = 0 if moe.d_shared is None else max(1, round(moe.d_shared / moe.d_expert))
    return {"num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "intermediate_size": moe.d_expert,
            "prefix_dense_intermediate_size": cfg.d_ff if moe.dense_layers else DEFAULT,
            "num_shared_experts": shared,
            "shared_expert_combination_strategy": {v: k for k, v in COMBINATION.items()}.get(moe.shared, DEFAULT),
            "expert_selection_fn": selection,
            "norm_topk_prob": moe.norm_topk if moe.router == "topk_sigmoid" else DEFAULT,
            "mlp_layer_types": ["dense" if i in moe.dense_layers else "sparse" for i in range(cfg.n_layers)],
            "output_router_logits": DEFAULT}  # Cohere2MoeForCausalLM adds no load-balancing loss


CONFIG = cohere.BASE.but(
    drop=("intermediate_size", "norm"),
    add=(Entry("norm", NORM_KEYS, norm_from_hf, norm_to_hf), LAYERS,
         Entry("experts", MOE_KEYS, experts_from_hf, experts_to_hf)),
    defaults={"sliding_window": 4096, "rope_theta": 10000.0, "head_dim": 128},
    nullable={"logit_scale": False, "attention_dropout": False, "head_dim": False},
)


# llama.cpp's converter writes Cohere2MoeForCausalLM as `cohere2moe` (a leading dense block count, "average"
# shared experts only), which the gguf package lmconvert's GGUF tables are checked against does not name yet
FAMILY = Family("cohere2_moe", ("cohere2_moe",), "Cohere2MoeForCausalLM", TENSORS, CONFIG,
                no_gguf="llama.cpp's cohere2moe architecture is not in the gguf package lmconvert is tested with; "
                        "not written yet")
