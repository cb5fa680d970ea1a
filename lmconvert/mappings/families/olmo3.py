"""OLMo 3 (Olmo3ForCausalLM: Olmo-3-7B, Olmo-3-32B and their Think/Instruct models).

Same as olmo2, except: `layer_types` (default: every fourth layer full, the others sliding) picks
the layers that attend within `sliding_window` (default 4096); RoPE is set per layer type, as
nested `rope_parameters` {"sliding_attention": ..., "full_attention": ...} (YaRN on the full layers
in the long-context releases), a type left out meaning the default RoPE with theta 5e5; in older
files, `rope_theta` and `rope_scaling` set the full layers' RoPE only, the sliding layers keeping
theta 5e5 (Olmo3Config's `default_theta`) whatever `rope_theta` says. Sliding layers use `rope_local`,
full ones `rope`; both keep cos/sin in fp32 and rotate in fp32, as olmo2.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, show
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from . import olmo2

DEFAULT_THETA = 500_000.0  # Olmo3Config.default_theta: a layer type's RoPE without its own rope_theta
LAYER_TYPES = ("full_attention", "sliding_attention")


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % 4 != 0)
    return window_fields(kinds, hf.get("sliding_window"))


def rope_by_layer_type(hf: HfConfig) -> dict[str, dict[str, Any]]:
    """Per-layer-type rope parameter dicts, merged the way Olmo3Config does it: `rope_scaling` into
    the full layers' dict, the top-level `rope_theta` into the full layers' only."""
    nested, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling")
    params = {}
    for kind in LAYER_TYPES:
        value = nested.get(kind)
        if not isinstance(value, dict | None):
            raise MappingError(f"config.json: rope_parameters.{kind}={show(value)} should be a JSON object")
        params[kind] = copy.deepcopy(value) or {"rope_type": "default"}
    if scaling is not None:
        params["full_attention"].update(scaling)
    return params


def rope_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Full layers use `rope`, sliding ones `rope_local` (None when it is the same)."""
    params, kinds = rope_by_layer_type(hf), fields["layer_kinds"]
    thetas = {"full_attention": hf.get("rope_theta") if hf.stated("rope_theta") else DEFAULT_THETA,
              "sliding_attention": DEFAULT_THETA}
    full, sliding = (hf_rope.rope_from_hf(hf, params[k], f"rope_parameters.{k}.", theta=thetas[k], fp32_tables=True)
                     for k in LAYER_TYPES)
    return hf_rope.rope_by_kind(full, sliding, kinds)


CONFIG = olmo2.CONFIG.but(
    drop=("rope",),
    add=(Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, layers_and_window_to_hf),
         Entry("rope by layer type", hf_rope.KEYS, rope_from_hf, hf_rope.rope_by_layer_type_to_hf)),
    defaults={"rope_theta": DEFAULT_THETA},
)



# -- llama.cpp (GGUF)
def _one_theta(config: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's olmo2 graph rotates the sliding layers with the file's one theta (`rope.freq_base`;
    it loads `rope.freq_base_swa` but its graph never reads it), unscaled; the full layers with it and
    the scaling. As Olmo3Config's nested rope_parameters (`rope_scaling`, stated, goes to the full
    layers), so that a model whose sliding layers have a theta of their own comes back otherwise and
    is refused."""
    theta = config["rope_theta"]
    return {"rope_parameters": {kind: {"rope_type": "default", "rope_theta": theta} for kind in LAYER_TYPES}}


# llama.cpp's converter writes OLMo 3 as `olmo2` (Olmo2Model) with its window and one flag per layer;
# a file stating no window is OLMo 2's. transformers' GGUF loader reads every olmo2 file as OLMo 2.
GGUF_OLMO3 = replace(olmo2.GGUF_OLMO2, model_type="olmo3", keys={"attention.sliding_window": "sliding_window"},
                     swa_pattern=4, derived=_one_theta, transformers_reads=False,
                     told_apart=(("attention.sliding_window", None, olmo2.GGUF_OLMO2),),
                     stated=frozenset({"attention.sliding_window_pattern"}))

FAMILY = Family("olmo3", ("olmo3",), "Olmo3ForCausalLM", olmo2.TENSORS, CONFIG, gguf=(GGUF_OLMO3,),
                reference_layouts=olmo2.REFERENCE_LAYOUTS)
