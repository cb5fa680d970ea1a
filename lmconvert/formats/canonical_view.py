"""Any opened checkpoint's tensors under canonical names, as the canonical copy of it would hold
them, without writing that copy: what lets an export start from any format (`convert --to gguf`
straight from an HF directory).

Each canonical tensor is read from the source and transformed (the family's import transform) only
when asked for. One that is the source's bytes unchanged (an identity transform, or one expert's run
of a fused experts tensor) says where those bytes lie (`raw_location`), so an export that leaves it
unchanged copies it byte for byte, as from a canonical shard. `names()` and `position()` give the
order the canonical copy (one default shard, as `convert --to canonical` writes it) would list and
lay out the tensors in, so that an export made in one step writes its tensors in the order the two
steps would.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING

from lmconvert.mappings.tables.table import IDENTITY

from .dtypes import DTYPES
from .errors import InputError
from .quant_scheme import QuantizedWeight
from .source import dtype_name

if TYPE_CHECKING:
    import torch

    from .checkpoint import Checkpoint
    from .quant_bands import Banded

DEFAULT_SHARD_BYTES = 5 * 10**9  # `convert --to canonical`'s default --max-shard-size
LAID_OUT = Path("<canonical>")  # position()'s file: the canonical copy that is never written


class CanonicalTensors:
    """A TensorReader over `checkpoint` by canonical name."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.stored = checkpoint.source.tensors
        self._reader = checkpoint.reader  # one read of a fused experts tensor for all its experts
        self._stored_at = getattr(self.stored, "raw_location", None)
        order = list(checkpoint.plan)  # ingest's order, then by where the bytes lie, as write_shards sorts
        at = {name: self._start(name) for name in order}
        if all(start is not None for start in at.values()):
            order.sort(key=lambda n: (str(at[n][0]), at[n][1]))  # type: ignore[index]
        self._rank = {name: i for i, name in enumerate(order)}
        total = sum(prod(self.shape(n)) * DTYPES[self.dtype_name(n)].itemsize for n in order)
        # a single shard lists its tensors by name (safetensors' header); an index, in layout order
        self._names = sorted(order) if total <= DEFAULT_SHARD_BYTES else order

    def _first(self, name: str) -> str:
        stored = self.checkpoint.plan[name][0]
        return stored[0] if isinstance(stored, tuple) else stored

    def _start(self, name: str) -> tuple[Path, int] | None:
        """Where the source bytes of `name` start: ingest's order for the canonical shards."""
        stored, transform = self.checkpoint.plan[name]
        first = stored[0] if isinstance(stored, tuple) else stored
        placed = getattr(self.stored, "position", None)  # a reader's own order, as ingest's plan takes it
        if placed is not None:
            return placed(first)
        if self._stored_at is None:
            return None
        path, start, _ = self._stored_at(first)
        span = getattr(transform.forward, "span", None)
        if span is not None and not isinstance(stored, tuple):
            start += span(self.stored.shape(first))[0] * DTYPES[dtype_name(self.stored, first)].itemsize
        return path, start

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.checkpoint.shape(name)

    def dtype_name(self, name: str) -> str:
        """As ingest plans it: the stored type (of the first row, for one joined from rows)."""
        return dtype_name(self.stored, self._first(name))

    def get(self, name: str) -> torch.Tensor:
        return self.checkpoint.tensor(name, self._reader)

    def where(self, name: str) -> Path:
        return self.stored.where(self._first(name))

    def position(self, name: str) -> tuple[Path, int]:
        """Where the canonical copy would hold it: only an order."""
        return LAID_OUT, self._rank[name]

    def raw_location(self, name: str) -> tuple[Path, int, int] | None:
        """The file and byte range of a canonical tensor that is stored bytes unchanged, else None."""
        if self._stored_at is None:
            return None
        stored, transform = self.checkpoint.plan[name]
        if isinstance(stored, tuple):
            return None
        located = self._stored_at(stored)  # None: a tensor the reader makes (an FP8 pair, dequantized)
        if transform.forward is IDENTITY.forward or located is None:
            return located
        span = getattr(transform.forward, "span", None)
        if span is None:
            return None
        path, start, _ = located
        size = DTYPES[dtype_name(self.stored, stored)].itemsize
        first, stop = span(self.stored.shape(stored))
        return path, start + first * size, start + stop * size

    def banded(self, name: str) -> Banded | None:
        """`get(name)` as bands of rows read on demand, for a canonical tensor that is one stored
        tensor unchanged and whose reader offers bands of it (`banded`); else None."""
        stored, transform = self.checkpoint.plan[name]
        bands = getattr(self.stored, "banded", None)
        if bands is None or isinstance(stored, tuple) or transform.forward is not IDENTITY.forward:
            return None
        return bands(stored)

    def quantized_parts(self, name: str) -> QuantizedWeight | None:
        """A quantized weight's stored parts (`quantized.py`), with the table's move of them where its
        transform is not a renaming (the parts' counterpart of it: `Packed`); one its transform cannot
        move is refused."""
        parts_of = getattr(self.stored, "quantized_parts", None)
        stored, transform = self.checkpoint.plan[name]
        if parts_of is None or isinstance(stored, tuple):
            return None
        found = parts_of(stored)
        if found is None or transform.forward is IDENTITY.forward:
            return found
        if transform.packed_forward is None or found.scheme.own_dims is None:
            raise InputError(f"{self.stored.where(stored)}: tensor {stored!r} is quantized, and family "
                             f"{self.checkpoint.family.name}'s table transforms it in a way its stored parts cannot "
                             "follow, so it cannot be kept as it is; pass --dtype bfloat16 (or float32) to dequantize "
                             "it")
        return replace(found, move=transform.packed_forward)

    def close(self) -> None:
        """The checkpoint's owner closes it."""
