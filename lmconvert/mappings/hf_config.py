"""Typed reading of a transformers config dict, and the RoPE and layer-type keys shared by families.

Hub config.json files come in two styles: transformers 4's `rope_theta` + `rope_scaling`, and
transformers 5's `rope_parameters`. Both are read here, the way transformers' own
`convert_rope_params_to_dict` merges them; export always writes `rope_parameters`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmconvert.arch import RopeConfig

from .errors import MappingError

_TYPES: dict[type, tuple[type, ...]] = {int: (int,), float: (int, float), bool: (bool,), str: (str,),
                                        dict: (dict,), list: (list,)}


class HfConfig:
    """A config.json dict with defaults and type checks that name the offending key."""

    def __init__(self, data: dict[str, Any], defaults: dict[str, Any]) -> None:
        if not isinstance(data, dict):
            raise MappingError("config.json: expected a JSON object")
        self.data, self.defaults = data, defaults

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        """The value of `key`: an explicit null stays None; an absent key takes `default`, else
        the family's default, else it is an error."""
        if key in self.data:
            value = self.data[key]
        elif default is not ...:
            value = default
        elif key in self.defaults:
            value = self.defaults[key]
        else:
            raise MappingError(f"config.json: required key {key!r} is missing; add it from the model card")
        if value is None:
            return None
        if isinstance(value, bool) and kind is not bool or not isinstance(value, _TYPES[kind]):
            raise MappingError(f"config.json: {key}={value!r} should be of type {kind.__name__}")
        return float(value) if kind is float else value

    def positive(self, key: str, kind: type) -> Any:
        """Like get, for a value that must be a finite number > 0 (a divisor, a scale)."""
        value = self.get(key, kind)
        if value is None or not 0 < value < float("inf"):
            raise MappingError(f"config.json: {key}={self.data.get(key, value)!r} should be a positive number")
        return value

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None


ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
# rope_type -> (the RopeConfig fields it reads, those of them transformers' validation requires)
_READS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ("factor",)), "dynamic": (("factor",), ("factor",)),
    "yarn": (("factor", "original_max_positions", "beta_fast", "beta_slow", "attention_factor",
              "mscale", "mscale_all_dim", "truncate"), ("factor", "original_max_positions")),
    "llama3": (("factor", "original_max_positions", "low_freq_factor", "high_freq_factor"),) * 2,
}
_ROPE_KEYS = {  # rope_parameters key -> RopeConfig field
    "factor": "factor", "original_max_position_embeddings": "original_max_positions",
    "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
    "beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attention_factor",
    "mscale": "mscale", "mscale_all_dim": "mscale_all_dim", "truncate": "truncate",
}


def rope_parameters(hf: HfConfig) -> dict[str, Any]:
    """The merged rope parameter dict, whichever style the file uses (rope_scaling wins, as in
    transformers)."""
    params = hf.data.get("rope_scaling") or hf.data.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise MappingError(f"config.json: rope_parameters={params!r} should be an object")
    return dict(params)


def rope_from_hf(hf: HfConfig, params: dict[str, Any], **fixed: Any) -> RopeConfig:
    """RopeConfig from one (non-nested) rope parameter dict; `fixed` sets family constants."""
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        raise MappingError(f"config.json: unsupported RoPE type {kind!r}; supported: {', '.join(ROPE_TYPES)}")
    theta = params.get("rope_theta") or hf.get("rope_theta", float)
    values: dict[str, Any] = {"theta": theta, "scaling": ROPE_TYPES[kind]}
    for key, name in _ROPE_KEYS.items():  # only what this type reads: a stray key changes nothing
        if name in _READS[kind][0] and params.get(key) is not None:
            values[name] = params[key]
    max_pos = hf.get("max_position_embeddings", int)
    if kind in ("yarn", "llama3"):
        values.setdefault("original_max_positions", max_pos)
    fraction = params.get("partial_rotary_factor", hf.data.get("partial_rotary_factor"))
    if fraction is not None and kind != "default":  # the default init ignores it in llama-style models
        values["fraction"] = fraction
    try:
        for name in ("theta", "fraction"):
            if name in values:
                values[name] = _number(values[name])
        if kind == "yarn" and params.get("factor") is None:
            values["factor"] = max_pos / values["original_max_positions"]
        values.update(fixed)
        return RopeConfig(**values)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise MappingError(f"config.json: rope parameters {params!r}: {exc}") from None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def rope_to_hf(rope: RopeConfig) -> dict[str, Any]:
    kind = {v: k for k, v in ROPE_TYPES.items()}[rope.scaling]
    out: dict[str, Any] = {"rope_type": kind, "rope_theta": rope.theta}
    defaults = RopeConfig()
    relevant, required = _READS[kind]
    for key, name in _ROPE_KEYS.items():
        value = getattr(rope, name)
        if name in relevant and (name in required or value != getattr(defaults, name)):
            out[key] = value
    if rope.fraction != 1.0:
        out["partial_rotary_factor"] = rope.fraction
    return out


ACTIVATIONS_FROM_HF = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                       "relu": "relu", "relu2": "relu2"}
ACTIVATIONS_TO_HF = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu",
                     "relu2": "relu2"}


def activation_from_hf(hf: HfConfig, key: str) -> str:
    name = hf.get(key, str)
    if name not in ACTIVATIONS_FROM_HF:
        raise MappingError(f"config.json: {key}={name!r} is not supported; "
                           f"supported: {', '.join(ACTIVATIONS_FROM_HF)}")
    return ACTIVATIONS_FROM_HF[name]


LAYER_TYPES = {"sliding_attention": "local", "full_attention": "global"}
LEGACY_LAYER_TYPES = {"attention": "full_attention"}  # transformers renames these on load


def layer_kinds_from_hf(hf: HfConfig, n_layers: int, sliding: Callable[[int], bool]) -> tuple[str, ...]:
    """Local/global per layer: from `layer_types` when config.json states it (transformers 5 writes
    it, and it wins over every older key), else from the family's rule `sliding(layer index)`."""
    types = hf.data.get("layer_types")
    if types is None:
        return tuple("local" if sliding(i) else "global" for i in range(n_layers))
    if isinstance(types, list):
        types = [LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in types]
    if (not isinstance(types, list) or len(types) != n_layers
            or any(not isinstance(t, str) or t not in LAYER_TYPES for t in types)):
        raise MappingError(f"config.json: layer_types={types!r} should name one of {', '.join(LAYER_TYPES)} "
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
