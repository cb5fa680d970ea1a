"""Per-layer embeddings (Gemma 3n's, Gemma 4's `hidden_size_per_layer_input`), op for op as transformers' text
models compute them (`get_per_layer_inputs`, `project_per_layer_inputs`, and the decoder layer's gate), with the
constants multiplied as `PleConfig.scales` says."""

from __future__ import annotations

import torch
from torch import nn

from .activations import ACTIVATIONS
from .augment_config import PleConfig
from .config import ArchConfig
from .norms import Norm


def _constant(value: float, dtype: torch.dtype, scales: str) -> torch.Tensor | float:
    """A constant factor: an fp32 tensor cast to `dtype` (Gemma 3n's buffers) or the Python float (Gemma 4)."""
    return torch.tensor(value, dtype=torch.float32).to(dtype) if scales == "rounded" else value


class PerLayerInputs(nn.Module):
    """Every layer's input for the tokens (`ple.embed`, `ple.project`, `ple.norm`): (B, T, n_layers, dim)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        ple: PleConfig = cfg.ple
        self.cfg, self.n_layers, self.d_model = ple, cfg.n_layers, cfg.d_model
        wide = cfg.n_layers * ple.dim
        self.embed = nn.Embedding(ple.vocab_size, wide, _weight=torch.randn(ple.vocab_size, wide))
        self.project = nn.Linear(cfg.d_model, wide, bias=False)
        self.norm = Norm(ple.dim, cfg.norm)

    def forward(self, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """`ids` (B, T) and the scaled main embedding `h` (B, T, d_model)."""
        ple = self.cfg
        if ple.scales == "rounded":  # Gemma 3n: ids outside the table read row 0
            ids = torch.where((ids >= 0) & (ids < ple.vocab_size), ids, 0)
        shape = (*ids.shape, self.n_layers, ple.dim)
        table = self.embed(ids)
        tokens = (table * torch.tensor(ple.dim ** 0.5, dtype=torch.float32).to(table.dtype)).reshape(shape)
        projected = self.project(h) * _constant(self.d_model ** -0.5, h.dtype, ple.scales)
        projected = self.norm(projected.reshape(*h.shape[:-1], self.n_layers, ple.dim))
        half = torch.rsqrt(torch.tensor(2.0)).to(h.dtype) if ple.scales == "rounded" else 2.0 ** -0.5
        return (projected + tokens) * half


class PerLayerGate(nn.Module):
    """A block's use of its input (`layers.{i}.ple`): norm(proj(act(gate(x)) * input)), what joins the residual."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ple.dim, bias=False)
        self.proj = nn.Linear(cfg.ple.dim, cfg.d_model, bias=False)
        self.norm = Norm(cfg.d_model, cfg.norm)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(torch.multiply(self.act(self.gate(x)), inputs)))
