"""Granite 4 (IBM; `GraniteMoeHybridForCausalLM`).

Same as granitemoeshared, except: a hybrid stack, `layer_types` naming each layer "linear_attention"
(Mamba2, `mixer="mamba2"`, tensors `model.layers.{i}.mamba.*`, the mamba_* keys read as bamba reads
them) or "full_attention" (the older "mamba" / "attention" too, as transformers remaps them; absent:
every layer Mamba2); the residual multiplier scales the mixer's output as the attention's; every layer
has the mixture and the shared MLP (shared_intermediate_size defaults to 1024); attention has RoPE only
where `position_embedding_type` is "rope" (default null: no positions, NoPE); the auxiliary-loss keys
act in training only. A dense Granite 4 (num_local_experts 0: the shared MLP alone) is refused by name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import tensor_table
from ..tables.hf_config import HfConfig, Key, show
from ..tables.table import TensorTable
from . import bamba, granitemoe, granitemoeshared, mamba2

TENSORS = TensorTable(granitemoeshared.TENSORS.rules + mamba2.mixer_rules("model.layers.{}.mamba"))

LAYER_TYPES = {"linear_attention": "mixer", "mamba": "mixer", "full_attention": "attention", "attention": "attention"}
SCHEDULE_KEYS = (Key("layer_types", list, None, nullable=True), Key("position_embedding_type", str, None,
                                                                      nullable=True, choices={"rope": "rope"}))


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n, types = fields["n_layers"], hf.get("layer_types")
    types = ["linear_attention"] * n if types is None else types
    if len(types) != n or any(not isinstance(t, str) or t not in LAYER_TYPES for t in types):
        raise MappingError(f"config.json: layer_types={show(types)} should name one of {', '.join(LAYER_TYPES)} for "
                           f"each of the num_hidden_layers={n} layers")
    positions = "rope" if hf.get("position_embedding_type") == "rope" else "none"
    return {"layer_mixers": tuple(LAYER_TYPES[t] for t in types), "layer_positions": (positions,) * n}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A layer without a mixer, or positions other than RoPE everywhere or nowhere, reads back otherwise."""
    types = ["linear_attention" if m == "mixer" else "full_attention" for m in cfg.layer_mixers]
    return {"layer_types": types, "position_embedding_type": "rope" if "rope" in cfg.layer_positions else None}


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if hf.get("num_local_experts") == 0:
        raise MappingError("config.json: num_local_experts=0 (a dense Granite 4, its FFN the shared MLP alone) is "
                           "not supported yet; only Granite 4 mixtures of experts are")
    return granitemoeshared.experts_from_hf(hf, fields)


EXPERTS = granitemoeshared.CONFIG.entries[[e.name for e in granitemoeshared.CONFIG.entries].index("experts")]
CONFIG = granitemoeshared.CONFIG.but(
    add=(Entry("experts", EXPERTS.keys, experts_from_hf, EXPERTS.write),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf), bamba.MIXER),
    defaults={"shared_intermediate_size": 1024},
)


# -- llama.cpp (GGUF): its granitehybrid architecture (see bamba.GGUF_BAMBA, its variant with a dense FFN): Granite's
# four scales, the experts stacked and the shared MLP as the `shexp` tensors (granitemoe.GGUF_SHARED's), on every
# layer. llama.cpp's converter states no RoPE for Granite 4 (`rope.scaling.finetuned` false, a context of 2**20), as
# Granite 4's models have none (position_embedding_type null or "nope"); lmconvert states true for one that rotates,
# which llama.cpp's granitehybrid runs (its converter would write that model without its RoPE).
def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    out, attending = bamba.hybrid_from_gguf(config)
    rotates = config.get("position_embedding_type") is not False  # llama.cpp's default: true
    return {**out, "position_embedding_type": "rope" if rotates else None,
            "layer_types": ["full_attention" if i in attending else "linear_attention"
                            for i in range(config["num_hidden_layers"])]}


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    attending = [i for i, t in enumerate(config["layer_types"]) if LAYER_TYPES[t] == "attention"]
    return bamba.hybrid_to_gguf(config, attending, config.get("position_embedding_type") == "rope")


GGUF_GRANITEHYBRID = replace(
    granitemoe.GGUF_SHARED, model_type="granitemoehybrid", arch="granitehybrid",
    keys={**granitemoe.GGUF_SHARED.keys, **bamba.SSM_GGUF_KEYS}, own=bamba.SSM_GGUF_OWN, bias_flags={},
    layer_tensors=bamba.SSM_GGUF_LAYERS, derived=_from_gguf, exported=_to_gguf, refused=mamba2.PROJECTION_BIASES,
    table=TensorTable((*tensor_table(True, 0.0, True, experts=True).rules, *mamba2.gguf_mixer_rules())),
    variants=(("blk.0.ffn_up.weight", bamba.GGUF_BAMBA),))

FAMILY = Family("granitemoehybrid", ("granitemoehybrid",), "GraniteMoeHybridForCausalLM", TENSORS, CONFIG,
                reference_layouts=granitemoeshared.REFERENCE_LAYOUTS, gguf=(GGUF_GRANITEHYBRID,))
