"""Cohere 2 (Command R7B, Command A).

Same as cohere, except: there is no QK norm; `layer_types` (else `sliding_window_pattern`, default
4: every fourth layer full) picks the sliding layers, which attend within `sliding_window` (default
4096) and are the only ones with RoPE: full-attention layers have no position encoding at all
(NoPE); head_dim is hidden_size / heads unless config.json states it; RoPE's theta defaults to
10000.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from . import cohere
from .config_table import DEFAULT, Entry
from .family import Family
from .hf_config import HfConfig, Key
from .hf_layers import LAYER_TYPES_KEY, SLIDING_WINDOW_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields

PATTERN_KEY = Key("sliding_window_pattern", int, 4, legacy=True)  # read when layer_types is absent
POSITIONS = {"local": "rope", "global": "none"}


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    pattern = hf.get("sliding_window_pattern")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % pattern != 0)
    return {**window_fields(kinds, hf.get("sliding_window")), "layer_positions": tuple(POSITIONS[k] for k in kinds)}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # RoPE anywhere but exactly the sliding layers reads back differently, so export refuses it by name
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds),
            "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window}


CONFIG = cohere.BASE.but(
    add=(Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, PATTERN_KEY), layers_from_hf, layers_to_hf),),
    defaults={"sliding_window": 4096, "rope_theta": 10000.0},
    nullable={"layer_norm_eps": False, "logit_scale": False, "attention_dropout": False},
)

FAMILY = Family("cohere2", ("cohere2",), "Cohere2ForCausalLM", cohere.TENSORS, CONFIG)
