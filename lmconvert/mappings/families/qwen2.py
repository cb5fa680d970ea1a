"""Qwen2 and Qwen2.5.

Same as llama, except: q, k and v always have a bias and o never has one (hard-coded in
transformers; there is no `attention_bias` key), the MLP has no bias, and a sliding window is
used only when `use_sliding_window` is true (else `sliding_window` is ignored), and then on the
layers i >= `max_window_layers`, unless config.json lists `layer_types`, which wins. head_dim is
hidden/heads unless config.json states one.

GotOcr2ForConditionalGeneration (model_type `got_ocr2`: GOT-OCR 2.0) is read as its qwen2 text
decoder: `text_config` (GotOcr2Config's own when absent), tied as the top-level
`tie_word_embeddings` says (default true; a stored head of its own is kept: `hf_wrapper`); the
text weights under `language_model.model.` on disk (`model.language_model.` in memory), the vision
tower and projector dropped. Export writes the text-only Qwen2ForCausalLM.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import (
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layer_types_to_hf,
    window_fields,
)
from ..tables.hf_wrapper import nested_text_config, wrapped
from . import llama


def sliding_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    first = hf.get("max_window_layers")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: window is not None and i >= first)
    return window_fields(kinds, window)


def sliding_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    local = [i for i, kind in enumerate(cfg.layer_kinds) if kind == "local"]
    return {"use_sliding_window": bool(local), "sliding_window": cfg.sliding_window,
            "max_window_layers": local[0] if local else DEFAULT, "layer_types": layer_types_to_hf(cfg.layer_kinds)}


# the Qwen sliding-window keys, shared with qwen3
SLIDING = Entry("layer kinds", (Key("use_sliding_window", bool, False), SLIDING_WINDOW_KEY,
                                Key("max_window_layers", int, 28, bound="non_negative"), LAYER_TYPES_KEY),
                sliding_from_hf, sliding_to_hf)

# GotOcr2Config's text decoder when config.json has none (GOT-OCR 2.0's)
GOT_OCR2_TEXT = {"vocab_size": 151860, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
                 "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu",
                 "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 21,
                 "attention_dropout": 0.0}

CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(fixed("q, k, v biases", q_bias=True, k_bias=True, v_bias=True), SLIDING),
    defaults={"vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
              "max_position_embeddings": 32768},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not a Qwen2Config key, read if stated
    decoder=lambda data: nested_text_config(data, "got_ocr2", ("qwen2",), GOT_OCR2_TEXT),
)
# GotOcr2ForConditionalGeneration's text decoder, its vision tower and projector left out
TENSORS = wrapped(llama.TENSORS, "vision_tower", "multi_modal_projector")


# -- llama.cpp (GGUF)
GGUF_QWEN2 = GgufArch("qwen2", arch="qwen2", defaults={"hidden_act": "silu", "use_sliding_window": False},
                      head_dim_stated=False)


FAMILY = Family("qwen2", ("qwen2", "got_ocr2"), "Qwen2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_QWEN2,),
                notes={"got_ocr2": "GotOcr2ForConditionalGeneration (model_type got_ocr2): only the text decoder "
                                   "is read; the vision tower and multi-modal projector are left out"})
