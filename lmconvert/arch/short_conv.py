"""LFM2's gated short convolution (`mixer="short_conv"`), as transformers' torch path computes it
(`Lfm2ShortConv` with `causal_conv1d_forward`'s fallbacks, not the causal_conv1d kernels).

in_proj gives B, C and x; B*x runs through a depthwise causal convolution of width K; C times its
output goes through out_proj. Padding tokens are zeroed before in_proj in a forward of more than one
token. The state is the convolution's last K inputs (B, d_model, K), in `cache.states[layer]["conv"]`.
transformers takes three paths, each followed here: without a cache, one convolution padded by K - 1;
with a cache and more than one token, the state (zeros at first, the new inputs left-padded to K) and
the new inputs through the same padded convolution; a single cached token, the state and the token
through an unpadded convolution (`causal_conv1d_update`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .build import attach
from .cache import KVCache
from .config import ArchConfig
from .context import Context
from .parts import Part


class ShortConv(nn.Module):
    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__()
        attach(self, parts)
        self.conv.uncalled = True  # run as F.conv1d over the state, never called: no output of its own (verify)
        self.layer, self.kernel = layer, cfg.mixer_settings.kernel

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        T = x.shape[1]
        if ctx.keys is not None and T > 1:  # apply_mask_to_padding_states: a single token is never padding
            x = (x * ctx.keys[:, -T:, None]).to(x.dtype)
        b, c, h = self.in_proj(x).transpose(-1, -2).chunk(3, dim=-2)
        h = b * h
        weight, bias, K = self.conv.weight, self.conv.bias, self.kernel
        channels = weight.shape[0]
        state = cache.states[self.layer].get("conv") if cache is not None else None
        if state is not None and T == 1:  # causal_conv1d_update
            full = torch.cat([state, h], dim=-1).to(weight.dtype)
            cache.states[self.layer]["conv"] = full[:, :, -K:].to(state.dtype)
            out = F.conv1d(full, weight, bias, padding=0, groups=channels)[:, :, -T:].to(h.dtype)
        else:
            full = h
            if cache is not None:  # update_conv_state: the state before the new inputs, or zeros up to K
                if state is not None:
                    full = torch.cat([state, h], dim=-1)
                elif T < K:
                    full = F.pad(h, (K - T, 0), value=0)
                cache.states[self.layer]["conv"] = full[:, :, -K:].clone()
            out = F.conv1d(full.to(weight.dtype), weight, bias, padding=K - 1, groups=channels)
            out = out[:, :, :full.shape[-1]].to(h.dtype)[:, :, -T:]
        y = (c * out).transpose(-1, -2).contiguous()
        return self.out_proj(y)
