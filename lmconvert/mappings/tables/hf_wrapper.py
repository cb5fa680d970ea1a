"""Multimodal wrappers read as their text decoder: the part of a wrapper's config.json that is the
decoder, and the tensor rules that leave its towers out.

A wrapper (Mistral3ForConditionalGeneration, GotOcr2ForConditionalGeneration, ...) nests its text
decoder's config under `text_config` (absent or null: the wrapper class's default text decoder)
and keeps `tie_word_embeddings` at the top level, where transformers 5 reads it (the wrapper
class's default, true, when absent; `text_config`'s own is ignored). Files written before
transformers 5 state it nowhere and, untied, hold their own LM head: transformers 5 keeps a stored
head that differs from the embeddings, and so does the import (`formats/checkpoint.py`).
"""

from __future__ import annotations

from typing import Any

from ..errors import MappingError
from .hf_config import show
from .table import Rule, TensorTable


def nested_text_config(data: dict[str, Any], wrapper: str, text_types: tuple[str, ...],
                       default: dict[str, Any], tie: bool = True, key: str = "text_config") -> dict[str, Any]:
    """The decoder's config of a `wrapper` config.json: its `key` (`text_config`; absent or null:
    `default`, the wrapper class's own) with the embedding tying the wrapper decides (`tie` when
    the top level does not state it); `text_types` are the text model_types this family reads (the
    first is transformers' default for the wrapper when the text config names none). Any other
    config.json is returned as it is."""
    if data.get("model_type") != wrapper:
        return data
    text = data.get(key)
    if text is None:
        text = default
    if not isinstance(text, dict):
        raise MappingError(f"config.json: {key}={show(text)} should be a JSON object (the {wrapper} model's text "
                           "decoder)")
    kind = text.get("model_type", text_types[0])
    if kind not in text_types:
        raise MappingError(f"config.json: {key}.model_type={show(kind)}: lmconvert reads {wrapper} only around a "
                           f"{' or '.join(text_types)} text decoder")
    text = dict(text)
    text["tie_word_embeddings"] = data.get("tie_word_embeddings", tie)
    text["model_type"] = kind
    return text


# where a wrapper keeps its text model: on disk as transformers saves LLaVA-style wrappers
# (`language_model.model.`), in memory and in newer files (`model.language_model.`)
TEXT_PREFIXES = ("model.language_model.", "language_model.model.")


def wrapped(table: TensorTable, *towers: str, legacy: bool = True) -> TensorTable:
    """`table` that also reads a wrapper's text model under `TEXT_PREFIXES` and drops its towers
    (`dropped_towers`); export still writes the text-only names, the table's own rules coming first."""
    return TensorTable(table.rules + dropped_towers(*towers, legacy=legacy), hf_prefixes=TEXT_PREFIXES)


def dropped_towers(*towers: str, legacy: bool = True) -> tuple[Rule, ...]:
    """Drop rules for a wrapper's towers (vision or audio encoders, projectors), each under
    `model.` and, for a LLaVA-style wrapper (`legacy`), also at the top level as transformers saves
    them, with the older layout's `language_model.lm_head`."""
    rules = tuple(Rule(f"model.{tower}.*", None) for tower in towers)
    if legacy:
        rules += (Rule("language_model.lm_head.weight", "lm_head.weight"),
                  *(Rule(f"{tower}.*", None) for tower in towers))
    return rules
