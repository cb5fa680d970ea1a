"""The local/global layer keys shared by the families with a sliding window: `layer_types` (which
transformers 5 writes and which wins over every older key) and `sliding_window`. Each family adds
its own rule for a file without `layer_types`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from .config_table import DEFAULT
from .hf_config import HfConfig, Key, show

LAYER_TYPES_KEY = Key("layer_types", list, None, nullable=True)
SLIDING_WINDOW_KEY = Key("sliding_window", int, 4096, nullable=True)  # null: no window

LAYER_TYPES = {"sliding_attention": "local", "full_attention": "global"}
LEGACY_LAYER_TYPES = {"attention": "full_attention"}  # transformers renames these on load


def layer_kinds_from_hf(hf: HfConfig, n_layers: int, sliding: Callable[[int], bool]) -> tuple[str, ...]:
    """Local/global per layer: from `layer_types` when config.json states it, else from the
    family's rule `sliding(layer index)`."""
    types = hf.get("layer_types")
    if types is None:
        return tuple("local" if sliding(i) else "global" for i in range(n_layers))
    types = [LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in types]
    if len(types) != n_layers or any(not isinstance(t, str) or t not in LAYER_TYPES for t in types):
        raise MappingError(f"config.json: layer_types={show(types)} should name one of {', '.join(LAYER_TYPES)} "
                           f"for each of the num_hidden_layers={n_layers} layers")
    return tuple(LAYER_TYPES[t] for t in types)


def layer_types_to_hf(kinds: tuple[str, ...]) -> list[str]:
    names = {v: k for k, v in LAYER_TYPES.items()}
    return [names[k] for k in kinds]


def window_fields(kinds: tuple[str, ...], window: int | None) -> dict[str, Any]:
    """ArchConfig's layer_kinds and sliding_window. A window that no layer uses is dropped, so two
    configs that compute the same function translate to the same ArchConfig."""
    if "local" in kinds and window is None:
        raise MappingError("config.json: some layers are sliding_attention but there is no sliding window "
                           "(sliding_window is null, or use_sliding_window is false); transformers cannot run "
                           "this either; set sliding_window or make every layer full_attention")
    return {"layer_kinds": kinds, "sliding_window": window if "local" in kinds else None}


def layers_and_window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """`layer_types` and `sliding_window`, the window never null: transformers builds the sliding mask
    whether a layer uses it or not, and some config classes refuse null, so a window no layer uses is
    written as the key's default."""
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds),
            "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window}


def layer_mixers_from_types(types: Any, n_layers: int, names: dict[str, str]) -> tuple[str, ...]:  # noqa: ANN401
    """A hybrid stack's `layer_types` as `ArchConfig.layer_mixers`: `names` maps each type the family
    knows to "attention" or "mixer"; a list of another length or type is refused naming the key."""
    if not isinstance(types, list) or len(types) != n_layers \
            or any(not isinstance(t, str) or t not in names for t in types):
        raise MappingError(f"config.json: layer_types={show(types)} should name one of {', '.join(names)} "
                           f"for each of the num_hidden_layers={n_layers} layers")
    return tuple(names[t] for t in types)
