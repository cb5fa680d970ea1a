"""Config translation as data: a family's table of config.json keys, from which both directions
are derived (ArchConfig from config.json, config.json from ArchConfig), so no key is written twice.

Each row (`Entry`) declares the keys it reads and writes and how: most rows are one key for one
ArchConfig field (`plain`); what is genuinely computed (RoPE, layer patterns, a score scale) is a
row with a reader and a writer; what a family always has is a `fixed` row. A family is another
family's table `but(...)` its differences, as its docstring says in prose.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from .hf_config import HfConfig, Key

Reader = Callable[[HfConfig, dict[str, Any]], dict[str, Any]]  # (the file, fields read so far) -> fields
Writer = Callable[[ArchConfig], dict[str, Any]]  # -> config.json keys


class _Default:
    """A writer's value for a key that has no effect on this model (a window no layer uses): the
    family's declared default is written, as transformers would write it."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


@dataclass(frozen=True)
class Entry:
    """One row of a config table."""

    name: str  # what `but(drop=..., add=...)` calls it
    keys: tuple[Key, ...]
    read: Reader
    write: Writer


def _same(value: Any) -> Any:
    return value


def plain(key: str, field: str, kind: type, default: Any, *, read: Callable[[Any], Any] = _same,
          write: Callable[[Any], Any] = _same, name: str = "", **options: Any) -> Entry:
    """One key <-> one ArchConfig field; `read` and `write` translate a value spelled differently.
    `options` are the Key's (nullable, bound, choices)."""
    return Entry(name or key, (Key(key, kind, default, **options),),
                 lambda hf, _: {field: read(hf.get(key))}, lambda cfg: {key: write(getattr(cfg, field))})


def fixed(name: str, **fields: Any) -> Entry:
    """ArchConfig fields that the family always has and config.json does not state."""
    return Entry(name, (), lambda hf, _: dict(fields), lambda cfg: {})


def unsupported(key: str, kind: type, inert: Any, what: str, family: str, *, default: Any = DEFAULT,
                nullable: bool = False, bound: str = "positive") -> Entry:
    """A key whose only value lmconvert can compute is `inert` (absent or null mean inert too): any
    other value is refused naming what it would switch on, and export writes the default
    (transformers' own, `inert` unless it differs)."""
    def refuse(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
        value = hf.get(key)
        if value not in (None, inert):
            raise MappingError(f"config.json: {key}={json.dumps(value)} ({what}) is not supported; only {family} "
                               f"checkpoints with {key}={json.dumps(inert)} are")
        return {}

    declared = inert if default is DEFAULT else default
    return Entry(key, (Key(key, kind, declared, nullable=nullable, bound=bound),), refuse, lambda cfg: {key: DEFAULT})


@dataclass(frozen=True)
class ConfigTable:
    entries: tuple[Entry, ...]
    decoder: Callable[[dict[str, Any]], dict[str, Any]] = _same  # the part of config.json that is the decoder

    def __post_init__(self) -> None:
        names = [key.name for entry in self.entries for key in entry.keys]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice or len({e.name for e in self.entries}) != len(self.entries):
            raise ValueError(f"config table declares a key or row twice: {twice or [e.name for e in self.entries]}")

    @property
    def keys(self) -> dict[str, Key]:
        return {key.name: key for entry in self.entries for key in entry.keys}

    def from_hf(self, data: dict[str, Any]) -> ArchConfig:
        hf = HfConfig(self.decoder(data) if isinstance(data, dict) else data, self.keys)
        fields: dict[str, Any] = {}
        for entry in self.entries:
            read = entry.read(hf, fields)
            if set(read) & set(fields):
                raise ValueError(f"config table row {entry.name!r} sets {sorted(set(read) & set(fields))} again")
            fields.update(read)
        return ArchConfig(**fields)

    def to_hf(self, cfg: ArchConfig) -> dict[str, Any]:
        keys, out = self.keys, {}
        for entry in self.entries:
            written = entry.write(cfg)
            undeclared = set(written) - {key.name for key in entry.keys if not key.legacy}
            if undeclared:
                raise ValueError(f"config table row {entry.name!r} writes undeclared keys {sorted(undeclared)}")
            out.update({k: keys[k].default if v is DEFAULT else v for k, v in written.items()})
        return out

    def but(self, *, drop: tuple[str, ...] = (), add: tuple[Entry, ...] = (), defaults: Mapping[str, Any] | None = None,
            nullable: Mapping[str, bool] | None = None,
            decoder: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> ConfigTable:
        """This table, except: rows dropped by name; rows added (one with a known name takes that
        row's place, so fields it depends on are still read first; others go last); and keys with
        other defaults or null rules."""
        defaults, nullable = dict(defaults or {}), dict(nullable or {})
        unknown = set(drop) - {e.name for e in self.entries}
        entries = [e for e in self.entries if e.name not in drop]
        for new in add:
            at = next((i for i, e in enumerate(entries) if e.name == new.name), None)
            if at is None:
                entries.append(new)
            else:
                entries[at] = new
        declared = {key.name for entry in entries for key in entry.keys}
        unknown |= (set(defaults) | set(nullable)) - declared
        if unknown:
            raise ValueError(f"config table has no row or key {sorted(unknown)}")

        def changed(key: Key) -> Key:
            return replace(key, default=defaults.get(key.name, key.default),
                           nullable=nullable.get(key.name, key.nullable))

        return ConfigTable(tuple(replace(e, keys=tuple(map(changed, e.keys))) for e in entries),
                           decoder or self.decoder)
