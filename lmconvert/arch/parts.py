"""Parameter-holding parts declared as plain values, so that their tensors are known without torch.

A declaration written with these (an attention kind's `parts`) is read twice: `build.attach` makes
the torch modules it lists, and `shapes` lists their tensors, so the tensor inventory and the real
module cannot disagree. Imports: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import NormConfig

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class LinearPart:
    """An `nn.Linear`: weight [out, in], then the optional bias [out]."""

    d_in: int
    d_out: int
    bias: bool = False

    def shapes(self, name: str) -> Shapes:
        shapes = {f"{name}.weight": (self.d_out, self.d_in)}
        if self.bias:
            shapes[f"{name}.bias"] = (self.d_out,)
        return shapes


@dataclass(frozen=True)
class NormPart:
    """A `norms.Norm`: the optional weight [dim], then the optional bias [dim]. A tuple `dim` is
    the shape of weights that differ along the leading axes (Cohere's [heads, head_dim] QK norms);
    statistics are still over the last axis."""

    dim: int | tuple[int, ...]
    cfg: NormConfig

    def shapes(self, name: str) -> Shapes:
        present = (("weight", self.cfg.weight), ("bias", self.cfg.bias))
        shape = (self.dim,) if isinstance(self.dim, int) else tuple(self.dim)
        return {f"{name}.{part}": shape for part, on in present if on}


@dataclass(frozen=True)
class ParamPart:
    """A bare learned tensor of `shape`, registered on the owning module itself (gpt-oss's attention
    sinks, [heads]); `state_dict` lists a module's own parameters before its submodules', so a kind
    declares these first."""

    shape: tuple[int, ...]

    def shapes(self, name: str) -> Shapes:
        return {name: tuple(self.shape)}


@dataclass(frozen=True)
class ConvPart:
    """A depthwise causal convolution over the sequence, an `nn.Conv1d(channels, channels, kernel,
    groups=channels)`: weight [channels, 1, kernel], then the optional bias [channels] (the short
    convolutions of LFM2, Mamba and gated delta-nets)."""

    channels: int
    kernel: int
    bias: bool = False

    def shapes(self, name: str) -> Shapes:
        shapes = {f"{name}.weight": (self.channels, 1, self.kernel)}
        if self.bias:
            shapes[f"{name}.bias"] = (self.channels,)
        return shapes


Part = LinearPart | NormPart | ParamPart | ConvPart


def part_shapes(parts: dict[str, Part], prefix: str) -> Shapes:
    """Every tensor of `parts` under `prefix`, in the order `build.attach` registers them."""
    shapes: Shapes = {}
    for name, part in parts.items():
        shapes.update(part.shapes(f"{prefix}.{name}"))
    return shapes
