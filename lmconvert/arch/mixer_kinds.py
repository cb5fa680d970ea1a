"""Token-mixer kinds that are not attention (state-space scans, gated delta-nets, short
convolutions), each declared once: what `ArchConfig.mixer` may name.

A hybrid stack interleaves them with attention layers (`ArchConfig.layer_mixers` says which layer
is which), so a kind is declared as an attention kind is (`attention_kinds.py`): its settings, the
checks they need, its torch module, the parts (so the tensors) that module holds, the card's lines
about it, and the state it carries between decoding steps. Attention caches K and V per token; a
mixer carries a fixed state per sequence (a convolution window and a recurrent state), so its
size is stated per sequence, not per token. Consumers look the kind up here and name none.

Torch-free: the module is named ("package.module:Class") and imported when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .parts import Part

if TYPE_CHECKING:
    from torch import nn

    from .config import ArchConfig


@dataclass(frozen=True)
class MixerKind:
    """One token-mixer kind. Its callables take the whole ArchConfig, already validated (`check`
    runs last, on a config otherwise complete).

    The module is built as `Class(cfg, parts, layer)`, with `parts = parts(cfg)` which it registers
    with `build.attach`, and has `forward(x, ctx, cache)`: x (B, T, d_model), ctx the forward's
    `Context` (padding in `ctx.keys`), cache a `KVCache` or None; it keeps its state between calls
    in `cache.states[layer]`, a dict of tensors it names itself. `settings` is a frozen dataclass of
    the kind's own fields, held in `ArchConfig.mixer_settings` and validating itself in
    `__post_init__`, or None for a kind that has none. `state_elements` is the number of state
    entries one sequence carries in one layer (convolution window plus recurrent state).
    """

    name: str
    module: str
    parts: Callable[[ArchConfig], dict[str, Part]]
    describe: Callable[[ArchConfig], list[str]]
    state_elements: Callable[[ArchConfig], int]
    settings: type | None = None
    check: Callable[[ArchConfig], None] | None = None

    def build(self, cfg: ArchConfig, layer: int) -> nn.Module:
        path, _, name = self.module.partition(":")
        return getattr(import_module(path), name)(cfg, self.parts(cfg), layer)


KINDS: dict[str, MixerKind] = {}


def register(kind: MixerKind) -> MixerKind:
    """Adds a kind; a second kind under a taken name would silently replace the first, so it fails."""
    if kind.name in KINDS:
        raise ValueError(f"mixer kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    del KINDS[name]


def mixer_kind(name: Any) -> MixerKind:
    """The kind `ArchConfig.mixer` names; a ConfigError naming the value when none is registered."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        known = ", ".join(KINDS) or "none registered"
        raise ConfigError(f"ArchConfig.mixer={name!r}: must be one of {known}") from None
