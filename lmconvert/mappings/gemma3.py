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

from lmconvert.arch import ArchConfig

from . import gemma2, llama
from .errors import MappingError
from .family import Family
from .hf_config import HfConfig, layer_kinds_from_hf, rope_from_hf, rope_to_hf, window_fields
from .table import Rule, TensorTable

DEFAULTS: dict[str, Any] = {
    **gemma2.DEFAULTS, "vocab_size": 262_208, "max_position_embeddings": 131_072,
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
    "sliding_window_pattern": 6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
}
MULTIMODAL_RULES = (
    Rule("language_model.lm_head.weight", "lm_head.weight"),  # untied, older layout
    Rule("vision_tower.*", None), Rule("multi_modal_projector.*", None),
    Rule("model.vision_tower.*", None), Rule("model.multi_modal_projector.*", None),
)
TENSORS = TensorTable(gemma2.TENSORS.rules + llama.QK_NORM_RULES + MULTIMODAL_RULES,
                      hf_prefixes=("model.language_model.", "language_model.model."))
ROPE_KEYS = {"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}


def text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The text decoder's config: the file itself, or for Gemma3ForConditionalGeneration its
    `text_config` with the settings that model takes from elsewhere."""
    if data.get("model_type") != "gemma3" and "text_config" not in data:
        return data
    text = data.get("text_config") or {}
    if not isinstance(text, dict):
        raise MappingError(f"config.json: text_config={text!r} should be an object")
    text = dict(text)
    text["tie_word_embeddings"] = bool(data.get("tie_word_embeddings", True))  # null: untied, as in transformers
    text["final_logit_softcapping"] = None
    return text


def rope_by_layer_type(hf: HfConfig) -> dict[str, dict[str, Any]]:
    """Per-layer-type rope parameter dicts, merged the way Gemma3TextConfig does it."""
    nested, scaling = hf.data.get("rope_parameters") or {}, hf.data.get("rope_scaling")
    params = {kind: copy.deepcopy(nested.get(kind)) or {"rope_type": "default"}
              for kind in ROPE_KEYS} if isinstance(nested, dict) else {}
    if not params or not all(isinstance(p, dict) for p in params.values()) or not isinstance(scaling, dict | None):
        raise MappingError("config.json: rope_parameters should be an object holding a 'sliding_attention' and a "
                           "'full_attention' object, and rope_scaling an object")
    if scaling:
        params["full_attention"].update(scaling)
    for kind, key in ROPE_KEYS.items():
        params[kind].setdefault("rope_theta", hf.get(key, float))
    return params


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(text_config(data), DEFAULTS)
    fields = gemma2.gemma_fields(hf)
    pattern = hf.positive("sliding_window_pattern", int)
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % pattern != 0)
    params = rope_by_layer_type(hf)
    full, sliding = (rope_from_hf(hf, params[k]) for k in ("full_attention", "sliding_attention"))
    if "global" not in kinds:
        full = sliding
    return ArchConfig(**fields, qk_norm="head", rope=full,
                      rope_local=sliding if "local" in kinds and sliding != full else None,
                      final_softcap=hf.get("final_logit_softcapping", float),
                      **window_fields(kinds, hf.get("sliding_window", int)))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    rope = {"full_attention": rope_to_hf(cfg.rope), "sliding_attention": rope_to_hf(cfg.rope_local or cfg.rope)}
    return {**gemma2.gemma_to_hf(cfg), "rope_parameters": rope, "final_logit_softcapping": cfg.final_softcap}


FAMILY = Family("gemma3", ("gemma3_text", "gemma3"), "Gemma3ForCausalLM", TENSORS, from_hf, to_hf,
                note="Gemma3ForConditionalGeneration (model_type gemma3): only the text decoder is converted; "
                     "the vision tower and multi-modal projector were left out")
