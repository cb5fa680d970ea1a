"""The canonical decoder run one block at a time, for checkpoints larger than memory.

The Decoder is built on the meta device (no memory), and each stage's tensors are read from the
checkpoint just before the stage runs and dropped right after: the embeddings, then every block,
then the final norm and LM head (the embeddings again when they are tied). Peak memory is the
largest stage plus activations, whatever the model's size. The stages run the same modules, in
the same order, on the same tensors as `Decoder.forward`, so the logits are bit for bit those of
the in-memory model (tested).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from lmconvert.arch import ArchConfig, Decoder, KVCache
from lmconvert.arch.moe import kept_in_fp32
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.formats.checkpoint import Checkpoint, open_checkpoint, opened
from lmconvert.formats.errors import InputError

Weights = dict[str, Callable[[], torch.Tensor]]  # canonical name -> reads that one tensor


@contextmanager
def open_weights(path: Path) -> Iterator[tuple[ArchConfig, Weights]]:
    """The ArchConfig and a lazy reader per canonical tensor, for a checkpoint in any format."""
    with open_checkpoint(path) as checkpoint:
        yield checkpoint.arch, checkpoint.weights()


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    libc = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Give freed heap memory back to the OS. glibc keeps freed chunks below its mmap threshold
    (a block's 8 MB projections, say) in the heap, so without this a process's RSS creeps up by
    ~15 MB per block streamed and the next stage lands on top of it (measured on a 1B model:
    1017 MB peak instead of 787 MB). A no-op where there is no glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _stage_of(name: str, tied: bool) -> tuple[str, ...]:
    """The stages that need a tensor: a block, the embedding, the head, or all of them."""
    first = name.split(".", 1)[0]
    if first == "layers":
        return (".".join(name.split(".", 2)[:2]),)
    if first == "embed":
        return ("embed", "head") if tied else ("embed",)
    if first in ("pos_embed", "project_in", "ple", "altup_in"):
        return ("embed",)
    if first in ("altup_out", "final_norm", "head_transform", "project_out", "lm_head"):
        return ("head",)
    return ("resident",)  # shared by every layer (T5's relative bias table): kept for the whole run


class StreamedDecoder:
    """Callable like a Decoder (`model(ids, cache=cache)`, `new_cache()`); `model` is the meta
    skeleton whose modules run, for hooks."""

    def __init__(self, arch: ArchConfig, weights: Weights, dtype: torch.dtype | None,
                 device: str | torch.device = "cpu", attention: str = "eager") -> None:
        missing = sorted(set(parameter_shapes(arch)) - set(weights))
        if missing:
            raise InputError(f"checkpoint lacks tensor(s): {', '.join(missing[:5])}")
        with torch.device("meta"):
            self.model = Decoder(arch)
        self.model.set_attention(attention).eval()
        self.weights, self.dtype, self.device = weights, dtype, torch.device(device)
        self.fp32 = kept_in_fp32(self.model)
        self.stages: dict[str, list[str]] = {}
        for name in weights:
            for stage in _stage_of(name, arch.tie_embeddings):
                self.stages.setdefault(stage, []).append(name)
        self._load(self.stages.get("resident", []))

    def _assign(self, name: str, tensor: torch.Tensor) -> None:
        path, attr = name.rsplit(".", 1)
        module = self.model.get_submodule(path)
        if attr in module._parameters:
            setattr(module, attr, nn.Parameter(tensor, requires_grad=False))
        else:
            module.register_buffer(attr, tensor)

    def _load(self, names: list[str]) -> None:
        for name in names:
            t = self.weights[name]()
            dtype = torch.float32 if name in self.fp32 else self.dtype or t.dtype
            self._assign(name, t.to(device=self.device, dtype=dtype))

    def _unload(self, names: list[str]) -> None:
        for name in names:
            path, attr = name.rsplit(".", 1)
            current = getattr(self.model.get_submodule(path), attr)
            self._assign(name, torch.empty(current.shape, dtype=current.dtype, device="meta"))

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        names = self.stages.get(stage, [])
        try:
            self._load(names)
            yield
        finally:
            self._unload(names)
            release_freed_memory()

    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, cache: KVCache | None = None,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab): `Decoder.forward`'s steps, each stage loaded only while it runs."""
        model = self.model
        past = cache.length if cache is not None else 0
        positions = model.default_positions(ids, past, attention_mask)
        if cache is not None:
            cache.advance(ids.shape[1])
        with self.stage("embed"):
            h, ctx = model.start(ids, past, positions, attention_mask)
        for i, block in enumerate(model.layers):
            with self.stage(f"layers.{i}"):
                h = block(h, ctx, cache)
        with self.stage("head"):
            return model.logits(h)


@contextmanager
def streamed(checkpoint: Path | Checkpoint, dtype: torch.dtype | None, device: str | torch.device = "cpu",
             attention: str = "eager") -> Iterator[StreamedDecoder]:
    """A StreamedDecoder over a checkpoint, its files open for as long as it is used."""
    with opened(checkpoint) as ckpt:
        yield StreamedDecoder(ckpt.arch, ckpt.weights(), dtype, device, attention)
