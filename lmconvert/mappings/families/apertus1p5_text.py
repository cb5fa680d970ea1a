"""Apertus 1.5's text decoder (model_type `apertus1p5_text`, Apertus1p5TextForCausalLM).

Same as apertus, except: `output_vocab_size` (default null) gives the LM head fewer rows than the
embedding table, the first `output_vocab_size` ids (a pruned head; the logits are that wide), null
or equal to `vocab_size` meaning the whole vocabulary, and a value above it refused as transformers
refuses it; its own vocab_size default (266752). The multimodal wrapper (model_type `apertus1p5`,
with its image and audio tokenizers) is not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, Key
from . import apertus

OUTPUT_VOCAB = Key("output_vocab_size", int, None, nullable=True)


def output_vocab_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    value, vocab = hf.get(OUTPUT_VOCAB.name), fields["vocab_size"]
    if value is not None and value > vocab:
        raise MappingError(f"config.json: output_vocab_size={value} must be in [1, vocab_size={vocab}] "
                           "(transformers refuses it too)")
    return {"output_vocab": value}


def output_vocab_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {OUTPUT_VOCAB.name: cfg.output_vocab}


CONFIG = apertus.CONFIG.but(
    add=(Entry("output vocab", (OUTPUT_VOCAB,), output_vocab_from_hf, output_vocab_to_hf),),
    defaults={"vocab_size": 266752},
)

FAMILY = Family("apertus1p5_text", ("apertus1p5_text",), "Apertus1p5TextForCausalLM", apertus.TENSORS, CONFIG,
                reference_layouts=apertus.REFERENCE_LAYOUTS)
