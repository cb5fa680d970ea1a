"""AltUp (Gemma3nTextAltUp and Gemma3nTextModel's stream set-up and merge), op for op as transformers computes it,
in the activation dtype: the streams are one tensor (n_inputs, B, T, d_model) between blocks."""

from __future__ import annotations

import torch
from torch import nn

from .augment_config import AltUpConfig
from .config import ArchConfig
from .norms import Norm


def _to_magnitude(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """x scaled to the RMS `target`: `x * target / sqrt(max(mean(x^2), 1e-5))`, in x's dtype."""
    magnitude = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * target / magnitude


class StreamsIn(nn.Module):
    """The embedding h as the first stream, each other its projection (`altup_in.{i}`) scaled to h's RMS."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(cfg.d_model, cfg.d_model, bias=False)
                                  for _ in range(cfg.altup.n_inputs - 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        target = torch.mean(h ** 2, dim=-1, keepdim=True) ** 0.5
        return torch.stack([h, *(_to_magnitude(p(h).to(h.dtype), target) for p in self.proj)], dim=0)


class StreamsOut(nn.Module):
    """The streams to one state: the others projected back (`altup_out.{i}`) and scaled to the first's RMS, then
    the mean of all."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(cfg.d_model, cfg.d_model, bias=False)
                                  for _ in range(cfg.altup.n_inputs - 1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        first = streams[0]
        target = torch.mean(first ** 2, dim=-1, keepdim=True) ** 0.5
        out = [first, *(_to_magnitude(p(streams[i + 1]).to(first.dtype), target) for i, p in enumerate(self.proj))]
        return torch.mean(torch.stack(out), dim=0)


class AltUp(nn.Module):
    """One block's predict and correct steps (`layers.{i}.altup`)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        altup: AltUpConfig = cfg.altup
        n = altup.n_inputs
        self.n, self.active, self.correct_scaled = n, altup.active, altup.correct_scale
        self.correct_scale = nn.Parameter(torch.zeros(cfg.d_model))
        self.correction = nn.Linear(n, n, bias=False)
        self.prediction = nn.Linear(n, n * n, bias=False)
        self.router = nn.Linear(cfg.d_model, n, bias=False)
        self.router_norm = Norm(cfg.d_model, cfg.norm)
        self.router_scale = cfg.d_model ** -1.0

    def modalities(self, x: torch.Tensor) -> torch.Tensor:
        """tanh(router(router_norm(x) / d_model)), the tanh in fp32, cast back."""
        return torch.tanh(self.router(self.router_norm(x) * self.router_scale).float()).type_as(x)

    def predict(self, streams: torch.Tensor) -> torch.Tensor:
        modalities = self.modalities(streams[self.active])
        coefs = self.prediction(modalities).reshape(*modalities.shape[:-1], self.n, self.n).permute(0, 1, 3, 2)
        predictions = torch.matmul(streams.permute(1, 2, 3, 0), coefs).permute(3, 0, 1, 2)
        predictions += streams
        return predictions.contiguous().type_as(streams)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        modalities = self.modalities(activated)
        innovation = (activated - predictions[self.active]).repeat(self.n, 1, 1, 1)
        coefs = (self.correction(modalities) + 1.0).permute(2, 0, 1).unsqueeze(-1)
        corrected = torch.mul(innovation, coefs)
        corrected += predictions
        return corrected.contiguous().type_as(activated)

    def scaled(self, corrected: torch.Tensor) -> torch.Tensor:
        """The corrected active stream as the per-layer embedding reads it: times `correct_scale` where set."""
        first = corrected[self.active].clone()
        return self(first) if self.correct_scaled else first

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """`first` times `correct_scale` (the module's own call, as transformers' scale_corrected_output, so that
        verify sees the same point on both sides)."""
        return (first.type_as(self.correct_scale) * self.correct_scale).type_as(first)
