"""Position schemes other than RoPE: absolute sinusoidal, ALiBi slopes and T5 relative buckets.

Learned absolute positions are a plain embedding table in the Decoder. ALiBi and T5 biases are
additive attention biases of shape [H, Tq, Tk], built from query and key positions so that they
work unchanged with a KV cache.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The original Transformer's table, sin on even and cos on odd dims: [T, dim]."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angles = positions.float()[:, None] * inv[None, :]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :dim]
    return table.to(dtype)


def sinusoidal_fairseq(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """fairseq's table (XGLM): sin of every frequency, then cos of every frequency, frequencies
    exp(-i * log(10000) / (dim/2 - 1)), and a zero column when dim is odd: [T, dim]. Computed in
    fp32 op by op as transformers' XGLMSinusoidalPositionalEmbedding.get_embedding does."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.int64, device=positions.device).float() * -step)
    angles = positions.float()[:, None] * freqs[None, :]
    table = torch.cat((angles.sin(), angles.cos()), dim=1)
    if dim % 2:
        table = torch.cat((table, table.new_zeros(len(positions), 1)), dim=1)
    return table.to(dtype)


# absolute_positions -> its fixed table (positions, dim, dtype) -> [T, dim]; "learned" is a parameter
POSITION_TABLES = {"sinusoidal": sinusoidal, "sinusoidal_fairseq": sinusoidal_fairseq}


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al.'s geometric slopes, with interleaved extras when n_heads is no power of 2."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = base ** torch.arange(1, 1 + closest, dtype=torch.float32)
    if closest != n_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, n_heads - closest)
        extra = extra_base ** torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.float32)
        slopes = torch.cat((slopes, extra))
    return slopes


def alibi_bias(n_heads: int, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """-slope * distance, so every head prefers near keys: [H, Tq, Tk]."""
    distance = (k_pos[None, :] - q_pos[:, None]).float()
    return alibi_slopes(n_heads).to(q_pos.device)[:, None, None] * distance[None]


def relative_buckets(distance: torch.Tensor, n_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal bucketing of q - k >= 0: exact below n_buckets/2, logarithmic up to max_distance."""
    n = distance.clamp(min=0)
    max_exact = n_buckets // 2
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact) * (n_buckets - max_exact)
    ).to(torch.long)
    large = large.clamp(max=n_buckets - 1)
    return torch.where(n < max_exact, n, large)


class RelativeBias(nn.Module):
    """One learned [buckets, heads] table shared by every layer that uses relative positions."""

    def __init__(self, n_buckets: int, max_distance: int, n_heads: int) -> None:
        super().__init__()
        self.n_buckets, self.max_distance = n_buckets, max_distance
        self.weight = nn.Parameter(torch.zeros(n_buckets, n_heads))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        buckets = relative_buckets(q_pos[:, None] - k_pos[None, :], self.n_buckets, self.max_distance)
        return self.weight[buckets].permute(2, 0, 1)  # (H, Tq, Tk)
