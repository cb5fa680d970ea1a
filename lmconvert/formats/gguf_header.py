"""A GGUF file's header (metadata and tensor table), read with every length checked against the
bytes that remain before anything is allocated for it, and every tensor's extent checked the way
llama.cpp's loader checks it (gguf.cpp) before any tensor is read.

Why not gguf's `GGUFReader`: it trusts what the file claims. A metadata array claiming 2**40
elements in a 190 KB file made it loop at the end of the file with memory growing without bound;
it builds numpy views per array element (a 150k-token vocabulary: 9 s and 800 MB; 2 million
elements: 1.65 GB); and it reads a tensor at any offset, so a misaligned one came back with
shifted weights and two overlapping ones as copies of each other. Here a claim costs nothing
until the file has been shown to hold it, so memory stays a small multiple of the header's bytes.
The `gguf` package still gives the tensor types' block sizes (GGML_QUANT_SIZES).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .errors import InputError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # 1 held 32-bit counts; 2 and 3 differ only in allowing big-endian files
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # llama.cpp asks only for a power of two; 32 is what every writer uses
MAX_DIMS = 4  # GGML_MAX_DIMS
ELEMENTS_PER_BYTE = 8  # more than any GGML type packs (TQ1_0: 256 in 54 bytes)
INT64_MAX = 2**63 - 1

STRING, ARRAY = 8, 9
# GGUFValueType -> (struct / numpy code, name); BOOL read as a byte, nonzero meaning true
SCALARS = {0: ("u1", "uint8"), 1: ("i1", "int8"), 2: ("u2", "uint16"), 3: ("i2", "int16"), 4: ("u4", "uint32"),
           5: ("i4", "int32"), 6: ("f4", "float32"), 7: ("u1", "bool"), 10: ("u8", "uint64"), 11: ("i8", "int64"),
           12: ("f8", "float64")}
STRUCT_CODES = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i", "f4": "f", "u8": "Q", "i8": "q",
                "f8": "d"}
BOOL, UINT32 = 7, 4
MIN_KV = 8 + 4 + 1  # key length, type, a one-byte value
MIN_TENSOR = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
FIX = "the file is truncated or corrupt; re-download or re-convert it"
BROKEN = "llama.cpp refuses such a file too; re-download it or convert the model again"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: Any  # gguf.GGMLQuantizationType
    dims: tuple[int, ...]  # ggml's order, fastest first
    offset: int  # absolute, in the file
    n_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GgufHeader:
    version: int
    order: str  # "<" or ">": the file's byte order
    meta: dict[str, Any]  # every key but the counted ones and GGUF.*, as Python values
    counts: dict[str, int]  # the counted keys' element counts (their values are skipped, not decoded)
    tensors: dict[str, TensorInfo]  # in the file's order
    alignment: int
    data_offset: int
    size: int  # the file's size when the header was read


class _Cursor:
    """Sequential reads through a window of the file; `take` refuses a length past the end of the
    file before reading or allocating anything for it. `what` names the value in an error, with
    `index` for an array's element (formatted only then: a vocabulary is read element by element)."""

    CHUNK = 1 << 20

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path
        self.pos = 0
        self._buf, self._at = b"", 0  # the window and its offset in the file
        self.set_order("<")

    def set_order(self, order: str) -> None:
        self.order = order
        self._structs = {code: struct.Struct(order + STRUCT_CODES[code]) for code in STRUCT_CODES}

    def remaining(self) -> int:
        return self.size - self.pos

    def check(self, n: int, what: str, index: int | None = None) -> None:
        if n > self.size - self.pos:
            what = what if index is None else f"{what}[{index}]"
            raise InputError(f"{self.path}: {what} at byte {self.pos} needs {n} bytes, past the end of the file "
                             f"({self.remaining()} left); {FIX}")

    def take(self, n: int, what: str, index: int | None = None) -> bytes:
        self.check(n, what, index)
        start = self.pos - self._at
        if start + n > len(self._buf):
            self.f.seek(self.pos)
            self._buf, self._at, start = self.f.read(max(n, self.CHUNK)), self.pos, 0
            if len(self._buf) < n:
                raise InputError(f"{self.path}: ends at byte {self.pos + len(self._buf)} while its header was read "
                                 f"(it was {self.size} bytes); it changed while being read, read it again when it "
                                 "is complete")
        self.pos += n
        return self._buf[start:start + n]

    def number(self, code: str, what: str, index: int | None = None) -> Any:  # noqa: ANN401 - int, float
        unpack = self._structs[code]
        value, = unpack.unpack(self.take(unpack.size, what, index))
        return value

    def string(self, what: str, index: int | None = None) -> str:
        raw = self.take(self.number("u8", what, index), what, index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            what = what if index is None else f"{what}[{index}]"
            raise InputError(f"{self.path}: {what} is not UTF-8 ({exc.reason} at byte {exc.start}); {FIX}") from None

    def skip_strings(self, count: int, what: str) -> None:
        for i in range(count):
            self.take(self.number("u8", what, i), what, i)


def _value(cur: _Cursor, key: str, kind: int, decode: bool) -> tuple[Any, int]:
    """(the value, its element count); with `decode` false an array is walked, not decoded."""
    what = f"metadata {key!r}"
    if kind == STRING:
        return cur.string(what), 1
    if kind in SCALARS:
        code, name = SCALARS[kind]
        value = cur.number(code, what)
        return (value != 0 if kind == BOOL else value), 1
    if kind != ARRAY:
        raise InputError(f"{cur.path}: {what} has value type {kind}, which GGUF does not define; {FIX}")
    item = cur.number("u4", f"{what}'s element type")
    count = cur.number("u8", f"{what}'s length")
    if item == STRING:
        cur.check(count * 8, f"{what} (an array of {count} strings)")
        if not decode:
            cur.skip_strings(count, what)
            return None, count
        return [cur.string(what, i) for i in range(count)], count
    if item not in SCALARS:
        raise InputError(f"{cur.path}: {what} is an array of value type {item}, which llama.cpp does not read (GGUF "
                         f"arrays hold numbers, booleans or strings); {BROKEN}")
    code, name = SCALARS[item]
    raw = cur.take(count * int(code[1]), f"{what} (an array of {count} {name})")
    if not decode:
        return None, count
    values = np.frombuffer(raw, dtype=np.dtype(code).newbyteorder(cur.order))
    return (values != 0 if item == BOOL else values).tolist(), count


def _tensor_kind(path: Path, name: str, raw: int) -> tuple[Any, int, int]:
    """(type, block size in elements, block size in bytes)."""
    import gguf

    try:
        kind = gguf.GGMLQuantizationType(raw)
    except ValueError:
        raise InputError(f"{path}: tensor {name!r} has type id {raw}, which gguf does not know (a newer type, or a "
                         "corrupt file); use a file quantized to a common type (F16, Q8_0, Q4_K, ...)") from None
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return kind, block, size


def _tensor_entry(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    """(name, dims, raw type, offset in the data section) of one tensor-table entry."""
    name = cur.string("a tensor name")
    what = f"tensor {name!r}"
    n_dims = cur.number("u4", f"{what}'s dimension count")
    if n_dims > MAX_DIMS:
        raise InputError(f"{cur.path}: {what} has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}, "
                         f"{BROKEN}")
    dims = tuple(cur.number("u8", f"{what}'s dimensions") for _ in range(n_dims))
    for d in dims:
        if d > ELEMENTS_PER_BYTE * cur.size:
            raise InputError(f"{cur.path}: {what} has a dimension of {d}, more elements than a file of "
                             f"{cur.size} bytes can hold; {FIX}")
    return name, dims, cur.number("u4", f"{what}'s type"), cur.number("u8", f"{what}'s offset")


def _alignment(path: Path, meta: dict[str, Any], kinds: dict[str, int]) -> int:
    if "general.alignment" not in meta:
        return DEFAULT_ALIGNMENT
    value = meta["general.alignment"]
    if kinds["general.alignment"] != UINT32 or not 0 < value <= MAX_ALIGNMENT or value & (value - 1):
        raise InputError(f"{path}: general.alignment is {value!r}; it must be a uint32 power of two up to "
                         f"{MAX_ALIGNMENT} (llama.cpp's default: {DEFAULT_ALIGNMENT}); {BROKEN}")
    return value


def _tensor(path: Path, name: str, dims: tuple[int, ...], raw: int, offset: int, data_offset: int,
            data_size: int, alignment: int) -> TensorInfo:
    """The tensor's extent, checked: whole blocks per row, aligned, inside the data section."""
    kind, block, type_size = _tensor_kind(path, name, raw)
    shape = f"{kind.name} {list(reversed(dims))}"
    elements = 1
    for d in dims:
        elements *= d
    if elements > INT64_MAX:
        raise InputError(f"{path}: tensor {name!r} ({shape}) has more elements than ggml can count; {FIX}")
    row = dims[0] if dims else 1
    if row % block:
        raise InputError(f"{path}: tensor {name!r} ({shape}) has rows of {row} elements, not a whole number of "
                         f"{kind.name} blocks of {block}; {BROKEN}")
    n_bytes = elements // block * type_size
    if offset % alignment:
        raise InputError(f"{path}: tensor {name!r} starts at byte {offset} of the data section, not a multiple of "
                         f"the file's alignment {alignment}; {BROKEN}")
    if offset + n_bytes > data_size:
        raise InputError(f"{path}: tensor {name!r} ({shape}) needs bytes {offset} to {offset + n_bytes} of the data "
                         f"section, which holds {data_size}; {FIX}")
    return TensorInfo(name, kind, dims, data_offset + offset, n_bytes)


def _check_overlaps(path: Path, tensors: dict[str, TensorInfo], data_offset: int) -> None:
    """No two tensors share a byte: one written over another reads as a copy of part of it."""
    spans = sorted((t.offset, t.offset + t.n_bytes, t.name) for t in tensors.values() if t.n_bytes)
    for (start, end, name), (next_start, _, other) in zip(spans, spans[1:], strict=False):
        if next_start < end:
            raise InputError(f"{path}: tensors {name!r} (bytes {start - data_offset} to {end - data_offset} of the "
                             f"data section) and {other!r} (from byte {next_start - data_offset}) overlap; {BROKEN}")


def read_header(path: Path, counted: Collection[str] = ()) -> GgufHeader:
    """The header, checked; the keys in `counted` (a tokenizer's huge arrays) only counted."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        cur = _Cursor(f, size, path)
        head = cur.take(4, "the magic") if size >= 4 else b""
        if head != MAGIC:
            raise InputError(f"{path}: not a GGUF file (starts with {head!r}, not b'GGUF'); point at a .gguf "
                             "model file")
        raw = cur.take(4, "the version")
        version = int.from_bytes(raw, "little")
        if version & 0xFFFF == 0:  # written on a big-endian machine
            version = int.from_bytes(raw, "big")
            cur.set_order(">")
        if version not in VERSIONS:
            raise InputError(f"{path}: GGUF version {version}; lmconvert reads versions {VERSIONS[0]} to "
                             f"{VERSIONS[-1]} (llama.cpp's since 2023); convert it again with a current llama.cpp")
        n_tensors = cur.number("u8", "the tensor count")
        n_kv = cur.number("u8", "the metadata count")
        cur.check(n_kv * MIN_KV + n_tensors * MIN_TENSOR, f"{n_kv} metadata entries and {n_tensors} tensors")
        meta: dict[str, Any] = {}
        counts: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string("a metadata key")
            if key in kinds:
                raise InputError(f"{path}: metadata {key!r} appears twice; {BROKEN}")
            kinds[key] = cur.number("u4", f"metadata {key!r}'s type")
            value, count = _value(cur, key, kinds[key], decode=key not in counted)
            if key in counted:
                counts[key] = count
            elif not key.startswith("GGUF."):
                meta[key] = value
        entries: dict[str, tuple[tuple[int, ...], int, int]] = {}
        for _ in range(n_tensors):
            name, *entry = _tensor_entry(cur)
            if name in entries:
                raise InputError(f"{path}: tensor {name!r} appears twice; {BROKEN}")
            entries[name] = tuple(entry)  # type: ignore[assignment]
        alignment = _alignment(path, meta, kinds)
        data_offset = -(-cur.pos // alignment) * alignment
        data_size = max(0, size - data_offset)
        tensors = {name: _tensor(path, name, dims, raw, offset, data_offset, data_size, alignment)
                   for name, (dims, raw, offset) in entries.items()}
        _check_overlaps(path, tensors, data_offset)
        return GgufHeader(version, cur.order, meta, counts, tensors, alignment, data_offset, size)
