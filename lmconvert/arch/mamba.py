"""Mamba (v1): the selective-scan mixer of mamba, falcon_mamba and jamba, and the pieces Mamba2 shares.

Numerics follow transformers' torch path (MambaMixer.forward without the CUDA kernels), op for op:
the input projection into [x | z], a depthwise causal conv1d with SiLU on x, x_proj into
[dt | B | C] (optionally RMS-normed: FalconMamba without weights, Jamba with them), dt_proj's weight
times dt by matmul, then `dt + dt_proj.bias` and softplus in the activation dtype, the scan in fp32
(a step at a time over the prefill, `mamba_selective_scan`'s recurrent loop; one step when decoding,
`mamba_selective_state_update`), the D skip, the SiLU(z) gate, and out_proj in the model dtype.

Padding as transformers applies it (`apply_mask_to_padding_states`): the input and the conv output
are zeroed on padding tokens of a multi-token call; a one-token step has none.

State between calls, in `cache.states[layer]`: "conv", the last `conv_kernel` conv inputs
(B, channels, K) in the activation dtype, and "ssm", the recurrent state (B, d_inner, d_state) in
fp32, as transformers' LinearAttentionLayer keeps them. One deliberate difference: a multi-token call
after others starts its scan from the cached state (transformers' full-sequence scan restarts from
zero there, its own TODO says wrongly); prefill and one-token decoding are transformers' exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .build import attach
from .cache import KVCache
from .causal_conv import causal_conv, padding_mask, zero_padding
from .config import ArchConfig
from .context import Context
from .parts import Part


# ----------------------------------------------------------------------------- shared with mamba2.py
def attach_nested(owner: nn.Module, parts: dict[str, Part]) -> None:
    """`build.attach` for parts whose names hold one dot ("conv1d.weight", "norm.weight"): each such
    part goes onto a plain submodule of that name, made on first use (marked `uncalled`, as it has no
    output for verify to compare); the others onto `owner`. A
    module's own parameters come first in its state_dict, so the kinds declare those first."""
    for name, part in parts.items():
        holder, _, leaf = name.rpartition(".")
        target = owner
        if holder:
            if not hasattr(owner, holder):
                owner.add_module(holder, nn.Module())
                getattr(owner, holder).uncalled = True  # a holder of weights its owner reads: never called
            target = getattr(owner, holder)
        attach(target, {leaf: part})


def wide(t: torch.Tensor) -> torch.Tensor:
    """fp32, where transformers upcasts (`.float()`); float64 stays float64, so that a float64 model
    computes in float64 throughout (the tests' exact reference, where rounding cannot hide a wrong state)."""
    return t if t.dtype == torch.float64 else t.float()


def weightless_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """FalconMambaWeightlessRMSNorm: normed in fp32, cast back."""
    h = wide(x)
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def weighted_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """JambaRMSNorm (LLaMA's): normed in fp32, cast back, times the weight."""
    h = wide(x)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


# ----------------------------------------------------------------------------- the selective scan
def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor, z: torch.Tensor, dt_bias: torch.Tensor,
                   initial: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`mamba_selective_scan`'s recurrent loop: x, dt, z (B, d_inner, T); B, C (B, T, N); A (d_inner, N)
    fp32; D and dt_bias fp32. Returns the output (B, d_inner, T), fp32, and the last state."""
    batch, d_inner, T = x.shape
    dtype = x.dtype
    dt = F.softplus(dt + dt_bias.to(dt.dtype)[..., None])
    dA = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    dBx = dt[:, :, :, None] * wide(B[:, None, :, :]) * wide(x[:, :, :, None])
    state = torch.zeros(batch, d_inner, A.shape[-1], dtype=dtype, device=x.device) if initial is None else initial
    outputs = []
    for i in range(T):
        state = dA[:, :, i] * state + dBx[:, :, i]
        outputs.append(torch.matmul(state.to(dtype), C[:, i, :].unsqueeze(-1))[:, :, 0])
    y = torch.stack(outputs, dim=-1)
    y = y + x * D[None, :, None]
    return y * F.silu(z), state


def selective_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor, z: torch.Tensor,
                   dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`mamba_selective_state_update`: one token, x, dt, z (B, d_inner), B, C (B, N), state (B, d_inner, N);
    D in the model dtype. Returns the output (B, d_inner) in x's dtype and the new state."""
    dt = F.softplus(dt + dt_bias.to(dt.dtype))
    dA = torch.exp(wide(dt)[..., None] * wide(A))
    dBx = wide(dt)[..., None] * wide(B)[:, None, :] * wide(x)[..., None]
    new = wide(state) * dA + dBx
    out = torch.matmul(new.to(C.dtype), C.unsqueeze(-1)).squeeze(-1)
    out = (out + x * D) * F.silu(z)
    return out.to(x.dtype), new.to(state.dtype)


