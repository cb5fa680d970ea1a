"""Mellum (MellumForCausalLM: JetBrains' Mellum MoE code models).

Same as qwen3_moe, except: `layer_types` (default: every layer full) picks the layers that attend
within `sliding_window` (default 1024; null: none); RoPE is set per layer type, as nested
`rope_parameters` {"full_attention": ..., "sliding_attention": ...} (default theta 5e5 on full
layers, 1e4 on sliding ones; there is no older spelling: `rope_theta` and `rope_scaling` are not
read, as MellumConfig reads neither), sliding layers using `rope_local`; `mlp_layer_types` ("dense"
or "sparse" per layer, default every layer sparse) says which layers are mixtures of experts, the
dense ones keeping the MLP of `intermediate_size`; `norm_topk_prob` defaults to true; head_dim
defaults to 128 and is never null. The multi-token-prediction layer (`num_nextn_predict_layers`,
`mtp_layer_types`, `mtp_mlp_layer_types`; tensors under `mtp.`), which transformers does not load,
is not read: its tensors are dropped, and the import says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import Entry
from ..tables.gguf import QWEN_MOE_KEYS, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from ..tables.hf_moe import dense_layers, experts
from ..tables.hf_rope import FRACTION
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import qwen3_moe

LAYER_TYPES = ("full_attention", "sliding_attention")
# MellumConfig's rope_parameters when config.json has none, and a layer type's when it lacks one
DEFAULT_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
WINDOW = Key("sliding_window", int, 1024, nullable=True)
MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return window_fields(layer_kinds_from_hf(hf, fields["n_layers"], lambda i: False), hf.get("sliding_window"))


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds), "sliding_window": cfg.sliding_window}


def rope_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Full layers use `rope`, sliding ones `rope_local` (None when it is the same)."""
    nested = hf.get("rope_parameters") or DEFAULT_ROPE
    ropes = {}
    for kind in LAYER_TYPES:
        if kind not in nested and ({"full_attention": "global", "sliding_attention": "local"}[kind]
                                   in fields["layer_kinds"]):
            raise MappingError(f"config.json: rope_parameters={show(nested)} has no {kind!r} entry, which "
                               f"MellumConfig needs for its {kind} layers")
        params = nested.get(kind) or DEFAULT_ROPE[kind]
        if not isinstance(params, dict):
            raise MappingError(f"config.json: rope_parameters.{kind}={show(params)} should be a JSON object")
        if params.get(FRACTION.name, hf.get(FRACTION.name)) not in (None, 1.0):
            raise MappingError(f"config.json: a partial_rotary_factor for the {kind} layers: transformers' Mellum "
                               "rotates whole heads with tables of part of one, and cannot run it; remove it")
        ropes[kind] = hf_rope.rope_from_hf(hf, params, f"rope_parameters.{kind}.",
                                           theta=params.get("rope_theta", DEFAULT_ROPE[kind]["rope_theta"]))
    return hf_rope.rope_by_kind(ropes["full_attention"], ropes["sliding_attention"], fields["layer_kinds"])


EXPERTS = experts(Key("num_local_experts", int, 64), Key("num_experts_per_tok", int, 8),
                  width=Key("moe_intermediate_size", int, 896), norm_key=Key("norm_topk_prob", bool, True),
                  count_legacy=Key("num_experts", int, 64, legacy=True), aux_default=0.001)


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """qwen3_moe's experts, on the layers mlp_layer_types calls "sparse"."""
    dense = dense_layers(hf, fields["n_layers"], 0)
    if len(dense) == fields["n_layers"]:
        return {}
    moe = EXPERTS.read(hf, fields)["moe"]
    return {"moe": type(moe)(**{**moe.__dict__, "dense_layers": dense})}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    dense = range(cfg.n_layers) if cfg.moe is None else cfg.moe.dense_layers
    out = EXPERTS.write(cfg) if cfg.moe is not None else {}
    return {**out, "mlp_layer_types": ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]}


CONFIG = qwen3_moe.CONFIG.but(
    drop=("rope",),
    add=(Entry("layer kinds", (WINDOW, LAYER_TYPES_KEY), window_from_hf, window_to_hf),
         Entry("rope by layer type", (Key("rope_parameters", dict, None, nullable=True), FRACTION), rope_from_hf,
               hf_rope.rope_by_layer_type_to_hf),
         Entry("experts", (MLP_LAYER_TYPES, *EXPERTS.keys), experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 98304, "hidden_size": 2304, "intermediate_size": 7168, "num_hidden_layers": 28,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
              "max_position_embeddings": 131072},
    nullable={"head_dim": False},
)

# the multi-token-prediction layer transformers does not load (`_keys_to_ignore_on_load_unexpected`)
TENSORS = TensorTable(qwen3_moe.TENSORS.rules + (Rule("mtp.*", None),))



# -- llama.cpp (GGUF): its mellum graph has a mixture of experts on every layer and always renormalises the top-k
# weights; with a window it takes every fourth layer full unless the file lists the pattern, without one none. It
# reads `rope.freq_base_swa` but rotates the sliding layers with the full layers' theta (`freq_base`, unscaled),
# so a file means that, and a model whose sliding layers have a RoPE of their own (Mellum's 1e4) is refused
def from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    n, window, theta = config["num_hidden_layers"], config.get("sliding_window"), config["rope_theta"]
    full = {"rope_type": "default", "rope_theta": theta, **(config.get("rope_scaling") or {})}
    return {"layer_types": config["layer_types"] if window is not None else ["full_attention"] * n,
            "mlp_layer_types": ["sparse"] * n,
            "rope_parameters": {"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": theta}}}


GGUF_MELLUM = written("mellum", arch="mellum", keys={**QWEN_MOE_KEYS, "attention.sliding_window": "sliding_window"},
                      defaults={"hidden_act": "silu", "norm_topk_prob": True, "sliding_window": None},
                      swa_pattern=4, experts=True, derived=from_gguf)


FAMILY = Family("mellum", ("mellum",), "MellumForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MELLUM,),
                reference_layouts=QK_NORM_PER_HEAD)
