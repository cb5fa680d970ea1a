"""Builds the torch modules that a parts declaration (`parts.py`) lists."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .norms import Norm
from .parts import ConvPart, LinearPart, NormPart, ParamPart, Part


def _conv(p: ConvPart) -> nn.Conv1d:
    """Built as transformers builds its own (padding kernel - 1), and marked `uncalled`: every mixer
    runs F.conv1d over the weights and its kept window (`causal_conv`), never the module, so it has
    no output of its own for verify to trace."""
    conv = nn.Conv1d(p.channels, p.channels, p.kernel, groups=p.channels, bias=p.bias, padding=p.kernel - 1)
    conv.uncalled = True
    return conv


BUILDERS: dict[type, Callable[[Part], nn.Module | nn.Parameter]] = {
    LinearPart: lambda p: nn.Linear(p.d_in, p.d_out, bias=p.bias),
    NormPart: lambda p: Norm(p.dim, p.cfg),
    ParamPart: lambda p: nn.Parameter(torch.zeros(p.shape)),
    ConvPart: _conv,
}


def attach(owner: nn.Module, parts: dict[str, Part]) -> None:
    """Each part as a submodule of `owner`, in declaration order (which is `state_dict` order)."""
    for name, part in parts.items():
        setattr(owner, name, BUILDERS[type(part)](part))