class StateSpaceMixer(nn.Module):
    """What both state-space mixers hold: their settings (`ArchConfig.mixer_settings`), their layer
    (the index of their state in `KVCache.states`) and their declared parts."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__()
        self.s = cfg.mixer_settings
        self.layer = layer
        attach_nested(self, parts)


class MambaMixer(StateSpaceMixer):
    """The Mamba (v1) mixer; its settings are `mixer_kinds.MambaSettings`."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__(cfg, parts, layer)
        self.dt_proj.uncalled = True  # its weight and bias are read, as transformers reads them: no output

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None) -> torch.Tensor:
        s, T, dtype = self.s, x.shape[1], x.dtype
        mask = padding_mask(ctx, T)
        state = None if cache is None else cache.states[self.layer]
        projected = self.in_proj(zero_padding(x, mask)).transpose(1, 2)
        hidden, gate = projected.chunk(2, dim=1)
        hidden = causal_conv(hidden, self.conv1d.weight, getattr(self.conv1d, "bias", None), state)
        hidden = zero_padding(hidden.transpose(1, 2), mask)
        dt, B, C = torch.split(self.x_proj(hidden), [s.dt_rank, s.d_state, s.d_state], dim=-1)
        if s.bc_dt_norm == "weightless":
            dt, B, C = (weightless_rms(t, s.bc_dt_norm_eps) for t in (dt, B, C))
        elif s.bc_dt_norm == "weighted":
            dt = weighted_rms(dt, self.dt_layernorm.weight, s.bc_dt_norm_eps)
            B = weighted_rms(B, self.b_layernorm.weight, s.bc_dt_norm_eps)
            C = weighted_rms(C, self.c_layernorm.weight, s.bc_dt_norm_eps)
        dt = self.dt_proj.weight @ dt.transpose(1, 2)
        hidden = hidden.transpose(1, 2)
        A = -torch.exp(wide(self.A_log))
        dt_bias = wide(self.dt_proj.bias)
        previous = None if state is None else state.get("ssm")
        if previous is not None and T == 1:
            y, new = selective_step(previous, hidden[..., 0], dt[..., 0], A, B[:, 0], C[:, 0], self.D,
                                    gate[..., 0], dt_bias)
            y = y.unsqueeze(-1)
        else:
            y, new = selective_scan(hidden, dt, A, B, C, wide(self.D), gate, dt_bias, previous)
        if state is not None:
            state["ssm"] = new
        return self.out_proj(y.transpose(1, 2).to(dtype))


class MambaHeadsMixer(StateSpaceMixer):
    """Zamba's multi-head Mamba (ZambaMambaMixer's torch path); its settings are `mixer_kinds.MambaHeadsSettings`.
    Each head runs Mamba's scan (`selective_scan`, `selective_step`) on its own channels with its own x_proj and
    dt_proj, computed as transformers computes them: batched matmuls over the heads. State: "conv" as Mamba's,
    "ssm" (B, n_heads, head_dim, d_state) in fp32. A_log stays fp32 in any dtype, as transformers' ZambaMambaMixer
    makes it (an fp32 tensor built in its __init__), so an fp32 checkpoint run in bf16 keeps its A_log as there."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__(cfg, parts, layer)
        self.fp32_parameters = ("A_log",)

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None) -> torch.Tensor:
        s, (batch, T, _), dtype = self.s, x.shape, x.dtype
        heads, head_dim = s.n_heads, s.head_dim
        mask = padding_mask(ctx, T)
        state = None if cache is None else cache.states[self.layer]
        projected = self.in_proj(zero_padding(x, mask)).transpose(1, 2)
        hidden, gate = projected.view(batch, -1, 2, T).chunk(2, dim=2)  # x and z interleaved channel by channel
        hidden = hidden.squeeze(2).contiguous()
        gate = gate.reshape(batch, heads, head_dim, T).transpose(0, 1)
        hidden = causal_conv(hidden, self.conv1d.weight, getattr(self.conv1d, "bias", None), state)
        hidden = zero_padding(hidden.transpose(1, 2), mask).transpose(1, 2)
        hidden = hidden.reshape(batch, heads, head_dim, T).transpose(0, 1)
        params = (self.x_proj_weight[:, None] @ hidden).transpose(-1, -2)
        dt, B, C = torch.split(params, [s.dt_rank, s.d_state, s.d_state], dim=-1)
        dt = self.dt_proj_weight[:, None] @ dt.transpose(-1, -2)
        dt_bias, A = wide(self.dt_proj_bias), -torch.exp(wide(self.A_log))
        previous = None if state is None else state.get("ssm")
        outs, news = [], []
        for h in range(heads):
            if previous is not None and T == 1:
                y, new = selective_step(previous[:, h], hidden[h, ..., 0], dt[h, ..., 0], A[h], B[h, :, 0], C[h, :, 0],
                                        self.D[h], gate[h, ..., 0], dt_bias[h])
                y = y.unsqueeze(-1)
            else:
                y, new = selective_scan(hidden[h], dt[h], A[h], B[h], C[h], wide(self.D[h]), gate[h], dt_bias[h],
                                        None if previous is None else previous[:, h])
            outs.append(y)
            news.append(new)
        if state is not None:
            state["ssm"] = torch.stack(news, dim=1)
        return self.out_proj(torch.cat(outs, dim=1).transpose(1, 2).to(dtype))
