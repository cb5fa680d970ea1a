"""Typed reading of a transformers config dict: every key a family reads is declared once, as a
`Key`, with its JSON type, its range, what an absent key means and whether null is allowed.

A file is checked against those declarations as it enters, before anything is computed from it:
0, a negative count, a string, a bool or a float where an integer belongs are bad input, never
"unset". Only an absent key takes the default, and null only where transformers' own config class
accepts it; there it means what transformers makes of None (hidden_size / heads for `head_dim`, no
window for `sliding_window`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MappingError

# a number's range -> (the test, how the message says it)
BOUNDS: dict[str, tuple[Callable[[float], bool], str]] = {
    "positive": (lambda v: 0 < v < math.inf, "a positive {kind}"),
    "non_negative": (lambda v: 0 <= v < math.inf, "a non-negative {kind}"),
    "fraction": (lambda v: 0 < v <= 1, "a {kind} in (0, 1]"),
    "probability": (lambda v: 0 <= v < 1, "a {kind} in [0, 1)"),
    "finite": (math.isfinite, "a finite {kind}"),
}
# a JSON type -> (the Python types that spell it, its name in messages)
_TYPES: dict[type, tuple[tuple[type, ...], str]] = {
    int: ((int,), "integer"), float: ((int, float), "number"), bool: ((bool,), "boolean (true or false)"),
    str: ((str,), "string"), dict: ((dict,), "JSON object"), list: ((list,), "list"),
    bool | str: ((bool, str), "boolean or string"),  # Laguna's `gating`: true, false or a granularity's name
    # `tuple`: an integer, or a list of them, one per layer (Gemma 3n's intermediate_size); the reader checks the list
    tuple: ((int, list), "integer or list of integers"),
}


def show(value: Any) -> str:
    """A value as config.json spells it (null, true, "two"), so the user can find it in the file."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class Key:
    """One config.json key as the family's transformers config class declares it."""

    name: str
    kind: Any  # a JSON type of _TYPES (a type, or Laguna's bool | str)
    default: Any  # what an absent key means (transformers' default; None where transformers derives it)
    nullable: bool = False  # transformers accepts an explicit null
    bound: str = "positive"  # the range of a number (see BOUNDS)
    choices: Mapping[str, Any] | None = None  # the accepted values of a string
    legacy: bool = False  # an older spelling: read, never written

    def expected(self) -> str:
        """What a valid value is, in words."""
        kind = _TYPES[self.kind][1]
        if self.kind in (int, float, tuple):
            return BOUNDS[self.bound][1].format(kind=kind)
        return f"a {kind}"

    def check(self, value: Any, where: str = "") -> Any:
        """The value, validated; a float key gives a float. Raises MappingError naming config.json,
        the key, the value and what to do."""
        stated = f"config.json: {where}{self.name}={show(value)}"
        fallback = "remove the key for the default" + ("" if self.default is None else f" ({show(self.default)})")
        if value is None:
            if self.nullable:
                return None
            raise MappingError(f"{stated} is not allowed (transformers refuses it too); set {self.expected()}, "
                               f"or {fallback}")
        types, _ = _TYPES[self.kind]
        wrong_type = isinstance(value, bool) and bool not in types or not isinstance(value, types)
        bounded = self.kind in (int, float) or self.kind is tuple and isinstance(value, int)
        if wrong_type or bounded and not BOUNDS[self.bound][0](value):
            raise MappingError(f"{stated} should be {self.expected()}; set the model's value from its model "
                               f"card, or {fallback}")
        if self.choices is not None and value not in self.choices:
            raise MappingError(f"{stated} is not supported; supported: {', '.join(self.choices)}")
        return float(value) if self.kind is float else value


_UNSET: Any = object()


class HfConfig:
    """A config.json dict (or a dict nested in it, named by `where`), every declared key it states
    checked on the way in."""

    def __init__(self, data: Any, keys: Mapping[str, Key], where: str = "") -> None:
        if not isinstance(data, dict):
            raise MappingError(f"config.json: {where.rstrip('.') or 'the file'} should be a JSON object, "
                               f"not {show(data)}")
        self.data, self.keys, self.where = data, keys, where
        self.values = {name: key.check(data[name], where) for name, key in keys.items() if name in data}

    def get(self, name: str, default: Any = _UNSET) -> Any:
        """The checked value of `name`; an absent key gives `default`, else the declared default.
        Reading an undeclared key is a bug in the family's table (KeyError)."""
        key = self.keys[name]
        if name in self.values:
            return self.values[name]
        return key.default if default is _UNSET else default

    def stated(self, name: str) -> bool:
        return name in self.values
