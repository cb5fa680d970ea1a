"""Mamba2 (SSD): the state-space mixer of mamba2, bamba, nemotron_h, granitemoehybrid, falcon_h1 and zamba2.

Numerics follow transformers' torch path (Mamba2Mixer.forward without the CUDA kernels), op for op:
in_proj into [z | xBC | dt] (Falcon-H1: its input times `in_multiplier` first, the projection times
its five muP multipliers after), a depthwise causal conv1d with SiLU on xBC (shared with Mamba,
`causal_conv.causal_conv`), then the scan: the chunked SSD algorithm over a prefill (`mamba2_chunk_scan`,
fp32, dt clamped to `time_step_min/max`), the recurrent update for a cached one-token step
(`mamba2_selective_state_update`, which transformers does not clamp: each path as transformers has
it), the D skip, then the gated RMSNorm over groups (`norm`: Mamba2's gate-then-norm with the weight
after the cast back; Falcon-H1's, with the weight in fp32 and the gate before or after; or none, the
output times SiLU(z)), and out_proj in the model dtype.

State between calls, in `cache.states[layer]`: "conv", the last `conv_kernel` conv inputs
(B, conv_dim, K) in the activation dtype, and "ssm" (B, n_heads, head_dim, d_state) in fp32, as
transformers' LinearAttentionLayer keeps them. Padding: `causal_conv.zero_padding` on the input and the
conv output, as transformers' `apply_mask_to_padding_states`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .cache import KVCache
from .causal_conv import causal_conv, padding_mask, zero_padding
from .config import ArchConfig
from .context import Context
from .mamba import StateSpaceMixer, wide
from .parts import Part


def _pad(t: torch.Tensor, pad: int) -> torch.Tensor:
    """`pad_tensor_by_size`: zeros after the sequence (dim 1) of a 3-d or 4-d tensor."""
    shape = (0, 0, 0, 0, 0, pad, 0, 0) if t.dim() == 4 else (0, 0, 0, pad, 0, 0)
    return F.pad(t, shape, mode="constant", value=0)


def _chunks(t: torch.Tensor, pad: int, size: int) -> torch.Tensor:
    """`reshape_into_chunks`: (b, T, ...) -> (b, c, size, ...)."""
    t = _pad(t, pad)
    return t.reshape(t.shape[0], -1, size, *t.shape[2:])


def _segment_sum(t: torch.Tensor) -> torch.Tensor:
    """`segment_sum`: the cumulative sums of t's last axis between every pair of positions, -inf above
    the diagonal."""
    size = t.size(-1)
    t = t[..., None].expand(*t.size(), size)
    mask = torch.tril(torch.ones(size, size, device=t.device, dtype=torch.bool), diagonal=-1)
    t = torch.cumsum(t.masked_fill(~mask, 0), dim=-2)
    mask = torch.tril(torch.ones(size, size, device=t.device, dtype=torch.bool), diagonal=0)
    return t.masked_fill(~mask, -torch.inf)


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, size: int,
               D: torch.Tensor, dt_bias: torch.Tensor, initial: torch.Tensor | None,
               limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """`mamba2_chunk_scan` with softplus: x (b, T, h, p), dt (b, T, h), A (h,) fp32, B, C (b, T, g, n).
    Returns y (b, T, h, p) fp32 with the D skip, and the final state (b, h, p, n)."""
    batch, T, heads, head_dim = x.shape
    groups = B.shape[2]
    dt = torch.clamp(F.softplus(dt + dt_bias.to(dt.dtype)), min=limit[0], max=limit[1])
    x = wide(x)
    B = wide(B).repeat_interleave(heads // groups, dim=2, output_size=heads)
    C = wide(C).repeat_interleave(heads // groups, dim=2, output_size=heads)
    pad = (size - T % size) % size
    skip = D[..., None] * _pad(x, pad)
    x = x * wide(dt[..., None])
    A = A.to(x.dtype) * wide(dt)
    x, A, B, C = (_chunks(t, pad, size) for t in (x, A, B, C))
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(_segment_sum(A))
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.permute(0, 2, 3, 4, 1)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", M, x)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, x)
    previous = torch.zeros_like(states[:, :1]) if initial is None else initial[:, None].to(dtype=states.dtype)
    states = torch.cat([previous, states], dim=1)
    decay_chunk = torch.exp(_segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    C_times_states = torch.einsum("bclhn,bchpn->bclhp", C, states)
    y_off = C_times_states * torch.exp(A_cumsum).permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).contiguous().reshape(batch, -1, heads, head_dim) + skip
    return y[:, :T], final


def ssd_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`mamba2_selective_state_update` as Mamba2's scan calls it for one token: x (b, h, p), dt (b, h),
    A (h,) fp32, B, C (b, g, n), state (b, h, p, n). Returns y (b, h, p) in x's dtype and the new state."""
    batch, heads, head_dim = x.shape
    groups, n = B.shape[1], B.shape[-1]
    dt = dt[:, :, None].expand(-1, -1, head_dim)
    dt = F.softplus(dt + dt_bias[:, None].expand(-1, head_dim).to(dt.dtype))[..., None]
    dA = torch.exp(wide(dt) * wide(A[:, None, None].expand(-1, head_dim, n)))
    B = B.reshape(batch, groups, 1, n).expand(batch, groups, heads // groups, n).contiguous()
    dBx = dt * B.reshape(batch, heads, 1, n) * x[..., None]
    new = state * dA + dBx
    C = C.reshape(batch, groups, 1, n).expand(batch, groups, heads // groups, n).contiguous()
    C = C.reshape(batch, heads, n)
    y = torch.bmm(new.to(dtype=C.dtype).view(batch * heads, head_dim, n), C.view(batch * heads, n, 1))
    y = y.view(batch, heads, head_dim)
    y = (y + x * D[:, None].expand(-1, head_dim)).to(y.dtype)
    return y.to(x.dtype), new.to(state.dtype)


def gated_norm(y: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """Mamba2RMSNormGated: y times SiLU(gate) in fp32, RMS-normed over each of `groups` groups, cast
    back to y's dtype, times the weight."""
    dtype = y.dtype
    h = wide(y) * F.silu(wide(gate))
    *prefix, dim = h.shape
    g = h.view(*prefix, groups, dim // groups)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return weight * g.view(*prefix, dim).to(dtype)


def falcon_h1_gated_norm(y: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int, eps: float,
                         before_gate: bool, act: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> torch.Tensor:
    """FalconH1RMSNormGated: the gate before the norm or after it, the weight applied in fp32, one cast
    back at the end. y (b, T, dim). `act` is the gate's activation (KimiLinearRMSNormGated: sigmoid)."""
    dtype = y.dtype
    if not before_gate:
        y = y * act(wide(gate))
    batch, T, dim = y.shape
    h = wide(y).view(batch, T, groups, dim // groups)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = (weight.view(groups, dim // groups) * h).view(batch, T, dim)
    if before_gate:
        h = h * act(wide(gate))
    return h.to(dtype)


class Mamba2Mixer(StateSpaceMixer):
    """The Mamba2 mixer; its settings are `mixer_kinds.Mamba2Settings`."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__(cfg, parts, layer)
        s = self.s
        self.d_inner = s.n_heads * s.head_dim
        self.bc = s.n_groups * s.d_state
        self.limit = (s.time_step_min, float("inf") if s.time_step_max is None else s.time_step_max)
        self._mup: dict[tuple, torch.Tensor] = {}

    def mup(self, like: torch.Tensor) -> torch.Tensor:
        """Falcon-H1's muP vector over [z | x | B | C | dt], ones times each part's multiplier in fp32
        (transformers' `compute_mup_vector`), in the projection's dtype."""
        key = (like.dtype, like.device)
        if key not in self._mup:
            sizes = (self.d_inner, self.d_inner, self.bc, self.bc, self.s.n_heads)
            vector = torch.cat([torch.ones(n) * m for n, m in zip(sizes, self.s.zxbcdt_multipliers, strict=True)])
            self._mup[key] = vector.to(device=like.device, dtype=like.dtype)
        return self._mup[key]

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None) -> torch.Tensor:
        s, (batch, T, _), dtype = self.s, x.shape, x.dtype
        mask = padding_mask(ctx, T)
        state = None if cache is None else cache.states[self.layer]
        x = zero_padding(x, mask)
        if s.in_multiplier != 1.0:
            x = x * s.in_multiplier
        projected = self.in_proj(x)
        if s.zxbcdt_multipliers is not None:
            projected = projected * self.mup(projected)
        gate, xbc, dt = projected.split([self.d_inner, self.d_inner + 2 * self.bc, s.n_heads], dim=-1)
        xbc = causal_conv(xbc.transpose(1, 2), self.conv1d.weight, getattr(self.conv1d, "bias", None), state)
        xbc = zero_padding(xbc.transpose(1, 2), mask)
        hidden, B, C = torch.split(xbc, [self.d_inner, self.bc, self.bc], dim=-1)
        A = -torch.exp(wide(self.A_log))
        previous = None if state is None else state.get("ssm")
        if previous is not None and T == 1:
            y, new = ssd_step(previous, hidden.view(batch, s.n_heads, s.head_dim), dt[:, 0], A,
                              B.view(batch, s.n_groups, s.d_state), C.view(batch, s.n_groups, s.d_state),
                              self.D, self.dt_bias)
            y = y.view(batch, 1, -1)
        else:
            y, new = chunk_scan(hidden.view(batch, T, s.n_heads, s.head_dim), dt, A,
                                B.view(batch, T, s.n_groups, s.d_state), C.view(batch, T, s.n_groups, s.d_state),
                                s.chunk_size, self.D, self.dt_bias, previous, self.limit)
            y = y.reshape(batch, T, self.d_inner)
        if state is not None:
            state["ssm"] = new
        if s.norm == "mamba2":
            y = gated_norm(y, gate, self.norm.weight, s.n_groups, s.norm_eps)
        elif s.norm == "falcon_h1":
            y = falcon_h1_gated_norm(y, gate, self.norm.weight, s.n_groups, s.norm_eps, s.norm_before_gate)
        else:
            y = y * F.silu(gate)
        return self.out_proj(y.to(dtype))
