"""Mistral 7B v0.1-v0.3, Mistral-Nemo and other MistralForCausalLM checkpoints.

Same as llama, except: there are no biases at all (transformers hard-codes them off and reads no
`attention_bias` or `mlp_bias` key), and `sliding_window` (default 4096 when the key is absent; an
explicit null, as in v0.2 and later, means none) applies to every layer, unless config.json lists
`layer_types`: MistralConfig alone would ignore that key with a warning, but AutoConfig loads such
a file as Ministral, which windows only the sliding_attention layers, so the key is honoured here,
and export writes it back for such a mixed pattern. head_dim is free of hidden/heads
(Mistral-Nemo: 5120 / 32 heads, head_dim 128).

Mistral3ForConditionalGeneration (model_type `mistral3`: Mistral Small 3.1 and 3.2) is read as its
text decoder when that is a mistral one (`text_config.model_type`; another, as Ministral 3's `ministral3`
or a `mistral4`, is refused by name): `text_config` (Mistral3Config's own when absent),
tied as the top-level `tie_word_embeddings` says (default true; a stored head of its own is kept, as
published files hold one: `hf_wrapper`); the text weights under `language_model.model.` on disk
(`model.language_model.` in memory), the vision tower and projector dropped. Export writes the
text-only MistralForCausalLM.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import (
    STATES_VOCAB_AND_ROPE,
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
from ..tables.hf_wrapper import nested_text_config, wrapped
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


# Mistral3Config's text decoder when config.json has none (Mistral Small 3.1's)
MISTRAL3_TEXT = {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
                 "intermediate_size": 32768, "max_position_embeddings": 131072, "model_type": "mistral",
                 "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                 "rope_theta": 1000000000.0, "sliding_window": None, "vocab_size": 131072}

CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, window_to_hf),),
    defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32},
    nullable={"num_key_value_heads": False, "attention_dropout": False},
    decoder=lambda data: nested_text_config(data, "mistral3", ("mistral",), MISTRAL3_TEXT),
)
# Mistral3ForConditionalGeneration's text decoder, its vision tower and projector left out
TENSORS = wrapped(llama.TENSORS, "vision_tower", "multi_modal_projector")


# -- llama.cpp (GGUF)
# llama.cpp writes Mistral as `llama`; like transformers, tell it by its general.name
GGUF_MISTRAL = GgufArch("mistral", arch="llama", named="mistral", keys={"attention.sliding_window": "sliding_window"},
                            defaults={"hidden_act": "silu", "sliding_window": None}, permute_qk=True,
                            stated=STATES_VOCAB_AND_ROPE)


FAMILY = Family("mistral", ("mistral", "mistral3"), "MistralForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MISTRAL,),
                notes={"mistral3": "Mistral3ForConditionalGeneration (model_type mistral3): only the text decoder "
                                   "is read; the vision tower and multi-modal projector are left out"})
