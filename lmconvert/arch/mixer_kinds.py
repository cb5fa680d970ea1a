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
from .parts import ConvPart, LinearPart, Part

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


# ----------------------------------------------------------------------------- short_conv: LFM2's gated convolution
@dataclass(frozen=True)
class ShortConvSettings:
    """LFM2's `Lfm2ShortConv`, in Lfm2Config's names: `kernel` is `conv_L_cache`, the depthwise
    convolution's width (and the number of inputs its state keeps), `bias` is `conv_bias`, which
    switches the biases of in_proj, conv and out_proj together."""

    kernel: int = 3
    bias: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.kernel, bool) or not isinstance(self.kernel, int) or self.kernel <= 0:
            raise ConfigError(f"ArchConfig.mixer_settings.kernel={self.kernel!r}: must be a positive integer")
        if not isinstance(self.bias, bool):
            raise ConfigError(f"ArchConfig.mixer_settings.bias={self.bias!r}: must be true or false")


def _short_conv_parts(cfg: ArchConfig) -> dict[str, Part]:
    """transformers' order: conv, in_proj, out_proj (Lfm2ShortConv builds the convolution first)."""
    s, d = cfg.mixer_settings, cfg.d_model
    return {"conv": ConvPart(d, s.kernel, s.bias), "in_proj": LinearPart(d, 3 * d, s.bias),
            "out_proj": LinearPart(d, d, s.bias)}


def _short_conv_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    return [f"short convolution (LFM2): in_proj to B, C, x (3 x {cfg.d_model}); B*x through a depthwise causal "
            f"conv of width {s.kernel}; C times it; out_proj; biases {'on' if s.bias else 'off'}",
            f"short-convolution state: the last {s.kernel} inputs of the conv, {s.kernel * cfg.d_model} entries "
            "per sequence and layer"]


register(MixerKind(
    name="short_conv",
    module=f"{__package__}.short_conv:ShortConv",
    parts=_short_conv_parts,
    describe=_short_conv_describe,
    state_elements=lambda cfg: cfg.mixer_settings.kernel * cfg.d_model,
    settings=ShortConvSettings,
))
