"""SmolLM3.

Same as llama, except: some layers use no positions at all (NoPE): `no_rope_layers[i]` is 1 where
layer i rotates and 0 where it does not (inverted naming), by default every `no_rope_layer_interval`-th
layer (4: layers 3, 7, 11, ...) is NoPE; a sliding window covers the `sliding_attention` layers of
`layer_types`, which default to the NoPE layers when `use_sliding_window` is true and
`sliding_window` is set (transformers' eager mask follows `layer_types` and `sliding_window`);
rope_theta defaults to 2e6; embeddings are tied by default.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    STATES_VOCAB_AND_ROPE,
    written,
)
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layer_types_to_hf,
    window_fields,
)
from . import llama

NO_ROPE_KEYS = (Key("no_rope_layers", list, None, nullable=True), Key("no_rope_layer_interval", int, 4))


def positions_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n_layers, interval = fields["n_layers"], hf.get("no_rope_layer_interval")
    flags = hf.get("no_rope_layers")
    if flags is None:
        flags = default_flags(n_layers, interval)
    if len(flags) != n_layers or any(flag not in (0, 1) or isinstance(flag, float) for flag in flags):
        raise MappingError(f"config.json: no_rope_layers={show(flags)} should hold 1 (RoPE) or 0 (no positions) "
                           f"for each of the num_hidden_layers={n_layers} layers")
    return {"layer_positions": tuple("rope" if flag else "none" for flag in flags)}


def default_flags(n_layers: int, interval: int) -> list[int]:
    return [int((i + 1) % interval != 0) for i in range(n_layers)]


def positions_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The flags, and the interval they follow (the default one where it fits) so a file that
    derives them says the same. A position scheme other than RoPE or none reads back as none, so
    export refuses it by name."""
    flags = [int(p == "rope") for p in cfg.layer_positions]
    candidates = (NO_ROPE_KEYS[1].default, *range(1, cfg.n_layers + 2))
    fits = [k for k in candidates if default_flags(cfg.n_layers, k) == flags]
    return {"no_rope_layers": flags, "no_rope_layer_interval": fits[0] if fits else DEFAULT}


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window")
    use = hf.get("use_sliding_window") and window is not None
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: use and fields["layer_positions"][i] == "none")
    return window_fields(kinds, window)


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"use_sliding_window": "local" in cfg.layer_kinds, "sliding_window": cfg.sliding_window,
            "layer_types": layer_types_to_hf(cfg.layer_kinds)}


CONFIG = llama.CONFIG.but(
    add=(Entry("NoPE layers", NO_ROPE_KEYS, positions_from_hf, positions_to_hf),
         Entry("layer kinds", (Key("use_sliding_window", bool, False), SLIDING_WINDOW_KEY, LAYER_TYPES_KEY),
               window_from_hf, window_to_hf)),
    defaults={"vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
              "num_key_value_heads": 4, "max_position_embeddings": 32768, "tie_word_embeddings": True,
              "rope_theta": 2000000.0, "sliding_window": None},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not a SmolLM3Config key, read if stated
)


# -- llama.cpp (GGUF)
GGUF_SMOLLM3 = written("smollm3", arch="smollm3", defaults={"hidden_act": "silu", "no_rope_layer_interval": 4,
                                                 "use_sliding_window": False},
                       stated=STATES_VOCAB_AND_ROPE,
                            bias_flags=ATTENTION_BIAS_FLAG, permute_qk=True, head_dim_stated=False)


FAMILY = Family("smollm3", ("smollm3",), "SmolLM3ForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_SMOLLM3,))
