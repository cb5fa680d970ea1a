"""Declarative tensor tables: HF name pattern <-> canonical name pattern, with a transform and
its inverse declared together, so export is derived from import and never written twice.

A pattern's `{}` stands for the layer index. A rule whose canonical side is None drops the
tensor on import (and says so); its HF pattern may end in `*` to drop a whole subtree (a vision
tower, say). Both directions check that every input tensor is consumed and every expected output
tensor is produced; leftovers are errors that name the tensors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import MappingError

if TYPE_CHECKING:  # transforms run on tensors, but reading a table must not import torch
    import torch

TensorFn = Callable[["torch.Tensor"], "torch.Tensor"]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def out_shape(fn: TensorFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `fn` gives a tensor of `shape`, found on the meta device without reading data
    (and without torch at all for the identity, so that a rename-only conversion never loads it).
    Transforms keep the dtype."""
    if fn is _identity:
        return tuple(shape)
    import torch

    return tuple(fn(torch.empty(shape, device="meta")).shape)


@dataclass(frozen=True)
class Transform:
    """A tensor transform and its exact inverse."""

    name: str
    forward: TensorFn = _identity
    inverse: TensorFn = _identity


IDENTITY = Transform("identity")


@dataclass(frozen=True)
class Rule:
    hf: str
    canonical: str | None
    transform: Transform = IDENTITY


Plan = dict[str, tuple[str, Transform]]  # target name -> (source name, transform)


def _fill(pattern: str, match: re.Match[str]) -> str:
    return pattern.replace("{}", match.group(1)) if match.groups() else pattern


def _compile(pattern: str) -> re.Pattern[str]:
    regex = re.escape(pattern).replace(r"\{\}", r"(\d+)")
    if regex.endswith(r"\*"):
        regex = regex[:-2] + ".*"
    return re.compile("^" + regex + "$")


@dataclass(frozen=True)
class TensorTable:
    rules: tuple[Rule, ...]
    hf_prefixes: tuple[str, ...] = ()  # alternative HF prefixes read as "model." (multimodal wrappers)
    _compiled: list = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        for rule in self.rules:
            if rule.hf.endswith("*") and rule.canonical is not None:
                raise ValueError(f"rule {rule.hf!r}: only a drop rule (canonical None) may end in '*'")
            self._compiled.append((rule, _compile(rule.hf),
                                   _compile(rule.canonical) if rule.canonical else None))

    def _normalise(self, name: str) -> str:
        for prefix in self.hf_prefixes:
            if name.startswith(prefix):
                return "model." + name[len(prefix):]
        return name

    def to_canonical_name(self, hf_name: str) -> tuple[str | None, Transform]:
        """The canonical name for an HF tensor (None: dropped on purpose); raises if unknown."""
        name = self._normalise(hf_name)
        for rule, hf_re, _ in self._compiled:
            match = hf_re.match(name)
            if match:
                if rule.canonical is None:
                    return None, rule.transform
                return _fill(rule.canonical, match), rule.transform
        raise MappingError(f"tensor {hf_name!r} matches no rule of this family's table")

    def to_hf_name(self, canonical: str) -> tuple[str, Transform]:
        for rule, _, can_re in self._compiled:
            match = can_re.match(canonical) if can_re else None
            if match:
                return _fill(rule.hf, match), rule.transform
        raise MappingError(f"canonical tensor {canonical!r} has no HF name in this family")

    def plan_import(self, hf_names: Iterable[str], expected: Iterable[str]) -> tuple[Plan, list[str]]:
        """{canonical: (hf name, transform)} and the dropped HF names; checks both sides."""
        plan: Plan = {}
        dropped: list[str] = []
        for hf_name in hf_names:
            canonical, transform = self.to_canonical_name(hf_name)
            if canonical is None:
                dropped.append(hf_name)
            elif canonical in plan:
                raise MappingError(f"tensors {plan[canonical][0]!r} and {hf_name!r} both map to {canonical!r}")
            else:
                plan[canonical] = (hf_name, transform)
        _check_sides(set(plan), set(expected), "the checkpoint")
        return plan, dropped

    def plan_export(self, canonical_names: Iterable[str]) -> Plan:
        """{hf name: (canonical name, transform)}."""
        plan = {}
        for name in canonical_names:
            hf_name, transform = self.to_hf_name(name)
            plan[hf_name] = (name, transform)
        return plan


def _check_sides(produced: set[str], expected: set[str], where: str) -> None:
    missing, extra = sorted(expected - produced), sorted(produced - expected)
    if missing:
        raise MappingError(f"{where} lacks tensor(s) the config requires: {_names(missing)}; "
                           "check that config.json matches the weights")
    if extra:
        raise MappingError(f"{where} has tensor(s) the config does not use: {_names(extra)}; "
                           "check that config.json matches the weights")


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")

