"""A small declarative checker for structured input: a schema is data built from the specs below,
and one walk over it gives every file the same one-line error, naming the path of the bad value.

Used where lmconvert reads back what it wrote (lmconvert.json, golden files' metadata), and for the
metadata of other formats (params.json, GGUF keys, generation_config.json, tokenizer files), so
that a zero, a wrong type or a missing key is refused where the file is read, not found later as
a ZeroDivisionError or a KeyError. Only the standard library: jsonschema is not a dependency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import InputError

JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
              float: "a number", type(None): "null"}


def json_type(value: object) -> str:
    """What JSON calls the type of `value` (GGUF arrays and numpy scalars read as their kind)."""
    for kind, name in JSON_TYPES.items():
        if type(value) is kind:
            return name
    return type(value).__name__


class Spec(Protocol):
    def check(self, value: Any, path: str) -> None: ...  # raises SchemaError  # noqa: ANN401

    def describe(self) -> str: ...


class SchemaError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected(spec: Spec, value: object, path: str) -> SchemaError:
    return SchemaError(path, f"expected {spec.describe()}, found {_shown(value)} ({json_type(value)})")


@dataclass(frozen=True)
class Integer:
    """An int (never a bool), within [minimum, maximum]."""

    minimum: int | None = None
    maximum: int | None = None

    def describe(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        if self.minimum == 1:
            return "a positive integer"
        return "an integer" + (f" >= {self.minimum}" if self.minimum is not None else "")

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if isinstance(value, bool) or not isinstance(value, int) or (
                self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum):
            raise _expected(self, value, path)


@dataclass(frozen=True)
class Number:
    """A finite int or float (never a bool); `positive` excludes 0, `minimum` is inclusive."""

    positive: bool = False
    minimum: float | None = None

    def describe(self) -> str:
        if self.positive:
            return "a positive, finite number"
        return "a finite number" + (f" >= {self.minimum:g}" if self.minimum is not None else "")

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
                self.positive and value <= 0) or (self.minimum is not None and value < self.minimum):
            raise _expected(self, value, path)


@dataclass(frozen=True)
class String:
    """A string, optionally one of `choices`."""

    choices: tuple[str, ...] | None = None

    def describe(self) -> str:
        return f"one of {', '.join(map(repr, self.choices))}" if self.choices else "a string"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
            raise _expected(self, value, path)


@dataclass(frozen=True)
class Boolean:
    def describe(self) -> str:
        return "true or false"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if not isinstance(value, bool):
            raise _expected(self, value, path)


@dataclass(frozen=True)
class Anything:
    def describe(self) -> str:
        return "any value"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        pass


@dataclass(frozen=True)
class Nullable:
    """`inner`, or null."""

    inner: Spec

    def describe(self) -> str:
        return f"{self.inner.describe()} or null"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if value is not None:
            self.inner.check(value, path)


@dataclass(frozen=True)
class Either:
    """The first of `options` that accepts the value."""

    options: tuple[Spec, ...]

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        for option in self.options:
            try:
                option.check(value, path)
                return
            except SchemaError:
                continue
        raise _expected(self, value, path)


@dataclass(frozen=True)
class Array:
    """A list whose every item is `item`, with at most `max_items` of them."""

    item: Spec = Anything()
    min_items: int = 0
    max_items: int | None = None

    def describe(self) -> str:
        return f"an array of {self.item.describe()}" if not isinstance(self.item, Anything) else "an array"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if not isinstance(value, list) or len(value) < self.min_items or (
                self.max_items is not None and len(value) > self.max_items):
            raise _expected(self, value, path)
        for i, item in enumerate(value):
            self.item.check(item, f"{path}[{i}]")


@dataclass(frozen=True)
class MapOf:
    """An object with any keys, every value `value`."""

    value: Spec = Anything()

    def describe(self) -> str:
        return "an object"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if not isinstance(value, dict):
            raise _expected(self, value, path)
        for key, item in value.items():
            self.value.check(item, f"{path}[{key!r}]" if path else repr(key))


@dataclass(frozen=True)
class Object:
    """An object with these keys: `required` ones must be present, `optional` ones may be; others
    are left alone (files carry keys a newer writer added)."""

    required: Mapping[str, Spec] = field(default_factory=dict)
    optional: Mapping[str, Spec] = field(default_factory=dict)

    def describe(self) -> str:
        return "an object"

    def check(self, value: Any, path: str) -> None:  # noqa: ANN401
        if not isinstance(value, dict):
            raise _expected(self, value, path)
        for key in self.required:
            if key not in value:
                raise SchemaError(path, f"lacks {key!r}")
        for key, spec in {**self.required, **self.optional}.items():
            if key in value:
                spec.check(value[key], f"{path}.{key}" if path else key)


def validate(value: Any, spec: Spec, where: str, fix: str) -> None:  # noqa: ANN401
    """Raise InputError(`where`: the first problem; `fix`) unless `value` fits `spec`."""
    try:
        spec.check(value, "")
    except SchemaError as exc:
        raise InputError(f"{where}: {exc}; {fix}") from None


POSITIVE_INT = Integer(minimum=1)
COUNT = Integer(minimum=0)
POSITIVE = Number(positive=True)
