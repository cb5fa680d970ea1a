"""Qwen3 (dense).

Same as qwen2, except: a per-head QK norm (`q_norm` / `k_norm` over head_dim, llama-style RMSNorm
with the weight applied after the cast, before RoPE), `attention_bias` (default false) switching
the q, k, v and o biases together, and head_dim 128 when config.json does not state it.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from . import llama, qwen2
from .family import Family
from .hf_config import HfConfig
from .table import TensorTable

DEFAULTS: dict[str, Any] = {**qwen2.DEFAULTS, "head_dim": 128, "attention_bias": False}
TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES)


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(data, DEFAULTS)
    fields = llama.llama_fields(hf)
    return ArchConfig(**fields, qk_norm="head", **llama.attention_biases(hf.get("attention_bias", bool)),
                      **qwen2.sliding_fields(hf, fields["n_layers"]))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {**qwen2.to_hf(cfg), "attention_bias": llama.attention_bias_of(cfg)}


FAMILY = Family("qwen3", ("qwen3",), "Qwen3ForCausalLM", TENSORS, from_hf, to_hf)
