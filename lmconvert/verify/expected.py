"""What our decoder must reproduce: transformers' outputs on one token batch, recorded once, then
checked either right away (`verify`) or later from a golden file, without transformers."""

from __future__ import annotations

import gc
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any

import torch

from lmconvert.arch import ArchConfig
from lmconvert.formats.dtypes import torch_dtype
from lmconvert.formats.source import Loadable
from lmconvert.mappings.tables.table import TensorTable

from .budget import needed
from .layer_progress import Stages, counting_layers
from .localize import OwnErrors, own_errors
from .reference import reference_greedy, reference_model, reference_trace
from .tolerance import Tolerance

PACKAGES = ("lmconvert", "torch", "transformers", "accelerate", "safetensors", "tokenizers")


def versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata: nothing is imported to learn them."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


@dataclass
class Expected:
    ids: torch.Tensor  # (B, T) the token batch
    logits: torch.Tensor  # transformers in the compute dtype
    points: dict[str, torch.Tensor]  # fp32: transformers' points; low precision: its fp32 run's
    dtype: str
    device: str
    tolerance: Tolerance
    exact_logits: torch.Tensor | None = None  # low precision: transformers in fp32
    reference_error: float | None = None  # low precision: mean |logits - exact_logits|
    own: OwnErrors | None = None  # low precision: transformers' own error at each point
    generation: tuple[torch.Tensor, torch.Tensor] | None = None  # (prompt + tokens, step logits)
    prompt_tokens: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # reference, tokens, versions, layout_problems, ...
    attention_mask: torch.Tensor | None = None  # (B, T) 1/0: rows left-padded (`verify --padded`); None: unpadded


def generation_plan(arch: ArchConfig, seq_len: int, new_tokens: int) -> tuple[int, int]:
    """(prompt tokens, new tokens) for greedy agreement: the first row's first tokens, within the
    model's positions."""
    prompt = min(seq_len, 32)
    return prompt, max(0, min(new_tokens, arch.max_positions - prompt))


@torch.no_grad()
def record(reference: Loadable, arch: ArchConfig, table: TensorTable, ids: torch.Tensor, dtype: str, device: str,
           max_memory: int | None = None, new_tokens: int = 16, info: dict[str, Any] | None = None,
           attention_mask: torch.Tensor | None = None, stages: Stages | None = None) -> Expected:
    """Run transformers on `ids` (under `attention_mask`, for left-padded rows) in `dtype` (and in
    fp32 too when that is lower precision), with every point recorded, and greedy generation from
    the first row (never padded)."""
    tolerance = Tolerance.for_dtype(dtype)
    prompt_len, new_tokens = generation_plan(arch, ids.shape[1], new_tokens)
    on_device = ids.to(device)
    mask = None if attention_mask is None else attention_mask.to(device)
    reserve = needed(arch, *ids.shape, new_tokens)[1]  # on each GPU a spread reference uses
    with (reference_model(reference, torch_dtype(dtype), device, max_memory, reserve) as model,
          counting_layers(stages, f"transformers, {dtype}", model, arch.n_layers, 1 + new_tokens)):
        trace = reference_trace(model, on_device, arch, table, mask)
        generation = reference_greedy(model, on_device[:1, :prompt_len], new_tokens) if new_tokens else None
    del model  # before the fp32 run loads: never two models at once
    gc.collect()
    generation = tuple(t.cpu() for t in generation) if generation else None
    base = dict(ids=ids.cpu(), logits=trace.logits.cpu(), dtype=dtype, device=device, tolerance=tolerance,
                generation=generation, prompt_tokens=prompt_len,
                attention_mask=None if attention_mask is None else attention_mask.cpu(),
                info={"reference": str(reference), "versions": versions(), "layout_problems": trace.problems,
                      **(info or {})})
    if tolerance.exact:
        return Expected(points=trace.points, **base)
    with (reference_model(reference, torch.float32, device, max_memory, reserve) as model,
          counting_layers(stages, "transformers, float32 (its own error)", model, arch.n_layers, 1)):
        exact = reference_trace(model, on_device, arch, table, mask)
    exact_logits = exact.logits.cpu()
    return Expected(points=exact.points, exact_logits=exact_logits, own=own_errors(trace.points, exact.points),
                    reference_error=float((trace.logits.cpu().float() - exact_logits.float()).abs().mean()), **base)
