"""Declarative tensor tables: a stored name pattern <-> a canonical name pattern, with a transform
and its inverse declared together (transforms.py), so export is derived from import and never
written twice. Every tensor table is one of these: each HF family's (HF names <-> canonical),
Meta's layout (Meta names <-> HF names, mappings/meta.py) and llama.cpp's GGUF names (GGUF names
<-> canonical, mappings/gguf.py).

Several canonical tensors may be stored end to end in one (Phi-3's fused qkv_proj): each has a
rule of its own with the same stored pattern and a `Piece` transform; import takes each piece,
export names the pieces in order and concatenates them.

A pattern's `{}` stands for the layer index; a second `{}` for an expert's. A rule whose canonical
side has one `{}` more than its stored side expands: one stored tensor (transformers 5's fused
experts) gives one canonical tensor per expert the config expects, its transform bound to that
expert (`sizes["index"]`); such rules come after the per-expert ones, which export writes. A
rule whose stored side has one `{}` more, the last, joins: one canonical tensor stored as one tensor
per row (StableLM's per-head LayerNorms, a `Row` transform); import hands its transform every row in
order, and export writes one stored tensor per row, the transform bound to that row. Rules whose
transform `gathers` (HeadPart) name one canonical tensor stored as several differently named ones
(llama.cpp's DeepSeek k_b and v_b for kv_b): import hands the first rule's transform every part in
the rules' order, export writes each part. A rule whose canonical side is None drops the tensor
on import (and says so); its stored pattern may end in `*` to drop a whole subtree (a vision
tower, say). A table's `refused` patterns name a variant it cannot read (a LoRA-wrapped
projection): a tensor that matches is refused before any rule is looked for. Both directions
check that every input tensor is consumed and every expected output tensor is produced;
leftovers are errors that name the tensors. A transform declared with symbolic sizes is bound by
the `sizes` a plan is given.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice, takewhile
from typing import Any

from ..errors import MappingError
from .transforms import IDENTITY, Sizes, Step, TensorFn, Transform, out_shape

__all__ = ["IDENTITY", "Plan", "Rule", "TensorFn", "TensorTable", "Transform", "out_shape"]


@dataclass(frozen=True)
class Rule:
    stored: str  # the name on disk: an HF name in a family's table, Meta's or llama.cpp's in theirs
    canonical: str | None
    transform: Step | Transform = IDENTITY
    shape: tuple[str, ...] | None = None  # symbolic sizes of the canonical tensor, where a table states them


# target name -> (source name, bound transform); on export, a tensor stored as pieces names them all
Plan = dict[str, tuple[str | tuple[str, ...], Transform]]


def _fill(pattern: str, match: re.Match[str] | Sequence[str]) -> str:
    """The pattern's `{}`s filled with the match's numbers in order; any left over stay `{}`."""
    for number in match.groups() if isinstance(match, re.Match) else match:
        pattern = pattern.replace("{}", number, 1)
    return pattern


def _expands(rule: Rule) -> bool:
    return rule.canonical is not None and rule.canonical.count("{}") > rule.stored.count("{}")


def _joins(rule: Rule) -> bool:
    return rule.canonical is not None and rule.stored.count("{}") > rule.canonical.count("{}")


def _regex(pattern: str) -> str:
    regex = re.escape(pattern).replace(r"\{\}", r"(\d+)")
    return regex[:-2] + ".*" if regex.endswith(r"\*") else regex


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + _regex(pattern) + "$")


@dataclass(frozen=True)
class _FirstMatch:
    """Which of several patterns is the first to match a name, in one regex match: the patterns as
    alternatives of one regex, which tries them in order. A MoE checkpoint has thousands of tensors
    and a table dozens of rules; trying each rule's own regex in Python in turn took about as long
    as copying the tensors' bytes."""

    regex: re.Pattern[str]
    which: dict[int, tuple[int, int]]  # outer group number -> (the pattern's position, its `{}` count)

    @classmethod
    def of(cls, patterns: Sequence[tuple[int, str]]) -> _FirstMatch:
        parts, which, group = [], {}, 1
        for position, pattern in patterns:
            parts.append(f"({_regex(pattern)})")
            which[group] = (position, pattern.count("{}"))
            group += 1 + pattern.count("{}")
        return cls(re.compile("^(?:" + "|".join(parts) + ")$" if parts else "(?!)"), which)

    def __call__(self, name: str) -> tuple[int, tuple[str, ...]] | None:
        """(position, the numbers the `{}`s matched) of the first pattern that matches, or None."""
        match = self.regex.match(name)
        if match is None:
            return None
        group = match.lastindex
        assert group is not None
        position, count = self.which[group]
        return position, match.groups()[group:group + count]


