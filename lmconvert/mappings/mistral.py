"""Mistral 7B v0.1-v0.3, Mistral-Nemo and other MistralForCausalLM checkpoints.

Same as llama, except: there are no biases at all (transformers hard-codes them off and reads no
`attention_bias` or `mlp_bias` key), and `sliding_window` (default 4096 when the key is absent; an
explicit null, as in v0.2 and later, means none) applies to every layer, unless config.json lists
`layer_types`: MistralConfig alone would ignore that key with a warning, but AutoConfig loads such
a file as Ministral, which windows only the sliding_attention layers, so the key is honoured here,
and export writes it back for such a mixed pattern. head_dim is free of hidden/heads
(Mistral-Nemo: 5120 / 32 heads, head_dim 128).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from . import llama
from .family import Family
from .hf_config import HfConfig, layer_kinds_from_hf, layer_types_to_hf, window_fields

DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "sliding_window": 4096,
}


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(data, DEFAULTS)
    fields = llama.llama_fields(hf)
    window = hf.get("sliding_window", int)
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: window is not None)
    return ArchConfig(**fields, **window_fields(kinds, window))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # null, not absent: an absent key would mean the 4096 default
    out = {**llama.llama_to_hf(cfg), "sliding_window": cfg.sliding_window}
    if len(set(cfg.layer_kinds)) > 1:  # as the source file had it: AutoConfig reads it as Ministral
        out["layer_types"] = layer_types_to_hf(cfg.layer_kinds)
    return out


FAMILY = Family("mistral", ("mistral",), "MistralForCausalLM", llama.TENSORS, from_hf, to_hf)
