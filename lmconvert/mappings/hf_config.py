"""Typed reading of a transformers config dict, and the RoPE keys shared by every family.

Hub config.json files come in two styles: transformers 4's `rope_theta` + `rope_scaling`, and
transformers 5's `rope_parameters`. Both are read here, the way transformers' own
`convert_rope_params_to_dict` merges them; export always writes `rope_parameters`.
"""

from __future__ import annotations

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

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None


ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
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
    if kind not in ROPE_TYPES:
        raise MappingError(f"config.json: unsupported RoPE type {kind!r}; supported: {', '.join(ROPE_TYPES)}")
    theta = params.get("rope_theta") or hf.get("rope_theta", float)
    values: dict[str, Any] = {"theta": float(theta), "scaling": ROPE_TYPES[kind]}
    for key, name in _ROPE_KEYS.items():
        if params.get(key) is not None:
            values[name] = params[key]
    max_pos = hf.get("max_position_embeddings", int)
    if kind in ("yarn", "llama3"):
        values.setdefault("original_max_positions", max_pos)
    if kind == "yarn" and params.get("factor") is None:
        values["factor"] = max_pos / values["original_max_positions"]
    fraction = params.get("partial_rotary_factor", hf.data.get("partial_rotary_factor"))
    if fraction is not None and kind != "default":  # the default init ignores it in llama-style models
        values["fraction"] = float(fraction)
    values.update(fixed)
    try:
        return RopeConfig(**values)
    except (TypeError, ValueError) as exc:
        raise MappingError(f"config.json: rope parameters {params!r}: {exc}") from None


def rope_to_hf(rope: RopeConfig) -> dict[str, Any]:
    kind = {v: k for k, v in ROPE_TYPES.items()}[rope.scaling]
    out: dict[str, Any] = {"rope_type": kind, "rope_theta": rope.theta}
    defaults = RopeConfig()
    relevant = {
        "linear": ("factor",), "dynamic": ("factor",),
        "yarn": ("factor", "original_max_positions", "beta_fast", "beta_slow", "attention_factor",
                 "mscale", "mscale_all_dim", "truncate"),
        "llama3": ("factor", "original_max_positions", "low_freq_factor", "high_freq_factor"),
    }.get(rope.scaling, ())
    for key, name in _ROPE_KEYS.items():
        value = getattr(rope, name)
        if name in relevant and (name in ("factor", "original_max_positions") or value != getattr(defaults, name)):
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