@dataclass(frozen=True)
class TensorTable:
    rules: tuple[Rule, ...]
    hf_prefixes: tuple[str, ...] = ()  # alternative HF prefixes read as "model." (multimodal wrappers)
    # (regex searched in a stored name, what such a tensor is): a variant refused by name on import
    refused: tuple[tuple[str, str], ...] = ()
    _index: dict = field(default_factory=dict, compare=False, repr=False)
    _gathering: bool = field(default=False, compare=False, repr=False)  # a rule's transform `gathers` parts
    _joins: bool = field(default=False, compare=False, repr=False)  # a rule joins stored rows into one tensor

    def __post_init__(self) -> None:
        for rule in self.rules:
            if rule.stored.endswith("*") and rule.canonical is not None:
                raise ValueError(f"rule {rule.stored!r}: only a drop rule (canonical None) may end in '*'")
        object.__setattr__(self, "_gathering", any(getattr(r.transform, "gathers", False) for r in self.rules))
        object.__setattr__(self, "_joins", any(_joins(r) for r in self.rules))

    def _indexed(self, key: str) -> Any:  # noqa: ANN401 - one of the lookups below
        """The lookups by name, and each rule's compiled patterns, built when the table is first
        used: every family's table is made at import, and compiling them all took a conversion's
        start-up 0.1 s. "expanding" goes in last: a thread that sees it sees the others."""
        if "expanding" not in self._index:
            same: dict[str, list[int]] = {}
            for i, rule in enumerate(self.rules):
                same.setdefault(rule.stored, []).append(i)
            compiled = [(rule, _compile(rule.stored), _compile(rule.canonical) if rule.canonical else None)
                        for rule in self.rules]
            self._index.update(
                stored=_FirstMatch.of(list(enumerate(r.stored for r in self.rules))),
                canonical=_FirstMatch.of([(i, r.canonical) for i, r in enumerate(self.rules) if r.canonical]),
                same=same, compiled=compiled, joining=[(r, stored_re) for r, stored_re, _ in compiled if _joins(r)],
                expanding=[(r, stored_re) for r, stored_re, _ in compiled if _expands(r)])
        return self._index[key]

    def _normalise(self, name: str) -> str:
        for prefix in self.hf_prefixes:
            if name.startswith(prefix):
                return "model." + name[len(prefix):]
        return name

    def _rules_for(self, stored: str) -> list[tuple[Rule, tuple[str, ...]]]:
        """The first rule whose pattern matches, and after it every other rule with that same
        pattern (the pieces of a fused tensor)."""
        for pattern, what in self.refused:
            if re.search(pattern, stored):
                raise MappingError(f"tensor {stored!r} is {what}")
        found = self._indexed("stored")(self._normalise(stored))
        if found is None:
            raise MappingError(f"tensor {stored!r} matches no rule of this family's table")
        first, numbers = found
        return [(self.rules[i], numbers) for i in self._indexed("same")[self.rules[first].stored]]

    def to_canonical_name(self, stored: str) -> tuple[str | None, Step | Transform]:
        """The canonical name for a stored tensor (None: dropped on purpose); raises if unknown. A
        tensor stored as pieces gives its first piece's (`to_canonical_names` gives them all)."""
        return self.to_canonical_names(stored)[0]

    def to_canonical_names(self, stored: str) -> list[tuple[str | None, Step | Transform]]:
        """Every canonical name a stored tensor holds, in order: one, or each of its pieces."""
        return [(None if rule.canonical is None else _fill(rule.canonical, match), rule.transform)
                for rule, match in self._rules_for(stored)]

    def drops(self, stored: str) -> bool:
        """Whether a drop rule names this tensor (False for a tensor no rule knows)."""
        try:
            return self._rules_for(stored)[0][0].canonical is None
        except MappingError:
            return False

    def to_stored_name(self, canonical: str) -> tuple[str, Step | Transform]:
        """The stored name export writes (for a tensor stored one per row, the rows' name with the
        row's `{}` left in) and the rule's transform; raises if the family has none."""
        position, numbers = self._canonical_rule(canonical)
        rule = self.rules[position]
        return _fill(rule.stored, numbers), rule.transform

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
        expected = set(expected)
        rows: dict[str, tuple[Step | Transform, dict[int, str]]] = {}  # joined: canonical -> (step, {row: stored})
        parts: dict[str, tuple[tuple[str, ...], Step | Transform, set[str]]] = {}  # gathered: canonical -> parts
        in_order = sorted(expected)
        for stored in stored_names:
            if self._plan_row(stored, rows):
                continue
            gathered = self.gathered(stored)
            if gathered:
                names = tuple(name for name, _ in gathered[1])
                parts.setdefault(gathered[0], (names, gathered[1][0][1], set()))[2].add(stored)
                continue
            if self.expanding(stored):
                self._plan_expanding(stored, in_order, plan, sizes or {})
                continue
            for canonical, step in self.to_canonical_names(stored):
                if canonical is None:
                    dropped.append(stored)
                elif canonical in plan:
                    raise MappingError(f"tensors {plan[canonical][0]!r} and {stored!r} both map to {canonical!r}")
                else:
                    plan[canonical] = (stored, step.bind(sizes or {}))
        for canonical, (step, held) in rows.items():
            plan[canonical] = (_rows_in_order(canonical, held, step.rows(sizes or {})),  # type: ignore[union-attr]
                                step.bind(sizes or {}))
        for canonical, (names, step, held) in parts.items():
            if set(names) - held or canonical in plan:
                raise MappingError(f"{canonical!r} is stored as {', '.join(names)}, and the checkpoint has "
                                   f"{_names(sorted(held | ({plan[canonical][0]} if canonical in plan else set())))}"
                                   "; check that the tensors are whole")
            plan[canonical] = (names, step.bind(sizes or {}))
        _check_sides(set(plan), set(expected), "the checkpoint")
        return plan, dropped

    def _plan_row(self, stored: str, rows: dict[str, tuple[Step | Transform, dict[int, str]]]) -> bool:
        """Whether `stored` is one row of a joined tensor; if so, kept in `rows` under its canonical name."""
        if not self._joins:  # almost every table
            return False
        name = self._normalise(stored)
        for rule, stored_re in self._indexed("joining"):
            match = stored_re.match(name)
            if match:
                held = rows.setdefault(_fill(rule.canonical, match), (rule.transform, {}))[1]
                held[int(match.groups()[-1])] = stored
                return True
        return False

    def gathered(self, stored: str) -> tuple[str, list[tuple[str, Step | Transform]]] | None:
        """For a stored tensor that is one part of a canonical tensor stored as several (a transform
        that `gathers`): the canonical name, and every part's stored name and transform in order."""
        if not self._gathering:  # almost every table: no regex to try for each of thousands of names
            return None
        try:
            (rule, numbers), *_ = self._rules_for(stored)
        except MappingError:
            return None
        if rule.canonical is None or not getattr(rule.transform, "gathers", False):
            return None
        return _fill(rule.canonical, numbers), self._parts(rule.canonical, numbers)

    def _parts(self, canonical: str, numbers: Sequence[str]) -> list[tuple[str, Step | Transform]]:
        """The stored names and transforms of the parts of a gathered canonical tensor, in the table's order."""
        return [(_fill(r.stored, numbers), r.transform) for r in self.rules
                if r.canonical == canonical and getattr(r.transform, "gathers", False)]

    def stored_names(self, canonical: str) -> list[str]:
        """Every stored name a canonical tensor is read from, the one export writes first (a fused
        experts tensor for each expert's weights; Mixtral's router under both its names)."""
        names = []
        for rule, _, can_re in self._indexed("compiled"):
            match = can_re.match(canonical) if can_re else None
            if match:
                names.append(_fill(rule.stored, match))
        return names

    def expanding(self, stored: str) -> list[tuple[str, Step | Transform]]:
        """(canonical pattern with the expert's `{}` left in, transform) of every expanding rule that
        reads `stored` (gate and up both come out of gate_up_proj)."""
        name = self._normalise(stored)
        found = []
        for rule, stored_re in self._indexed("expanding"):
            match = stored_re.match(name)
            if match:
                found.append((_fill(rule.canonical, match), rule.transform))  # type: ignore[arg-type]
        return found

    def _plan_expanding(self, stored: str, expected: list[str], plan: Plan, sizes: Sizes) -> None:
        """Every canonical tensor of `expected` (sorted) that the fused `stored` holds, one per
        expert: of the names that begin as the pattern does, found by bisection, not by trying
        every name (thousands, for each of a MoE model's fused tensors)."""
        found_any = False
        for pattern, step in self.expanding(stored):
            wanted, prefix = _compile(pattern), pattern.split("{}")[0]
            start = bisect_left(expected, prefix)
            for canonical in takewhile(lambda n, p=prefix: n.startswith(p), islice(expected, start, None)):
                found = wanted.match(canonical)
                if found is None:
                    continue
                if canonical in plan:
                    raise MappingError(f"tensors {plan[canonical][0]!r} and {stored!r} both map to {canonical!r}")
                plan[canonical] = (stored, step.bind({**sizes, "index": int(found.group(1))}))
                found_any = True
        if not found_any:
            raise MappingError(f"the checkpoint has tensor(s) the config does not use: {stored}; "
                               "check that config.json matches the weights")

    def plan_export(self, canonical_names: Iterable[str],
                    sizes: Sizes | None = None) -> dict[str, tuple[Any, Transform]]:
        """{stored name: (canonical name, transform)}. A tensor stored as pieces (several rules
        with one stored name: Phi-3's qkv_proj, GPT-2's c_attn) gets the tuple of its pieces'
        canonical names, in the table's order, and the transform whose inverse joins them."""
        found: dict[str, list[tuple[int, str, Step | Transform]]] = {}
        plan: dict[str, tuple[Any, Transform]] = {}
        for name in canonical_names:
            stored, step = self.to_stored_name(name)
            if getattr(step, "gathers", False):  # one stored tensor per part
                position, numbers = self._canonical_rule(name)
                for part, part_step in self._parts(self.rules[position].canonical, numbers):  # type: ignore[arg-type]
                    plan[part] = (name, part_step.bind(sizes or {}))
                continue
            found.setdefault(stored, []).append((self._order(name), name, step))
        for stored, held in found.items():
            if "{}" in stored:  # a joining rule's: one stored tensor per row
                (_, name, step), = held
                for row in range(step.rows(sizes or {})):  # type: ignore[union-attr]
                    plan[stored.replace("{}", str(row))] = (name, step.bind({**(sizes or {}), "index": row}))
                continue
            if self.expanding(stored):  # a stacking rule's: every expert's piece in one tensor
                plan[stored] = self._stacked(stored, held, sizes or {})
                continue
            held.sort(key=lambda item: item[0])
            count = len(self._rules_for(stored))
            if len(held) != count:
                raise MappingError(f"tensor {stored!r} is stored as {count} pieces, but only "
                                   f"{', '.join(name for _, name, _ in held)} are there")
            names = tuple(name for _, name, _ in held)
            plan[stored] = (names if count > 1 else names[0], held[0][2].bind(sizes or {}))
        return plan

    def _stacked(self, stored: str, held: list[tuple[int, str, Step | Transform]],
                 sizes: Sizes) -> tuple[tuple[str, ...], Transform]:
        """A fused experts tensor on export (llama.cpp's `ffn_gate_exps`): every expert's piece,
        by part (gate, then up) and expert index, and the inverse that stacks them; each expert
        must be there for every part."""
        parts = len(self.expanding(stored))
        # the expert's number: the last in `...experts.{e}.gate.weight` (and in a mixture of heads' `attn.q.{e}.weight`)
        index = re.compile(r"\.(\d+)(?:\.[^.\d][^.]*)+$")
        ordered = sorted(held, key=lambda item: (item[0], int(index.search(item[1]).group(1))))  # type: ignore[union-attr]
        experts = len(ordered) // parts
        if experts * parts != len(ordered) or any(
                int(index.search(name).group(1)) != i % experts for i, (_, name, _) in enumerate(ordered)):  # type: ignore[union-attr]
            raise MappingError(f"tensor {stored!r} stacks every expert, but the checkpoint has "
                               f"{_names([name for _, name, _ in ordered])}")
        bound = ordered[0][2].bind({**sizes, "index": 0})

        def by_part(flat: list[Any]) -> list[list[Any]]:
            return [flat[p * experts:(p + 1) * experts] for p in range(parts)]

        packed = None if bound.packed_inverse is None else lambda flat: bound.packed_inverse(by_part(flat))
        return tuple(name for _, name, _ in ordered), Transform(f"{experts} experts stacked",
                                                                inverse=lambda flat: bound.inverse(by_part(flat)),
                                                                packed_inverse=packed)

    def _order(self, canonical: str) -> int:
        """The position of the rule writing a canonical name: the order of a fused tensor's pieces."""
        return self._canonical_rule(canonical)[0]

    def _canonical_rule(self, canonical: str) -> tuple[int, tuple[str, ...]]:
        """(position, numbers) of the first rule whose canonical pattern matches."""
        found = self._indexed("canonical")(canonical)
        if found is None:
            raise MappingError(f"canonical tensor {canonical!r} has no HF name in this family")
        return found


def _rows_in_order(canonical: str, held: dict[int, str], count: int) -> tuple[str, ...]:
    """The `count` stored rows of a joined tensor, row 0 first; refuses a row missing or one too many."""
    example = next(iter(held.values()))
    missing, extra = sorted(set(range(count)) - set(held)), sorted(set(held) - set(range(count)))
    if missing or extra:
        which = f"lacks row(s) {_names([str(r) for r in missing])}" if missing else \
            f"has row(s) {_names([str(r) for r in extra])} the config does not use"
        raise MappingError(f"the checkpoint {which} of {canonical!r}, which config.json says has {count} (stored one "
                           f"tensor per row, as {example!r}); check that config.json matches the weights")
    return tuple(held[row] for row in range(count))


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
