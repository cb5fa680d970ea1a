"""GraniteMoeShared (Granite 3.1 and later MoE models).

Same as granitemoe, except: where `shared_intermediate_size` is not 0 (its default), each layer
also has an ungated shared SwiGLU MLP of that width (`shared_mlp.input_linear` [gate rows then up
rows, hidden], `shared_mlp.output_linear`), run on the same normed input (its activation on the
strided gate half of one projection's output, as the experts'), whose output is added to the
experts' sum before the residual multiplier.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.points import RESIDUAL
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import granitemoe

SHARED_RULES = (
    Rule("model.layers.{}.shared_mlp.input_linear.weight", "layers.{}.mlp.shared.gate.weight",
         Piece(("shared", "shared"), 0)),
    Rule("model.layers.{}.shared_mlp.input_linear.weight", "layers.{}.mlp.shared.up.weight",
         Piece(("shared", "shared"), 1)),
    Rule("model.layers.{}.shared_mlp.output_linear.weight", "layers.{}.mlp.shared.down.weight"),
)
TENSORS = TensorTable(granitemoe.TENSORS.rules + SHARED_RULES)

SHARED_WIDTH = Key("shared_intermediate_size", int, 0, bound="non_negative")
EXPERTS = granitemoe.EXPERTS


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    out = EXPERTS.read(hf, fields)
    if width := hf.get(SHARED_WIDTH.name):  # 0: no shared MLP
        out["moe"] = replace(out["moe"], shared="plain", d_shared=width, shared_fused=True)
    return out


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    width = cfg.moe.d_shared if cfg.moe is not None and cfg.moe.shared == "plain" else None
    return {**EXPERTS.write(cfg), SHARED_WIDTH.name: DEFAULT if width is None else width}


CONFIG = granitemoe.CONFIG.but(add=(Entry("experts", (*EXPERTS.keys, SHARED_WIDTH), experts_from_hf,
                                          experts_to_hf),))


# the shared MLP runs on the unflattened input; its gate and up are the halves of input_linear's output
REFERENCE_LAYOUTS = {"mlp.shared.gate": "B T [S]|S", "mlp.shared.up": "B T S|[S]", "mlp.shared.down": RESIDUAL}

FAMILY = Family("granitemoeshared", ("granitemoeshared",), "GraniteMoeSharedForCausalLM", TENSORS, CONFIG,
                gguf=(granitemoe.GGUF_SHARED,), reference_layouts=REFERENCE_LAYOUTS)
