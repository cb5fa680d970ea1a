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

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import (
    GgufArch,
)
from ..tables.hf_config import HfConfig
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layer_types_to_hf,
    window_fields,
)
from . import llama


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window")
    return window_fields(layer_kinds_from_hf(hf, fields["n_layers"], lambda i: window is not None), window)


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # null, not absent: an absent key would mean the 4096 default
    out: dict[str, Any] = {"sliding_window": cfg.sliding_window}
    if len(set(cfg.layer_kinds)) > 1:  # as the source file had it: AutoConfig reads it as Ministral
        out["layer_types"] = layer_types_to_hf(cfg.layer_kinds)
    return out


CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, window_to_hf),),
    defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32},
    nullable={"num_key_value_heads": False, "attention_dropout": False},
)


# -- llama.cpp (GGUF)
# llama.cpp writes Mistral as `llama`; like transformers, tell it by its general.name
GGUF_MISTRAL = GgufArch("mistral", arch="llama", named="mistral", keys={"attention.sliding_window": "sliding_window"},
                            defaults={"hidden_act": "silu", "sliding_window": None}, permute_qk=True)


FAMILY = Family("mistral", ("mistral",), "MistralForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_MISTRAL,))
