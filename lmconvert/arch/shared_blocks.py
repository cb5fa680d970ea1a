"""Transformer blocks held once and called from several layers (Zamba2's shared transformer,
`ArchConfig.shared_blocks`, augment_config.SharedBlocksConfig).

The Decoder registers each block once (`shared_blocks.{j}`: its norms, the standard attention's q, k, v, o
and a gated FFN with one fused gate/up projection); each calling layer holds a `SharedCall`
(`layers.{i}.shared`) with its own adapters and `linear`, and reaches its block through a plain reference,
so that `state_dict` lists every shared tensor once, as transformers' save_pretrained writes it.

A call's attention is the standard attention module (arch/attention.py) built for this layer, whose
projections are the block's, seen through `Adapted`: the block's linear plus, where the model has them,
the call's adapter (`up(down(x))`), added as transformers adds them (`q_proj(x) + adapter(x)`). Being
this layer's own module, it caches its keys and values in this layer's KV slot (`cache.keys[i]`,
which a mixer layer leaves unused: its state is `cache.states[i]`): the calls share weights, not keys.
"""

from __future__ import annotations

from importlib import import_module

import torch
from torch import nn

from .activations import ACTIVATIONS
from .attention_kinds import attention_kind
from .cache import KVCache
from .config import ArchConfig
from .context import Context
from .norms import Norm
from .rope import Rotary
from .shapes import shared_attention_parts


def adapter(d_in: int, rank: int, d_out: int) -> nn.Sequential:
    """transformers' adapter: Sequential(Linear(d_in, rank), Linear(rank, d_out)), no biases (names `.0`, `.1`)."""
    return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=False))


class SharedFFN(nn.Module):
    """Zamba2MLP: act(gate) * up from one fused projection's halves, plus the call's adapter on it, then down; or
    ZambaMLP: gate and up two projections, no adapter."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        if cfg.shared_blocks.fused_gate_up:
            self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=cfg.mlp_bias)
        else:
            self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias)
            self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor, adapt: nn.Module | None) -> torch.Tensor:
        if not hasattr(self, "gate_up"):
            return self.down(self.act(self.gate(x)) * self.up(x))
        gate_up = self.gate_up(x)
        gate, up = torch.chunk(gate_up if adapt is None else gate_up + adapt(x), 2, dim=-1)
        return self.down(self.act(gate) * up)


class SharedBlock(nn.Module):
    """One shared block's parameters (`shared_blocks.{j}`): attn_norm (2 d_model), attn (q, k, v, o), mlp_norm, mlp."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.attn_norm = Norm(2 * cfg.d_model, cfg.norm)
        self.attn = nn.Module()
        for name, part in shared_attention_parts(cfg).items():
            setattr(self.attn, name, nn.Linear(part.d_in, part.d_out, bias=part.bias))
        self.mlp_norm = Norm(cfg.d_model, cfg.norm)
        self.mlp = SharedFFN(cfg)


class Adapted(nn.Module):
    """A shared projection seen from one call: `base(x)`, plus `adapt(x)` where the call has an adapter. Both are
    held as plain references (their parameters are registered once, by the block and by the call)."""

    def __init__(self, base: nn.Linear, adapt: nn.Module | None) -> None:
        super().__init__()
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "adapt", adapt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        return out if self.adapt is None else out + self.adapt(x)


class SharedCall(nn.Module):
    """Layer `layer`'s call of its shared block (`layers.{i}.shared`): its adapters and `linear`, registered here;
    `attn`, this layer's attention over the block's projections (no parameters of its own)."""

    def __init__(self, cfg: ArchConfig, layer: int, block: SharedBlock, rotary: Rotary | None) -> None:
        super().__init__()
        shared, d = cfg.shared_blocks, cfg.d_model
        object.__setattr__(self, "block", block)
        if shared.attn_adapters:
            self.q_adapter, self.k_adapter, self.v_adapter = (adapter(2 * d, shared.adapter_rank, 2 * d)
                                                              for _ in range(3))
        self.gate_up_adapter = adapter(d, shared.adapter_rank, 2 * cfg.d_ff) if shared.adapter_rank is not None \
            else None
        self.linear = nn.Linear(d, d, bias=False)
        wide = cfg.shared_attention_config()
        module, _, name = attention_kind(wide.attention).module.partition(":")
        self.attn = getattr(import_module(module), name)(wide, {}, layer, rotary, None)
        for proj in ("q", "k", "v", "o"):
            setattr(self.attn, proj, Adapted(getattr(block.attn, proj), getattr(self, f"{proj}_adapter", None)))

    def forward(self, h: torch.Tensor, ctx: Context, cache: KVCache | None) -> torch.Tensor:
        """Zamba2AttentionDecoderLayer on concat(h, embeddings), then this call's `linear`."""
        b = self.block
        x = b.attn_norm(torch.concatenate([h, ctx.embeddings], dim=-1))
        x = b.mlp_norm(self.attn(x, ctx, cache))
        return self.linear(b.mlp(x, self.gate_up_adapter))
