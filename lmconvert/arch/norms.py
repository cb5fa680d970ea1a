"""RMSNorm and LayerNorm with the dtype order of each family's reference.

Statistics are always computed in fp32. Where the weight is applied decides bf16 results:
LLaMA casts back first and multiplies in the weight dtype; Gemma and OLMo 2 multiply in fp32 and
cast last. `weight_offset` turns a zero-centred stored weight into Gemma's `(1 + w)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import NormConfig


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rms_power(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma 4's RMSNorm: `x * torch.pow(mean(x^2) + eps, -0.5)` (`NormConfig.power`), not rsqrt."""
    return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)


def _layer(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def _layer_written_out(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Cohere's LayerNorm op for op: rounds differently from torch's kernel (~5e-7 in fp32)."""
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)


STATISTICS = {"rms": _rms, "layer": _layer}


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _row(t: torch.Tensor | None, index: int) -> torch.Tensor | None:
    return None if t is None else t[index]


class Norm(nn.Module):
    def __init__(self, dim: int | tuple[int, ...], cfg: NormConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.normalise = _layer_written_out if cfg.written_out else _rms_power if cfg.power else STATISTICS[cfg.kind]
        init = 1.0 - cfg.weight_offset
        shape = (dim,) if isinstance(dim, int) else tuple(dim)  # a tuple: weights per leading index
        self.weight = nn.Parameter(torch.full(shape, init)) if cfg.weight else None
        self.bias = nn.Parameter(torch.zeros(shape)) if cfg.bias else None
        # torch's LayerNorm kernel takes only a weight over the normalised axis: weights per head
        # (StableLM's one nn.LayerNorm per head) go through it one head at a time
        self.kernel = not cfg.written_out
        self.per_head = len(shape) > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.cfg.kind == "layer" and self.cfg.dtype_order == "scale_then_cast" and self.kernel:
            # the weight and bias inside torch's own kernel, as nn.LayerNorm does (in fp32, rounded
            # once): a separate multiply and add rounds differently (~1e-7 in fp32), and so does the
            # kernel fed fp32 copies of bf16 inputs. An offset is added in the weight's dtype first,
            # as Nemotron's LayerNorm1P does (`weight + 1.0`).
            weight = None if self.weight is None else self._scale(self.weight)
            if not self.per_head:
                return self._kernel(x, weight, self.bias)
            return torch.stack([self._kernel(x[..., h, :], _row(weight, h), _row(self.bias, h))
                                for h in range(x.shape[-2])], dim=-2)
        h = self.normalise(x.float(), self.cfg.eps)
        if self.cfg.dtype_order == "cast_then_scale":
            h = h.to(dtype)
            if self.weight is not None:
                h = self._scale(self.weight) * h
            return h + self.bias if self.bias is not None else h
        if self.weight is not None:
            h = self._scale(self.weight.float() if self.cfg.weight_offset else self.weight) * h
        if self.bias is not None:
            h = h + self.bias.float()
        return h.to(dtype)

    def _kernel(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        if all(t is None or t.dtype == x.dtype for t in (weight, bias)):
            return F.layer_norm(x, x.shape[-1:], weight, bias, self.cfg.eps)
        return F.layer_norm(x.float(), x.shape[-1:], _fp32(weight), _fp32(bias), self.cfg.eps).to(x.dtype)

    def _scale(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.cfg.weight_offset if self.cfg.weight_offset else weight

    def extra_repr(self) -> str:
        return f"{self.cfg.kind}, eps={self.cfg.eps}, offset={self.cfg.weight_offset}, {self.cfg.dtype_order}"
