"""One test spec per family (or per second model of one, `stablelm_qk`): a module here defining
`SPEC`, found by tests/family_specs.py without a list to edit. A spec is the tiny perturbed
transformers model the family tests share: its config overrides, what `inspect` must say of it, the
older config.json style it also comes in, and, for a family added with its spec alone, its config
variants and its GGUF test model. Every sequence is several windows long, and the soft-caps are
small enough to bite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WINDOW = 4
SEQ = 28  # seven windows long
ATTN_CAP, FINAL_CAP = 2.0, 3.0
S, F = "sliding_attention", "full_attention"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
YARN = {"factor": 4.0, "original_max_position_embeddings": 32}
LONGROPE = {"short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [2.0, 3.0, 5.0, 8.0]}  # 4 = 16 * 0.5 / 2


@dataclass(frozen=True)
class Spec:
    model_type: str
    kwargs: dict[str, Any]
    # transformers 4 keys that replace rope_parameters in a hand-written config.json, or the llama-era names
    # a GPT-2-era config class also reads (its attribute_map)
    old_style: dict[str, Any]
    card: tuple[str, ...]  # what `lmconvert inspect` must say
    old_drop: tuple[str, ...] = ()  # further keys a transformers 4 file lacks (derived by transformers)
    layer_types: tuple[list[str], tuple[str, ...]] | None = None  # a non-default layer_types, the kinds it means
    not_on_card: tuple[str, ...] = ()  # what it must not say
    sdpa: bool = True  # transformers runs it with SDPA (GPT-Neo and XGLM have only their own attention)
    rope: bool = True  # config.json states rope_parameters (the families with RoPE)
    # transformers reads an older config.json style of this model_type (False: a model_type newer than transformers
    # 4 whose config class reads no older keys, Mellum's: there is one style, and nothing to compare it with)
    old_styled: bool = True
    bf16_exact: bool = True  # our bf16 logits equal transformers' bf16 logits bit for bit on CPU (False: say why)
    family: str = ""  # the lmconvert family, where the entry is a second model of one (stablelm_qk); "": its name
    # transformers-written configs of this model_type in which every stated key takes effect
    # (tests/test_config_table.py; the families there before specs held them have theirs in its VARIANTS)
    config_variants: tuple[dict[str, Any], ...] = ()
    # the overrides of `kwargs` that llama.cpp's architecture holds whole: the model GGUF out is tested on
    # (tests/test_export_gguf.py, and llama.cpp itself in tests/test_llamacpp.py); None: no GGUF test model here
    gguf: dict[str, Any] | None = None
    # why its tiny model cannot split tensor-parallel over 2 and 4 ranks (tests/test_tensor_parallel.py); "": it can
    tp_refusal: str = ""

