"""Gemma 4 text decoders: Gemma4ForCausalLM checkpoints (model_type gemma4_text) and the text half of
Gemma4ForConditionalGeneration ones (model_type gemma4).

Same as gemma4_unified_text, except: `max_position_embeddings` defaults to 131072 and `sliding_window` to 512;
`use_bidirectional_attention` defaults to null (causal; "vision" is causal for text too, "all" is refused); the
per-layer embeddings (`hidden_size_per_layer_input`, default 256: a second embedding table projected and gated into
every layer) and the mixture of experts beside the dense MLP (`enable_moe_block`) are not read yet: a checkpoint
with either is refused by name, so only `hidden_size_per_layer_input` 0 without the MoE block converts.

Gemma4ForConditionalGeneration nests the text config under `text_config` and keeps `tie_word_embeddings` at the
top level; its text weights sit under `model.language_model.`, its vision and audio towers and embedders are
dropped. Export writes the text-only Gemma4ForCausalLM layout.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import Entry, unsupported
from ..tables.hf_wrapper import nested_text_config, wrapped
from . import gemma4_unified_text as unified

TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio")
TENSORS = wrapped(unified.TEXT_TENSORS, *TOWERS, legacy=False)

def _written_as_inert(entry: Entry) -> Entry:
    """An `unsupported` row whose transformers default is not its inert value (PLE on by default): export writes
    the inert value (0, no per-layer embeddings), which is what the model has."""
    key = entry.keys[0]
    return Entry(entry.name, entry.keys, entry.read, lambda cfg: {key.name: 0})


CONFIG = unified.CONFIG.but(
    add=(
        unsupported("use_bidirectional_attention", str, "vision", "bidirectional attention over every token",
                    "causal Gemma 4", default=None, nullable=True),
        _written_as_inert(unsupported("hidden_size_per_layer_input", int, 0, "per-layer embeddings (PLE)",
                                      "Gemma 4", default=256, bound="non_negative")),
        unsupported("enable_moe_block", bool, False, "a mixture of experts beside the dense MLP", "Gemma 4"),
    ),
    defaults={"max_position_embeddings": 131_072, "sliding_window": 512},
    decoder=lambda data: nested_text_config(data, "gemma4", ("gemma4_text",), {"model_type": "gemma4_text"}),
)

FAMILY = Family("gemma4_text", ("gemma4_text", "gemma4"), "Gemma4ForCausalLM", TENSORS, CONFIG,
                notes={"gemma4": "Gemma4ForConditionalGeneration (model_type gemma4): only the text decoder is read; "
                                 "the vision and audio towers and embedders are left out"},
                no_gguf=unified.FAMILY.no_gguf, reference_layouts=unified.REFERENCE_LAYOUTS)
