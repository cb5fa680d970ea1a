"""Granite 4 (IBM; `GraniteMoeHybridForCausalLM`).

Same as granitemoeshared, except: a hybrid stack, `layer_types` naming each layer "linear_attention"
(Mamba2, `mixer="mamba2"`, tensors `model.layers.{i}.mamba.*`, the mamba_* keys read as bamba reads
them) or "full_attention" (the older "mamba" / "attention" too, as transformers remaps them; absent:
every layer Mamba2); the residual multiplier scales the mixer's output as the attention's; every layer
has the mixture and the shared MLP (shared_intermediate_size defaults to 1024); attention has RoPE only
where `position_embedding_type` is "rope" (default null: no positions, NoPE); the auxiliary-loss keys
act in training only. A dense Granite 4 (`num_local_experts` 0, Granite-4.0-H-Micro's): the shared MLP alone is the
layer's dense FFN, `d_ff` its `shared_intermediate_size` (the dense model's `intermediate_size` sizes nothing:
written back as that width), gate and up the halves of `input_linear` with the activation on the strided gate half
(`mlp_fused`), as GraniteMoeHybridMLP computes it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import tensor_table, weight_and_bias
from ..tables.hf_config import HfConfig, Key, show
from ..tables.points import RESIDUAL
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Piece
from . import bamba, granitemoe, granitemoeshared, mamba2

SHARED_MLP = "model.layers.{}.shared_mlp"
# a dense Granite 4: the shared MLP is the layer's FFN
DENSE_RULES = (*(Rule(f"{SHARED_MLP}.input_linear.weight", f"layers.{{}}.mlp.{n}.weight", Piece(("ffn", "ffn"), i))
                 for i, n in enumerate(("gate", "up"))),
               Rule(f"{SHARED_MLP}.output_linear.weight", "layers.{}.mlp.down.weight"))
MIXER_RULES = mamba2.mixer_rules("model.layers.{}.mamba")
TENSORS = TensorTable(granitemoeshared.TENSORS.rules + MIXER_RULES)
DENSE_TENSORS = TensorTable(granitemoe.TENSORS.rules + DENSE_RULES + MIXER_RULES)


def layout_table(arch: ArchConfig) -> TensorTable:
    """shared_mlp is the shared expert of a mixture, the dense FFN of a model without experts."""
    return TENSORS if arch.moe is not None else DENSE_TENSORS

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


def dense(hf: HfConfig) -> bool:
    """No experts: GraniteMoeHybridDecoderLayer builds no block_sparse_moe, its FFN is shared_mlp alone."""
    return hf.get("num_local_experts") == 0


def width_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    return {"d_ff": hf.get("shared_intermediate_size") if dense(hf) else hf.get("intermediate_size")}


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if dense(hf):
        if not hf.get("shared_intermediate_size"):
            raise MappingError("config.json: num_local_experts=0 with shared_intermediate_size=0 leaves the layers "
                               "no FFN, which transformers cannot build; state the shared MLP's width")
        return {"mlp_fused": True}
    return granitemoeshared.experts_from_hf(hf, fields)


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    if cfg.moe is None and cfg.mlp_fused:  # no top-k either (llama.cpp's loader asserts none without experts)
        return {"num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": cfg.d_ff}
    return EXPERTS.write(cfg)  # a dense FFN otherwise computed is written as a mixture's default: refused by name


COUNTS = ("num_local_experts", "num_experts_per_tok")  # 0 and 0: a dense Granite 4
EXPERTS = granitemoeshared.CONFIG.entries[[e.name for e in granitemoeshared.CONFIG.entries].index("experts")]
WIDTH = granitemoeshared.CONFIG.entries[[e.name for e in granitemoeshared.CONFIG.entries].index("intermediate_size")]
CONFIG = granitemoeshared.CONFIG.but(
    add=(Entry("intermediate_size", WIDTH.keys, width_from_hf, WIDTH.write),
         Entry("experts", tuple(replace(k, bound="non_negative") if k.name in COUNTS else k for k in EXPERTS.keys),
               experts_from_hf, experts_to_hf),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf), bamba.MIXER),
    defaults={"shared_intermediate_size": 1024},
)


# -- llama.cpp (GGUF): its granitehybrid architecture (see bamba.GGUF_BAMBA, its variant with a dense FFN): Granite's
# four scales, the experts stacked and the shared MLP as the `shexp` tensors (granitemoe.GGUF_SHARED's), on every
# layer. llama.cpp's converter states no RoPE for Granite 4 (`rope.scaling.finetuned` false, a context of 2**20), as
# Granite 4's models have none (position_embedding_type null or "nope"); lmconvert states true for one that rotates,
# which llama.cpp's granitehybrid runs (its converter would write that model without its RoPE). A dense Granite 4
# (GraniteMoeModel.modify_tensors without experts): the shared MLP as the dense `ffn_gate`, `ffn_up`, `ffn_down`,
# `expert_count` and `expert_used_count` 0 (llama.cpp's loader asserts no top-k without experts), the shared width
# stated as `expert_shared_feed_forward_length` and `feed_forward_length` alike (llama.cpp's graph sizes the dense FFN
# by the latter). Bamba (bamba.GGUF_BAMBA) is the file stating no expert count.
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
    table=TensorTable((*tensor_table(True, 0.0, True, experts=True).rules, *mamba2.gguf_mixer_rules(),
                       *(r for n in ("gate", "up", "down")
                         for r in weight_and_bias(f"ffn_{n}", f"mlp.{n}", IDENTITY)))),
    told_apart=(("expert_count", None, bamba.GGUF_BAMBA),))

# a dense Granite 4's FFN, gate and up, are the halves of shared_mlp.input_linear's output
REFERENCE_LAYOUTS = {**granitemoeshared.REFERENCE_LAYOUTS, "mlp.gate": "B T [F]|F", "mlp.up": "B T F|[F]",
                     "mlp.down": RESIDUAL}

FAMILY = Family("granitemoehybrid", ("granitemoehybrid",), "GraniteMoeHybridForCausalLM", TENSORS, CONFIG,
                layout=layout_table, reference_layouts=REFERENCE_LAYOUTS, gguf=(GGUF_GRANITEHYBRID,))
