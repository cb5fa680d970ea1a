"""EXAONE 4.0 (Exaone4ForCausalLM: EXAONE-4.0-32B, EXAONE-4.0-1.2B).

Same as olmo2, except: the norms are llama's RMSNorm (statistics in fp32, the weight multiplied
after the cast back); q_norm / k_norm normalise each head over head_dim (after the heads move
before time), before RoPE; `layer_types` (default: every `sliding_window_pattern`-th layer full, 4,
the others sliding) picks the layers that attend within `sliding_window` (default 4096); when
there is a sliding window only the sliding layers rotate, the full-attention layers have no
position encoding at all (NoPE), and without one (`sliding_window` null, as EXAONE-4.0-1.2B) every
layer rotates; there are no biases (no `attention_bias` key); RoPE is llama's, theta default 10000.
`sliding_window_pattern` may be a string ("LLLG", as the released files have it), which
transformers reads only through `layer_types`: without `layer_types`, only a positive integer
pattern and a stated window give a model transformers can build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layer_types_to_hf,
    window_fields,
)
from ..tables.points import QK_NORM_HEADS_FIRST
from . import llama, olmo2


@dataclass(frozen=True)
class PatternKey(Key):
    """`sliding_window_pattern`, which Exaone4Config types `str | int | None`: a string is kept as
    it is (what it means is `layer_types`' business), a number is checked as one."""

    def check(self, value: Any, where: str = "") -> Any:
        return value if isinstance(value, str) else super().check(value, where)


# transformers writes 0 for it when sliding_window is null
PATTERN_KEY = PatternKey("sliding_window_pattern", int, 4, nullable=True, bound="non_negative", legacy=True)


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window, pattern = hf.get("sliding_window"), hf.get("sliding_window_pattern")
    if hf.get("layer_types") is None:
        if window is None:
            raise MappingError("config.json: sliding_window=null without layer_types: transformers cannot build this "
                               "model (it takes the pattern to be 0 and divides by it); state layer_types, or set "
                               "sliding_window")
        if not isinstance(pattern, int) or pattern == 0:
            raise MappingError(f"config.json: sliding_window_pattern={show(pattern)} without layer_types: "
                               f"transformers derives the layer pattern from a positive integer only; state "
                               f"layer_types, or set sliding_window_pattern to a positive integer")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % pattern != 0)
    positions = tuple("rope" if window is None or kind == "local" else "none" for kind in kinds)
    return {**window_fields(kinds, window), "layer_positions": positions}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The pattern and the window; with no sliding layer, a null window where every layer rotates
    and the default one where none does. RoPE anywhere else reads back differently, so export
    refuses it by name."""
    if "local" in cfg.layer_kinds:
        window = cfg.sliding_window
    else:
        window = None if all(p == "rope" for p in cfg.layer_positions) else DEFAULT
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds), "sliding_window": window}


CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(llama.norm(1e-5),
         fixed("output norms", norm_placement="output", qk_norm="head"),
         Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, PATTERN_KEY), layers_from_hf, layers_to_hf)),
    defaults={"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_key_value_heads": 32},
    # head_dim: not an Exaone4Config key, read if stated
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False},
)


# q_proj(x).view(B, T, -1, D).transpose(1, 2), then q_norm
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST


# -- llama.cpp (GGUF)
SWA_LAYERS = 64  # llama.cpp's exaone4 has sliding layers exactly when there are 64 (EXAONE-4.0-32B)


def _every_layer_rotates(config: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's exaone4 below 64 layers: every layer full, every layer rotating (EXAONE-4.0-1.2B,
    `sliding_window` null), whatever window the file states; so a model with sliding layers comes
    back otherwise and is refused. With 64 layers it hard-codes a window of 4096 on three layers of
    four (the last full, without RoPE), which lmconvert does not write or read."""
    n = config["num_hidden_layers"]
    if n == SWA_LAYERS:
        raise MappingError(f"llama.cpp's exaone4 hard-codes sliding layers (a window of 4096, every fourth layer "
                           f"full and without RoPE) on {SWA_LAYERS}-layer models, which lmconvert does not read or "
                           "write from GGUF; convert the original checkpoint instead")
    return {"sliding_window": None, "layer_types": ["full_attention"] * n}


# llama.cpp's exaone4 (Exaone4Model in its converter): olmo2's layout, q/k unpermuted
# llama.cpp's Exaone4Model states the vocabulary's size, and a layer pattern wherever a window is stated
GGUF_EXAONE4 = written("exaone4", arch="exaone4", defaults={"hidden_act": "silu"}, derived=_every_layer_rotates,
                       stated=frozenset({"vocab_size", "attention.sliding_window_pattern"}),
                       head_dim_stated=False)  # Exaone4Config keeps no head_dim

FAMILY = Family("exaone4", ("exaone4",), "Exaone4ForCausalLM", olmo2.TENSORS, CONFIG, gguf=(GGUF_EXAONE4,),
                reference_layouts=REFERENCE_LAYOUTS)
