"""Feed-forward activations by name. Gated FFNs use the same table: SwiGLU is silu + gated."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    """transformers' NewGELUActivation (GPT-2, GPT-J, Phi): the tanh formula written out, each op
    rounded in the activation dtype, which F.gelu(approximate="tanh") does not do in bf16."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_bloom(x: torch.Tensor) -> torch.Tensor:
    """BLOOM's own tanh GeLU (`bloom_gelu_forward`, from Megatron-DeepSpeed): its constants and
    order, which round differently from gelu_new's in bf16."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact (erf)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu2": _relu2,  # squared ReLU (Primer, Nemotron)
    "gelu_new": _gelu_new,  # the written-out tanh GeLU (GPT-2, GPT-Neo, GPT-J, Phi)
    "gelu_bloom": _gelu_bloom,  # BLOOM's tanh GeLU
}


class XIELU(nn.Module):
    """transformers' XIELUActivation (Apertus), its Python path op for op: learned `alpha_p`, `alpha_n`
    ([1]) and the constants `beta`, `eps` (0-dim), all tensors of the checkpoint, in the model's dtype
    (transformers' loader casts them as it casts the weights). `beta` and `eps` are buffers there
    and are not trained; here they are parameters without gradient, so the Decoder keeps no buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.log(torch.expm1(torch.tensor(0.8))).unsqueeze(0))
        self.alpha_n = nn.Parameter(torch.log(torch.expm1(torch.tensor(0.8 - 0.5))).unsqueeze(0))
        self.beta = nn.Parameter(torch.tensor(0.5), requires_grad=False)
        self.eps = nn.Parameter(torch.tensor(-1e-6), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)


# activations with parameters of their own: a module per MLP, registered as its `act`
# (their tensors: config.ACTIVATION_PARAMETERS)
PARAMETRIC: dict[str, Callable[[], nn.Module]] = {"xielu": XIELU}
