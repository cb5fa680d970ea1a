"""The pieces every convolving token mixer shares (LFM2's short convolution, Mamba, Mamba2, gated
delta-nets): transformers' depthwise causal conv1d over a kept window of inputs, and the padding
mask its recurrent layers apply (`apply_mask_to_padding_states`). One implementation, so the four
kinds' windows and padding agree by construction."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .context import Context


def padding_mask(ctx: Context, T: int) -> torch.Tensor | None:
    """transformers' `create_recurrent_attention_mask`: the new tokens' columns of the padding mask
    (B, T), or None for one token or no padding."""
    return None if ctx.keys is None or T == 1 else ctx.keys[:, -T:]


def zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`apply_mask_to_padding_states`: x (B, T, C) times the mask, in x's dtype."""
    return x if mask is None else (x * mask[:, :, None]).to(x.dtype)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                state: dict[str, torch.Tensor] | None, silu: bool = True) -> torch.Tensor:
    """transformers' `causal_conv1d_forward`, with SiLU (Mamba, gated delta-nets) or without (LFM2):
    x (B, C, T), weight (C, 1, K). One token
    after a cached window: `causal_conv1d_update` over the window and the token. Otherwise
    `causal_conv1d_fn` over the cached window (or, on a first call, a zero pad up to K) and x, of
    which the last T outputs are kept. The window kept is the last K inputs."""
    T, channels = x.shape[-1], x.shape[1]
    w = weight.squeeze(1)
    K = w.shape[-1]
    window = None if state is None else state.get("conv")
    if window is not None and T == 1:
        full = torch.cat([window, x], dim=-1).to(w.dtype)
        state["conv"] = full[:, :, -K:].to(window.dtype)
        out = F.conv1d(full, w.unsqueeze(1), bias, padding=0, groups=channels)[:, :, -T:]
        return (F.silu(out) if silu else out).to(x.dtype)
    if state is not None:
        if window is None:
            full = x if T >= K else F.pad(x, (K - T, 0), value=0)
        else:
            full = torch.cat([window, x], dim=-1)
        state["conv"] = full[..., -K:].to(x.dtype if window is None else window.dtype).contiguous()
    else:
        full = x
    out = F.conv1d(full.to(w.dtype), weight=w.unsqueeze(1), bias=bias, padding=K - 1,
                   groups=channels)[:, :, :full.shape[-1]]
    out = (F.silu(out) if silu else out).to(full.dtype)
    return out if state is None else out[:, :, -T:]
