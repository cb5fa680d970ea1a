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
from torch import nn

from .build import attach
from .cache import KVCache
from .causal_conv import causal_conv
from .config import ArchConfig
from .context import Context
from .parts import Part


class ShortConv(nn.Module):
    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__()
        attach(self, parts)
        self.layer = layer

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        T = x.shape[1]
        if ctx.keys is not None and T > 1:  # apply_mask_to_padding_states: a single token is never padding
            x = (x * ctx.keys[:, -T:, None]).to(x.dtype)
        b, c, h = self.in_proj(x).transpose(-1, -2).chunk(3, dim=-2)
        state = cache.states[self.layer] if cache is not None else None
        out = causal_conv(b * h, self.conv.weight, self.conv.bias, state, silu=False)
        y = (c * out).transpose(-1, -2).contiguous()
        return self.out_proj(y)
