"""Declarative tensor tables: a stored name pattern <-> a canonical name pattern, with a transform
and its inverse declared together (transforms.py), so export is derived from import and never
written twice. Every tensor table is one of these: each HF family's (HF names <-> canonical),
Meta's layout (Meta names <-> HF names, mappings/meta.py) and llama.cpp's GGUF names (GGUF names
<-> canonical, mappings/gguf.py).

A rule's canonical side may join several names with "+" (a group): one stored tensor holding
several canonical ones, as a fused qkv projection does. Its transform maps the stored tensor to the
members concatenated along dim 0 in the order named (and back); import takes each member's rows
from that, export reads the members concatenated (`GROUP` in a source name).

A pattern's `{}` stands for the layer index. A rule whose canonical side is None drops the
tensor on import (and says so); its stored pattern may end in `*` to drop a whole subtree (a
vision tower, say). Both directions check that every input tensor is consumed and every expected
output tensor is produced; leftovers are errors that name the tensors. A transform declared with
symbolic sizes is bound by the `sizes` a plan is given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import MappingError
from .transforms import IDENTITY, Sizes, Step, TensorFn, Transform, out_shape

if TYPE_CHECKING:
    from lmconvert.arch.config import ArchConfig

__all__ = ["IDENTITY", "Plan", "Rule", "TensorFn", "TensorTable", "Transform", "out_shape"]


@dataclass(frozen=True)
class Rule:
    stored: str  # the name on disk: an HF name in a family's table, Meta's or llama.cpp's in theirs
    canonical: str | None
    transform: Step | Transform = IDENTITY
    shape: tuple[str, ...] | None = None  # symbolic sizes of the canonical tensor, where a table states them


Plan = dict[str, tuple[str, Transform]]  # target name -> (source name, bound transform)
GROUP = "+"  # joins the canonical names one stored tensor holds


def members(name: str) -> list[str]:
    """The names a (possibly group) name stands for."""
    return name.split(GROUP)


def _rows(fn: TensorFn, start: int, stop: int) -> TensorFn:
    return lambda t: fn(t)[start:stop]


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

    _members: list = field(default_factory=list, compare=False, repr=False)  # (member regex, its group rule)

    def __post_init__(self) -> None:
        for rule in self.rules:
            if rule.stored.endswith("*") and rule.canonical is not None:
                raise ValueError(f"rule {rule.stored!r}: only a drop rule (canonical None) may end in '*'")
            self._compiled.append((rule, _compile(rule.stored),
                                   _compile(rule.canonical) if rule.canonical else None))
            if rule.canonical and GROUP in rule.canonical:
                self._members.extend((_compile(m), rule) for m in members(rule.canonical))

    def _normalise(self, name: str) -> str:
        for prefix in self.hf_prefixes:
            if name.startswith(prefix):
                return "model." + name[len(prefix):]
        return name

    def _rule_for(self, stored: str) -> tuple[Rule, re.Match[str]]:
        name = self._normalise(stored)
        for rule, stored_re, _ in self._compiled:
            match = stored_re.match(name)
            if match:
                return rule, match
        raise MappingError(f"tensor {stored!r} matches no rule of this family's table")

    def to_canonical_name(self, stored: str) -> tuple[str | None, Step | Transform]:
        """The canonical name for a stored tensor (None: dropped on purpose); raises if unknown."""
        rule, match = self._rule_for(stored)
        return (None if rule.canonical is None else _fill(rule.canonical, match)), rule.transform

    def drops(self, stored: str) -> bool:
        """Whether a drop rule names this tensor (False for a tensor no rule knows)."""
        try:
            return self._rule_for(stored)[0].canonical is None
        except MappingError:
            return False

    def to_stored_name(self, canonical: str) -> tuple[str, Step | Transform]:
        """The stored name of a canonical tensor, or of the group holding it."""
        for rule, _, can_re in self._compiled:
            match = can_re.match(canonical) if can_re else None
            if match:
                return _fill(rule.stored, match), rule.transform
        group = self.group_of(canonical)
        if group is not None:
            return self.to_stored_name(group)
        raise MappingError(f"canonical tensor {canonical!r} has no HF name in this family")

    def group_of(self, canonical: str) -> str | None:
        """The group name whose stored tensor holds this canonical tensor, if a group rule does."""
        for member_re, rule in self._members:
            match = member_re.match(canonical)
            if match:
                return _fill(rule.canonical, match)  # type: ignore[arg-type]
        return None

    to_hf_name = to_stored_name  # a family's stored names are HF's

    def expand(self, n_layers: int) -> Iterator[tuple[str, str, Rule]]:
        """(stored, canonical, rule) of every tensor a model with `n_layers` layers has, in the
        table's order, per-layer rules taking their place as one block per layer (Meta's module
        order); drop rules are left out."""
        kept = [r for r in self.rules if r.canonical is not None]
        layered = [r for r in kept if "{}" in r.stored]
        first = kept.index(layered[0]) if layered else len(kept)
        for rule in kept[:first]:
            yield rule.stored, rule.canonical, rule  # type: ignore[misc]
        for i in range(n_layers):
            for rule in layered:
                yield rule.stored.replace("{}", str(i)), rule.canonical.replace("{}", str(i)), rule  # type: ignore[union-attr]
        for rule in kept[first:]:
            if "{}" not in rule.stored:
                yield rule.stored, rule.canonical, rule  # type: ignore[misc]

    def plan_import(self, stored_names: Iterable[str], expected: Iterable[str],
                    sizes: Sizes | None = None) -> tuple[Plan, list[str]]:
        """{canonical: (stored name, transform)} and the dropped stored names; checks both sides."""
        plan: Plan = {}
        dropped: list[str] = []
        for stored in stored_names:
            canonical, step = self.to_canonical_name(stored)
            if canonical is None:
                dropped.append(stored)
            elif canonical in plan:
                raise MappingError(f"tensors {plan[canonical][0]!r} and {stored!r} both map to {canonical!r}")
            elif GROUP in canonical:
                plan.update(_split(stored, canonical, step.bind(sizes or {}), expected))
            else:
                plan[canonical] = (stored, step.bind(sizes or {}))
        _check_sides(set(plan), set(expected), "the checkpoint")
        return plan, dropped

    def plan_export(self, canonical_names: Iterable[str], sizes: Sizes | None = None) -> Plan:
        """{stored name: (canonical name, transform)}; a group's stored tensor is planned once, from
        the group name (its members, read concatenated), at its first member."""
        plan = {}
        for name in canonical_names:
            name = self.group_of(name) or name
            stored, step = self.to_stored_name(name)
            plan.setdefault(stored, (name, step.bind(sizes or {})))
        return plan


def arch_sizes(arch: ArchConfig) -> dict[str, int]:
    """The sizes a family's transforms are bound with (a fused qkv's head counts)."""
    return {"heads": arch.n_heads, "kv_heads": arch.n_kv_heads, "head_dim": arch.head_dim}


def _split(stored: str, group: str, transform: Transform, expected: Iterable[str]) -> Plan:
    """Each member of a group: its rows of the group's concatenation, sized by the shapes expected."""
    shapes = expected if isinstance(expected, dict) else {}
    plan: Plan = {}
    start = 0
    for member in members(group):
        rows = shapes.get(member, (0,))[0]
        stop = start + rows
        piece = Transform(f"{transform.name}, rows {start}:{stop}", _rows(transform.forward, start, stop))
        plan[member] = (stored, piece)
        start = stop
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
