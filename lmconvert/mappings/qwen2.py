"""Qwen2 and Qwen2.5.

Same as llama, except: q, k and v always have a bias and o never has one (hard-coded in
transformers; there is no `attention_bias` key), the MLP has no bias, and a sliding window is
used only when `use_sliding_window` is true (else `sliding_window` is ignored), and then on the
layers i >= `max_window_layers`, unless config.json lists `layer_types`, which wins. head_dim is
hidden/heads unless config.json states one.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from . import llama
from .errors import MappingError
from .family import Family
from .hf_config import HfConfig, layer_kinds_from_hf, layer_types_to_hf, window_fields

DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
}


def sliding_fields(hf: HfConfig, n_layers: int) -> dict[str, Any]:
    """The Qwen sliding-window keys, shared with qwen3."""
    window = hf.get("sliding_window", int) if hf.get("use_sliding_window", bool) else None
    first = hf.get("max_window_layers", int)
    if first is None:
        raise MappingError("config.json: max_window_layers=null should be an integer")
    kinds = layer_kinds_from_hf(hf, n_layers, lambda i: window is not None and i >= first)
    return window_fields(kinds, window)


def sliding_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    local = [i for i, kind in enumerate(cfg.layer_kinds) if kind == "local"]
    return {"use_sliding_window": bool(local), "sliding_window": cfg.sliding_window,
            "max_window_layers": local[0] if local else cfg.n_layers, "layer_types": layer_types_to_hf(cfg.layer_kinds)}


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(data, DEFAULTS)
    fields = llama.llama_fields(hf)
    return ArchConfig(**fields, q_bias=True, k_bias=True, v_bias=True, **sliding_fields(hf, fields["n_layers"]))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {**llama.llama_to_hf(cfg), **sliding_to_hf(cfg)}


FAMILY = Family("qwen2", ("qwen2",), "Qwen2ForCausalLM", llama.TENSORS, from_hf, to_hf)
