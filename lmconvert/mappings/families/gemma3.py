"""Gemma 3 text decoders: Gemma3ForCausalLM checkpoints (model_type gemma3_text) and the text half
of Gemma3ForConditionalGeneration ones (model_type gemma3).

Same as gemma2, except: no soft-capping of scores (transformers stores `attn_logit_softcapping`
but never applies it) and `final_logit_softcapping` defaults to None; per-head q_norm / k_norm
(Gemma's `1 + w` RMSNorm over head_dim) before RoPE; `layer_types` defaults to every
`sliding_window_pattern`-th layer (6) full and the rest sliding; RoPE is set per layer type, either
as nested `rope_parameters` {"sliding_attention": ..., "full_attention": ...} or, in older files,
as `rope_theta` (full layers, default 1e6), `rope_local_base_freq` (sliding layers, default 1e4)
and `rope_scaling` (full layers only); full layers use `rope`, sliding ones `rope_local`.

A Gemma3ForConditionalGeneration config.json nests the text config under `text_config` and keeps
`tie_word_embeddings` at the top level; its text weights sit under `language_model.model.` on
disk (`model.language_model.` in memory), and its vision tower and projector are dropped. That
model never applies `final_logit_softcapping`, so neither does the import. Export always writes
the text-only Gemma3ForCausalLM layout.
"""

from __future__ import annotations

import copy
from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import Entry, fixed
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    GEMMA_KEYS,
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from . import gemma2, llama

MULTIMODAL_RULES = (
    Rule("language_model.lm_head.weight", "lm_head.weight"),  # untied, older layout
    Rule("vision_tower.*", None), Rule("multi_modal_projector.*", None),
    Rule("model.vision_tower.*", None), Rule("model.multi_modal_projector.*", None),
)
TENSORS = TensorTable(gemma2.TENSORS.rules + llama.QK_NORM_RULES + MULTIMODAL_RULES,
                      hf_prefixes=("model.language_model.", "language_model.model."))
THETA_KEYS = {"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}  # older files


def text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The text decoder's config: the file itself, or for Gemma3ForConditionalGeneration its
    `text_config` with the settings that model takes from elsewhere."""
    if data.get("model_type") != "gemma3" and "text_config" not in data:
        return data
    text = data.get("text_config") or {}
    if not isinstance(text, dict):
        raise MappingError(f"config.json: text_config={show(text)} should be a JSON object")
    tie = data.get("tie_word_embeddings", True)
    if tie is not None and not isinstance(tie, bool):
        raise MappingError(f"config.json: tie_word_embeddings={show(tie)} should be true or false; "
                           f"remove the key for the default (true)")
    text = dict(text)
    text["tie_word_embeddings"] = bool(tie)  # null: untied, as in transformers
    text["final_logit_softcapping"] = None
    return text


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    pattern = hf.get("sliding_window_pattern")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % pattern != 0)
    return window_fields(kinds, hf.get("sliding_window"))


def rope_by_layer_type(hf: HfConfig) -> dict[str, dict[str, Any]]:
    """Per-layer-type rope parameter dicts, merged the way Gemma3TextConfig does it."""
    nested, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling")
    params = {}
    for kind in THETA_KEYS:
        value = nested.get(kind)
        if not isinstance(value, dict | None):
            raise MappingError(f"config.json: rope_parameters.{kind}={show(value)} should be a JSON object")
        params[kind] = copy.deepcopy(value) or {"rope_type": "default"}
    if scaling:
        params["full_attention"].update(scaling)
    return params


def rope_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Full layers use `rope`, sliding ones `rope_local` (None when it is the same)."""
    params, kinds = rope_by_layer_type(hf), fields["layer_kinds"]
    full, sliding = (hf_rope.rope_from_hf(hf, params[k], f"rope_parameters.{k}.", theta=hf.get(THETA_KEYS[k]))
                     for k in ("full_attention", "sliding_attention"))
    return hf_rope.rope_by_kind(full, sliding, kinds)


CONFIG = gemma2.CONFIG.but(
    drop=("attn_logit_softcapping", "rope"),
    add=(
        fixed("QK norm", qk_norm="head"),
        Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, Key("sliding_window_pattern", int, 6, legacy=True)),
              window_from_hf, layers_and_window_to_hf),
        Entry("rope by layer type", (*hf_rope.KEYS, Key("rope_local_base_freq", float, 10_000.0, legacy=True)),
              rope_from_hf, hf_rope.rope_by_layer_type_to_hf),
    ),
    defaults={"vocab_size": 262_208, "max_position_embeddings": 131_072, "final_logit_softcapping": None,
              "use_bidirectional_attention": False, "rope_theta": 1_000_000.0},
    decoder=text_config,
)


# -- llama.cpp (GGUF)
GGUF_GEMMA3 = GgufArch("gemma3_text", arch="gemma3", keys={**GEMMA_KEYS, "rope.freq_base_swa": "rope_local_base_freq"},
                          defaults={"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
                                    "rope_local_base_freq": 10000.0},
                          bias_flags=ATTENTION_BIAS_FLAG, norm_offset=1.0, swa_pattern=6, big_layers=62)


# q_proj(x).view(B, T, -1, D).transpose(1, 2), then q_norm
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("gemma3", ("gemma3_text", "gemma3"), "Gemma3ForCausalLM", TENSORS, CONFIG,
                notes={"gemma3": "Gemma3ForConditionalGeneration (model_type gemma3): only the text decoder is read; "
                          "the vision tower and multi-modal projector are left out"},
                gguf=(GGUF_GEMMA3,), reference_layouts=REFERENCE_LAYOUTS)
