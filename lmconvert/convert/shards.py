"""Writing tensors as sharded safetensors, streamed: each tensor is produced, written and dropped.

The safetensors library has no incremental writer, so the header is written first from the
planned shapes and dtypes (the format is an 8-byte length, a JSON header and the raw bytes) and
each tensor's bytes follow as it is produced. Tests read every output back through safetensors.
Peak memory is the largest tensor, not the shard. A tensor that passes through unchanged is
copied by the kernel (copy_file_range) from its source file, as `cp` copies.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import BinaryIO

import torch

from .errors import InputError
from .safetensors_dir import DTYPE_NAMES

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", text.upper())
    if not match:
        raise InputError(f"--max-shard-size {text!r}: expected a size such as 5GB or 500MB")
    return int(float(match.group(1)) * _UNITS[match.group(2) or "B"])


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t)).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


@dataclass(frozen=True)
class RawBytes:
    """A tensor stored byte for byte in a file region: copied in the kernel, never decoded."""

    path: Path
    start: int
    end: int


@dataclass(frozen=True)
class Planned:
    """A tensor to be written: its name, shape and dtype up front, its data on demand. With `raw`,
    the bytes are copied straight from the source file and `check` sees them as a tensor that is
    valid only during the call (it views a memory map): a check must not keep it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    produce: Callable[[], torch.Tensor]
    raw: RawBytes | None = None
    check: Callable[[torch.Tensor], None] | None = None

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass
class Written:
    tensors: dict[str, str] = field(default_factory=dict)  # tensor name -> sha256 of its bytes
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256


def _group(planned: Sequence[Planned], max_bytes: int) -> list[list[Planned]]:
    groups: list[list[Planned]] = [[]]
    size = 0
    for p in planned:
        if groups[-1] and size + p.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.nbytes
    return groups


def _header(planned: Sequence[Planned], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for p in planned:
        header[p.name] = {"dtype": DTYPE_NAMES[p.dtype], "shape": list(p.shape),
                          "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors aligns the data start to 8 bytes
    return struct.pack("<Q", len(blob)) + blob


@contextmanager
def _mapped(raw: RawBytes) -> Iterator[memoryview]:
    """The region's bytes through a read-only memory map, unmapped on exit so that resident
    memory stays at one tensor."""
    aligned = raw.start - raw.start % mmap.ALLOCATIONGRANULARITY
    with open(raw.path, "rb") as f:
        m = mmap.mmap(f.fileno(), raw.end - aligned, offset=aligned, access=mmap.ACCESS_READ)
    view = memoryview(m)[raw.start - aligned:]
    try:
        yield view
    finally:
        view.release()
        try:
            m.close()
        except BufferError:  # a traceback still holds a view of it: unmapped when that goes
            pass


def _write_all(out: BinaryIO, data: memoryview | bytes) -> None:
    with memoryview(data) as view:
        done = 0
        while done < len(view):  # one write moves at most ~2 GB on Linux
            with view[done:] as rest:
                done += out.write(rest)


def _copy(raw: RawBytes, out: BinaryIO, view: memoryview) -> None:
    """Kernel-side copy (copy_file_range), as cp does; plain writes where the kernel cannot."""
    position = out.tell()
    with open(raw.path, "rb") as src:
        done, count = 0, raw.end - raw.start
        try:
            while done < count:
                n = os.copy_file_range(src.fileno(), out.fileno(), count - done, raw.start + done)
                if n == 0:
                    raise OSError("copy_file_range made no progress")
                done += n
        except OSError:
            out.seek(position)
            _write_all(out, view)


def _as_tensor(view: memoryview, p: Planned) -> torch.Tensor:
    if p.nbytes == 0:
        return torch.empty(p.shape, dtype=p.dtype)
    with warnings.catch_warnings():  # read-only map: the tensor is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(view, dtype=torch.uint8).view(p.dtype).reshape(p.shape)


def _sha256(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def write_safetensors(path: Path, planned: Sequence[Planned], metadata: dict[str, str] | None = None,
                      progress: Callable[[], None] | None = None, hashed: bool = True) -> Written:
    """Write one safetensors file. While the main thread copies or writes a tensor, two worker
    threads hash it (alone, and as part of the file) and run its check."""
    written = Written()
    file_hash = hashlib.sha256()
    with ThreadPoolExecutor(2) as pool, open(path, "wb", buffering=0) as out:
        head = _header(planned, metadata)
        _write_all(out, head)
        file_hash.update(head)
        for p in planned:
            with ExitStack() as stack:
                jobs: list[Future] = []
                if p.raw is not None:
                    data = stack.enter_context(_mapped(p.raw))
                else:
                    t = p.produce()
                    if tuple(t.shape) != p.shape or t.dtype != p.dtype:
                        raise RuntimeError(f"{p.name}: produced {t.dtype} {list(t.shape)}, "
                                           f"planned {p.dtype} {list(p.shape)}")
                    data = _bytes(t)
                stack.callback(wait, jobs)  # registered after the map, so it runs before the unmap, even on errors
                if hashed:
                    jobs += [pool.submit(file_hash.update, data), pool.submit(_sha256, data)]
                if p.raw is not None and p.check is not None:
                    jobs.append(pool.submit(p.check, _as_tensor(data, p)))
                if p.raw is not None:
                    _copy(p.raw, out, data)
                else:
                    _write_all(out, data)
                results = [job.result() for job in jobs]
                if hashed:
                    written.tensors[p.name] = results[1]
                del data
            if progress is not None:
                progress()
    if hashed:
        written.files[path.name] = file_hash.hexdigest()
    return written


def write_shards(planned: Sequence[Planned], directory: Path, max_shard_bytes: int, stem: str = "model",
                 progress: Callable[[int, int], None] | None = None, hashed: bool = True) -> Written:
    """Shards of at most max_shard_bytes (a larger tensor gets a shard of its own), named and
    indexed as transformers names them. `hashed=False` skips the sha256 sums (HF exports record
    none)."""
    groups = _group(planned, max_shard_bytes)
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(planned))

    if len(groups) == 1:
        return write_safetensors(directory / f"{stem}.safetensors", groups[0], progress=tick, hashed=hashed)
    written, weight_map = Written(), {}
    for i, group in enumerate(groups, start=1):
        file = f"{stem}-{i:05d}-of-{len(groups):05d}.safetensors"
        part = write_safetensors(directory / file, group, progress=tick, hashed=hashed)
        written.tensors.update(part.tensors)
        written.files.update(part.files)
        weight_map.update({p.name: file for p in group})
    total = sum(p.nbytes for p in planned)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return written
