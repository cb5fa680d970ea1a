"""Gemma 4 text decoders: Gemma4ForCausalLM checkpoints (model_type gemma4_text) and the text half of
Gemma4ForConditionalGeneration ones (model_type gemma4).

Same as gemma4_unified_text, except: `max_position_embeddings` defaults to 131072 and `sliding_window` to 512;
`use_bidirectional_attention` defaults to null (causal; "vision" is causal for text too, "all" is refused); the
per-layer embeddings (`hidden_size_per_layer_input`, default 256, 0 for none; `vocab_size_per_layer_input`): a
second embedding table, projected and gated into every layer as gemma3n_text's (their tensors named as there),
added to the residual before the layer scalar, the constants multiplied as Python floats and no id clamped; the
mixture of experts beside the dense MLP (`enable_moe_block`) is not read yet: a checkpoint with it is refused by
name.

Gemma4ForConditionalGeneration nests the text config under `text_config` and keeps `tie_word_embeddings` at the
top level; its text weights sit under `model.language_model.`, its vision and audio towers and embedders are
dropped. Export writes the text-only Gemma4ForCausalLM layout.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import unsupported
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.table import TensorTable
from . import gemma4_unified_text as unified
from .gemma3n_text import PLE_LAYER_RULES, PLE_RULES, ple_entry

TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio")
TENSORS = wrapped(TensorTable(PLE_RULES + unified.TEXT_TENSORS.rules + PLE_LAYER_RULES), *TOWERS, legacy=False)


CONFIG = unified.CONFIG.but(
    add=(
        unsupported("use_bidirectional_attention", str, "vision", "bidirectional attention over every token",
                    "causal Gemma 4", default=None, nullable=True),
        ple_entry("python", bound="non_negative"),
        unsupported("enable_moe_block", bool, False, "a mixture of experts beside the dense MLP", "Gemma 4"),
    ),
    defaults={"max_position_embeddings": 131_072, "sliding_window": 512},
    decoder=lambda data: nested_text_config(data, "gemma4", ("gemma4_text",), {"model_type": "gemma4_text"}),
)

FAMILY = Family("gemma4_text", ("gemma4_text", "gemma4"), "Gemma4ForCausalLM", TENSORS, CONFIG,
                notes={"gemma4": "Gemma4ForConditionalGeneration (model_type gemma4): only the text decoder is read; "
                                 "the vision and audio towers and embedders are left out"},
                no_gguf=unified.FAMILY.no_gguf, reference_layouts=unified.REFERENCE_LAYOUTS)
