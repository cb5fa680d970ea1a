"""Feed-forward activations by name. Gated FFNs use the same table: SwiGLU is silu + gated."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact (erf)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu2": _relu2,  # squared ReLU (Primer, Nemotron)
}
