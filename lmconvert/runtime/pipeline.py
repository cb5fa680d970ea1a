"""Pipeline placement on one host: the canonical Decoder's blocks spread over devices, activations
moved between them. The simple alternative to tensor parallelism when one process may see several
GPUs (or a GPU and the CPU): no process group, no collectives, and every layer computes exactly
what it computes on one device (same kernels, whole weights), so fp32 results equal the
single-device ones bit for bit on like devices. Only one device works at a time, so it buys
memory, not speed.

`place(model, devices)` splits the blocks into contiguous runs, one per device, as evenly as
their count allows; the embeddings go with the first run, the final norm and LM head with the
last (with the first when the head is the tied embedding). A forward pre-hook on each block moves
the hidden state, and a copy of the call's Context (positions, masks; RoPE tables are made from
them on their device), to the block's device; each block's KV cache stays on its device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lmconvert.arch import ConfigError, Decoder
from lmconvert.arch.context import Context


def block_devices(n_layers: int, devices: Sequence[str | torch.device]) -> list[torch.device]:
    """Each block's device: contiguous runs, the first `n_layers % len(devices)` runs one longer."""
    if not devices:
        raise ConfigError("pipeline placement: name at least one device")
    per, extra = divmod(n_layers, len(devices))
    placed: list[torch.device] = []
    for i, device in enumerate(devices):
        placed += [torch.device(device)] * (per + (i < extra))
    return placed


def context_on(ctx: Context, device: torch.device) -> Context:
    """`ctx` with its tensors on `device`, made once per device and call (kept in the call's memo)."""
    if ctx.q_pos.device == device:
        return ctx
    key = ("device", device)
    if key not in ctx._memo:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        # the same `shared_kv`: a KV-shared layer (Gemma 4) reads its source layer's K/V on another device
        ctx._memo[key] = Context(move(ctx.q_pos), move(ctx.k_pos), ctx.dtype, move(ctx.positions), move(ctx.keys),
                                 shared_kv=ctx.shared_kv)
    return ctx._memo[key]


def _to_block_device(block: nn.Module, args: tuple) -> tuple:
    device = next(block.parameters()).device
    h, ctx, *rest = args
    return (h.to(device), context_on(ctx, device), *rest)


def place(model: Decoder, devices: Sequence[str | torch.device]) -> Decoder:
    """`model` with its blocks spread over `devices` (in place; returned for chaining). Token ids go
    to the first device; the logits come back on the head's."""
    if model.rel_bias is not None and len(set(map(str, devices))) > 1:
        raise ConfigError("pipeline placement: the relative position bias is shared by every block; "
                          "run this model on one device")
    if model.shared_blocks is not None and len(set(map(str, devices))) > 1:
        raise ConfigError("pipeline placement: the shared transformer blocks (Zamba's) are called by blocks on every "
                          "device; run this model on one device")
    placed = block_devices(len(model.layers), devices)
    first = torch.device(devices[0])
    head = first if model.cfg.tie_embeddings else placed[-1] if placed else first  # a tied head: the embedding's
    for name in ("embed", "project_in", "pos_embed", "embed_norm", "ple", "altup_in"):
        if getattr(model, name) is not None:
            getattr(model, name).to(first)
    for block, device in zip(model.layers, placed, strict=True):
        block.to(device)
        block.register_forward_pre_hook(_to_block_device)
    for name in ("altup_out", "final_norm", "head_transform", "project_out", "lm_head"):
        if getattr(model, name) is not None:
            getattr(model, name).to(head)
    for module in (model.altup_out, model.final_norm):  # Gemma 3n: the streams merge on the head's device
        if module is not None:
            module.register_forward_pre_hook(lambda _m, args: (args[0].to(head), *args[1:]))
    return model
