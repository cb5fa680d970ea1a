"""CWM (Code World Model, facebook/cwm).

Same as llama, except: q, k, v and o never have a bias (there is no `attention_bias` key;
`mlp_bias` still switches the MLP's); `layer_types` picks the sliding_attention layers, which attend
within `sliding_window` (default 8192, never null), and defaults to every fourth layer full
(layers 0, 4, 8, ...) and the rest sliding; without `rope_parameters` (absent or null) and without
`rope_scaling` the RoPE is CWM's own llama3 scaling (theta 1e6, factor 16, low/high frequency
factors 1 and 4, original 8192 positions), whatever a top-level `rope_theta` says; otherwise
`rope_theta` defaults to 1e6; head_dim defaults to 128 and is never null; its own defaults
(128256 tokens, 6144 wide, 64 layers, 48 heads and 8 KV heads, rms_norm_eps 1e-5, 131072
positions). The dtype order is llama's: the RMSNorm statistics in fp32, cast back, then the
weight multiplies in the activation dtype.
"""

from __future__ import annotations

from typing import Any

from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from . import llama

# CwmConfig's RoPE when config.json states neither rope_parameters nor rope_scaling
DEFAULT_ROPE = {"rope_theta": 1_000_000.0, "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}
WINDOW_PATTERN = 4  # layer i is full_attention when i % 4 == 0


def rope_from_cwm(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if not hf.get("rope_scaling") and hf.get("rope_parameters") is None:
        params, where = dict(DEFAULT_ROPE), "rope_parameters."
    else:
        params, where = rope_parameters(hf)
    return {"rope": rope_from_hf(hf, params, where)}


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: i % WINDOW_PATTERN != 0)
    return window_fields(kinds, hf.get("sliding_window"))


CONFIG = llama.CONFIG.but(
    drop=("attention_bias",),
    add=(Entry("rope", KEYS, rope_from_cwm, lambda cfg: {"rope_parameters": rope_to_hf(cfg.rope)}),
         Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, layers_and_window_to_hf)),
    defaults={"vocab_size": 128256, "hidden_size": 6144, "intermediate_size": 21504, "num_hidden_layers": 64,
              "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0,
              "sliding_window": 8192},
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False, "sliding_window": False},
)


FAMILY = Family("cwm", ("cwm",), "CwmForCausalLM", llama.TENSORS, CONFIG)
