"""Position schemes other than RoPE: absolute sinusoidal, ALiBi slopes and T5 relative buckets.

Learned absolute positions are a plain embedding table in the Decoder. ALiBi and T5 biases are
additive attention biases of shape [H, Tq, Tk], built from query and key positions so that they
work unchanged with a KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def sinusoidal(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The original Transformer's table, sin on even and cos on odd dims: [..., T, dim]."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angles = positions.float()[..., None] * inv
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :dim]
    return table.to(dtype)


def sinusoidal_fairseq(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """fairseq's table (XGLM): sin of every frequency, then cos of every frequency, frequencies
    exp(-i * log(10000) / (dim/2 - 1)), and a zero column when dim is odd: [..., T, dim]. Computed in
    fp32 op by op as transformers' XGLMSinusoidalPositionalEmbedding.get_embedding does."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.int64, device=positions.device).float() * -step)
    angles = positions.float()[..., None] * freqs
    table = torch.cat((angles.sin(), angles.cos()), dim=-1)
    if dim % 2:
        table = torch.cat((table, table.new_zeros(*positions.shape, 1)), dim=-1)
    return table.to(dtype)


def sinusoidal_halves(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """CTRL's table (`positional_encoding`): column i's angle is pos / 10000^(2 * (i // 2) / dim), the
    sin of the even columns then the cos of the odd ones: sin of every frequency, then cos of every
    frequency, as fairseq's halves but with the original Transformer's frequencies (fairseq divides
    by dim/2 - 1 in the exponent): [..., T, dim]. In fp32 op by op as transformers computes it."""
    i = torch.arange(dim, dtype=torch.int64, device=positions.device).float()
    rates = 1 / torch.pow(10000, (2 * (i // 2)) / dim)
    angles = positions.float()[..., None] * rates
    table = torch.cat((torch.sin(angles[..., 0::2]), torch.cos(angles[..., 1::2])), dim=-1)
    return table.to(dtype)


# absolute_positions -> its fixed table (positions, dim, dtype) -> [..., T, dim]; "learned" is a parameter
POSITION_TABLES = {"sinusoidal": sinusoidal, "sinusoidal_fairseq": sinusoidal_fairseq,
                   "sinusoidal_halves": sinusoidal_halves}


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


def mpt_alibi_slopes(n_heads: int, bias_max: float = 8.0) -> torch.Tensor:
    """MPT's slopes (`build_mpt_alibi_tensor`): 2^-(i * bias_max / n) over the next power of two n,
    odd-numbered ones first when n_heads falls short of it. transformers always uses bias_max 8
    (it never passes `alibi_bias_max` on)."""
    n = 2 ** math.ceil(math.log2(n_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n + 1, dtype=torch.int64).float() * (bias_max / n))
    if n != n_heads:
        slopes = torch.cat((slopes[1::2], slopes[::2]))[:n_heads]
    return slopes


@dataclass(frozen=True)
class AlibiKind:
    """How one family builds and adds ALiBi (ArchConfig.alibi). Softmax ignores a per-row constant,
    so where the distance is counted from changes nothing in exact arithmetic, but each reference's
    own choice rounds its own way in bf16.

    `origin` says what the bias multiplies: "query" the distance k - q, "start" the key position k
    (BLOOM, Falcon), "end" the distance to the last key (MPT). `add` says how it joins the scores:
    "rounded" cast to the scores' dtype and added after the scaling; "fp32" added in fp32, promoting
    the scores (MPT's fp32 table); "matmul" cast to the activation dtype and added inside the score
    matmul, `baddbmm(bias, q, k^T, alpha=scale)` (BLOOM); "falcon" as transformers' Falcon (RW)
    runs it (5.25 on; 5.24's eager path added it a second time): cast to the activation dtype,
    divided by sqrt(head_dim) there, and added to the scaled scores with the mask, eagerly and
    through SDPA alike (`attention.py`). `bf16` rounds the slopes and their products to bf16
    (Falcon), whatever the model's dtype."""

    slopes: Callable[[int], torch.Tensor]  # n_heads -> [H]
    origin: str
    add: str
    bf16: bool = False


ALIBI_KINDS: dict[str, AlibiKind] = {
    "distance": AlibiKind(alibi_slopes, "query", "rounded"),
    "bloom": AlibiKind(alibi_slopes, "start", "matmul"),
    "mpt": AlibiKind(mpt_alibi_slopes, "end", "fp32"),
    "falcon": AlibiKind(alibi_slopes, "start", "falcon", bf16=True),
}


def alibi_bias(n_heads: int, q_pos: torch.Tensor, k_pos: torch.Tensor, kind: str = "distance",
               k_numbers: torch.Tensor | None = None) -> torch.Tensor:
    """slope * (key position from the kind's origin), in fp32 (bf16 for a `bf16` kind): [H, Tq, Tk]
    (Tq is 1 where it does not depend on the query). A "start" kind counts keys by `k_numbers`
    when given, (B, Tk) numbered from each row's first real token as BLOOM and Falcon build ALiBi
    from the attention mask: [B, H, 1, Tk]. The other origins are distances, which padding does not shift."""
    alibi = ALIBI_KINDS[kind]
    slopes = alibi.slopes(n_heads).to(q_pos.device)[:, None, None]
    if alibi.origin == "query":
        return slopes * (k_pos[None, :] - q_pos[:, None]).float()[None]
    if alibi.bf16:
        slopes = slopes.bfloat16()
    if alibi.origin == "start" and k_numbers is not None:
        return slopes * k_numbers[:, None, None, :]  # (B, H, 1, Tk)
    origin = k_pos[-1] if alibi.origin == "end" else 0
    return slopes * (k_pos - origin)[None, None, :]


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
