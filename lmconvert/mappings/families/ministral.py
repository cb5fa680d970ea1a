"""Ministral (Ministral-8B-2410, as transformers 5 saves it: model_type `ministral`).

Same as mistral, except: `layer_types` is Ministral's own key: when config.json lacks it, every
layer is sliding_attention, and only the sliding_attention layers use `sliding_window` (default
4096); export always writes it, as transformers does. transformers' Ministral builds the sliding
mask for every model, so it cannot run a null `sliding_window` (which MinistralConfig accepts, and
would read as every layer full): null is refused, and export writes the default window where no
layer uses one. transformers' Ministral attention reads `head_dim` with a plain
getattr, so a null (or absent) head_dim leaves it unable to build the model; here null means
hidden_size / heads, as in mistral. The dtype order is mistral's: the RMSNorm statistics in fp32,
cast back, then the weight multiplies in the activation dtype.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig
from ..tables.hf_layers import LAYER_TYPES_KEY, SLIDING_WINDOW_KEY, layer_types_to_hf
from . import llama, mistral


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if hf.get("sliding_window") is None:
        raise MappingError("config.json: sliding_window=null: transformers' Ministral builds the sliding-window "
                           "mask for every model and cannot run without a window; set sliding_window (every "
                           "full_attention layer ignores it)")
    return mistral.window_from_hf(hf, fields)


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # never null (see above): a window no layer uses is written as the default
    return {"sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window,
            "layer_types": layer_types_to_hf(cfg.layer_kinds)}


CONFIG = mistral.CONFIG.but(
    add=(Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, window_to_hf),),
)


FAMILY = Family("ministral", ("ministral",), "MinistralForCausalLM", llama.TENSORS, CONFIG)
