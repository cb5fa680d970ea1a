"""Reading one rank's slice of a canonical tensor, for tensor parallelism (`runtime/tensor_parallel.py`).

A tensor stored under its canonical meaning (a canonical directory, or an HF safetensors family whose
rule for it is a plain rename, as LLaMA's are) is read with safetensors' `get_slice`: only the rows or
columns asked for leave the file, so a rank never holds the whole weight. A tensor that reaches the
canonical layout only through a transform (a fused qkv split, a permutation, a GGUF dequantization,
a `.bin` pickle) cannot be sliced before the transform: it is read whole, one tensor at a time, cut,
and let go; `whole_reads` lists those, so a caller can tell (and tests can prove) which reads were
slices. Convert such a checkpoint to the canonical format once to load it slice by slice.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open

from lmconvert.mappings.tables.table import IDENTITY

from .safetensors_dir import TensorSource

if TYPE_CHECKING:
    import torch

    from .checkpoint import Checkpoint


class SliceReader:
    """Slices of a checkpoint's canonical tensors. `largest` is the most bytes any one returned or
    intermediate tensor held: the peak a single read added to a rank's memory."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.whole_reads: list[str] = []
        self.largest = 0
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def _sliceable(self, canonical: str) -> tuple[Path, str] | None:
        name, transform = self.checkpoint.plan[canonical]
        tensors = self.checkpoint.source.tensors
        if transform is not IDENTITY or not isinstance(tensors, TensorSource):
            return None
        return tensors.where(name), name

    def read(self, canonical: str, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """`canonical`[start:stop] along `dim` (the whole tensor when `dim` is None), as stored."""
        where = self._sliceable(canonical)
        if where is None:
            whole = self.checkpoint.weights()[canonical]()
            self.whole_reads.append(canonical)
            self.largest = max(self.largest, whole.nbytes)
            part = whole if dim is None else whole.narrow(dim, start, (stop or whole.shape[dim]) - start).clone()
            return part
        file, name = where
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(safe_open(str(file), framework="pt"))
        view = self._handles[file].get_slice(name)
        index: list[slice] = [slice(None)] * len(view.get_shape())
        if dim is not None:
            index[dim] = slice(start, stop)
        part = view[tuple(index)]
        self.largest = max(self.largest, part.nbytes)
        return part

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> SliceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
