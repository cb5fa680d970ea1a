"""Attention kinds, each declared once: what `ArchConfig.attention` may name.

A kind is everything that differs between, say, standard multi-head attention and DeepSeek's
latent attention: the settings it adds to ArchConfig and the checks they need, the torch module
that computes it, the parts (so the tensors) that module holds, the lines the architecture card
says about it, and the size of its KV cache. `ArchConfig` validation, `shapes`, `Block` and
`describe` look the kind up here and name none, so adding a kind is one declaration below, plus
the file of its torch module.

Torch-free: the module is named ("package.module:Class") and imported when a model is built, as
`formats.checkpoint` names its readers, so checking a config or listing its tensors never loads torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .parts import LinearPart, NormPart, Part

if TYPE_CHECKING:
    from torch import nn

    from .config import ArchConfig
    from .positions import RelativeBias
    from .rope import Rotary


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind. Its callables take the whole ArchConfig, already validated (`check`
    runs last, on a config otherwise complete).

    The module is built as `Class(cfg, parts, layer, rotary, relative)`, with `parts = parts(cfg)`
    which it registers with `build.attach`; it has a `backend` attribute (set by
    `Decoder.set_attention`) and `forward(x, ctx, cache)`. `settings` is a frozen dataclass of the
    kind's own fields, held in `ArchConfig.attention_settings` and validating itself in
    `__post_init__`, or None for a kind that has none. `check` raises ConfigError for combinations
    of ArchConfig fields the kind cannot compute.
    """

    name: str
    module: str
    parts: Callable[[ArchConfig], dict[str, Part]]
    describe: Callable[[ArchConfig], list[str]]
    cache_elements: Callable[[ArchConfig], int]  # KV-cache entries per token and layer (keys and values)
    settings: type | None = None
    check: Callable[[ArchConfig], None] | None = None

    def build(self, cfg: ArchConfig, layer: int, rotary: Rotary | None, relative: RelativeBias | None) -> nn.Module:
        path, _, name = self.module.partition(":")
        return getattr(import_module(path), name)(cfg, self.parts(cfg), layer, rotary, relative)


KINDS: dict[str, AttentionKind] = {}


def register(kind: AttentionKind) -> AttentionKind:
    """Adds a kind; a second kind under a taken name would silently replace the first, so it fails."""
    if kind.name in KINDS:
        raise ValueError(f"attention kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    del KINDS[name]


def attention_kind(name: Any) -> AttentionKind:
    """The kind `ArchConfig.attention` names; a ConfigError naming the value when none is registered."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"ArchConfig.attention={name!r}: must be one of {', '.join(KINDS)}") from None


# ----------------------------------------------------------------------------- standard: MHA / GQA / MQA
def _standard_parts(cfg: ArchConfig) -> dict[str, Part]:
    """q, k, v, o projections, then the QK norms: over one head or over the whole projection."""
    parts: dict[str, Part] = {
        "q": LinearPart(cfg.d_model, cfg.q_dim, cfg.q_bias),
        "k": LinearPart(cfg.d_model, cfg.kv_dim, cfg.k_bias),
        "v": LinearPart(cfg.d_model, cfg.kv_dim, cfg.v_bias),
        "o": LinearPart(cfg.q_dim, cfg.d_model, cfg.o_bias),
    }
    norm_dims = {"head": (cfg.head_dim, cfg.head_dim), "projection": (cfg.q_dim, cfg.kv_dim)}.get(cfg.qk_norm)
    if norm_dims:
        parts["q_norm"] = NormPart(norm_dims[0], cfg.norm)
        parts["k_norm"] = NormPart(norm_dims[1], cfg.norm)
    return parts


def _standard_describe(cfg: ArchConfig) -> list[str]:
    if cfg.n_kv_heads == cfg.n_heads:
        kind = "MHA"
    elif cfg.n_kv_heads == 1:
        kind = "MQA"
    else:
        kind = f"GQA ({cfg.n_heads // cfg.n_kv_heads} q heads per kv head)"
    lines = [f"attention: {kind}, {cfg.n_heads} heads / {cfg.n_kv_heads} kv heads, head_dim {cfg.head_dim}"]
    if cfg.qk_norm != "none":
        lines.append(f"QK norm: {'per head' if cfg.qk_norm == 'head' else 'over the whole projection'}")
    return lines


register(AttentionKind(
    name="standard",
    module=f"{__package__}.attention:Attention",
    parts=_standard_parts,
    describe=_standard_describe,
    cache_elements=lambda cfg: 2 * cfg.kv_dim,
))
# "latent" (MLA) and "sparse" (DSA) register here when they are built
