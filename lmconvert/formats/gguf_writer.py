"""GGUF out: one llama.cpp file, written by the `gguf` package's writer and streamed. Every tensor's
name, shape and type is known before one byte is read, so the header, the metadata and the tensor
table are written first, then each tensor is produced, encoded (cast, or quantized by kquants.py's C
or `gguf.quants.quantize`) and written in turn, a band of rows at a time. A tensor whose source can be
read in bands (`GgufTensor.bands`: one written unchanged from an F32 GGUF or a safetensors file) is
never held whole; any other is, once: peak memory is the largest of those and a few bands.

What goes in (names, transforms, metadata) is decided by convert/export_gguf.py from the tables
in mappings/; this module knows only the file.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import kquants
from .digest import FiniteCheck
from .errors import InputError
from .ggml_floats import chunk_bytes, nonfinite
from .gguf_quant_mix import FALLBACK as K_FALLBACK  # llama-quantize's type where a K type's 256-blocks do not fit
from .gguf_quant_mix import MIXES
from .quant_bands import Banded

if TYPE_CHECKING:
    import torch

# --quant names -> GGML type names: the float types, every type `gguf.quants` can quantize, and
# llama.cpp's K-quants (kquants.py)
QUANTS = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1",
          "q5_0": "Q5_0", "q5_1": "Q5_1", "tq1_0": "TQ1_0", "tq2_0": "TQ2_0", "mxfp4": "MXFP4",
          "q2_k": "Q2_K", "q3_k": "Q3_K", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K"}
DEFAULT_QUANT = "q8_0"  # for sharing; f16/bf16 are lossless for half-precision weights, f32 for any
CHUNK_BYTES = 32 << 20  # float32 rows encoded at a time, by each of ENCODERS threads
ENCODERS = max(1, min(4, os.cpu_count() or 1))
WRITTEN_BY = "lmconvert.written_by"  # metadata key that marks a file lmconvert wrote (--force replaces only those)
HUB_SCHEME = "hf://"  # a recorded source on the Hub: hf://REPO@SHA
SOURCE_KEY = "lmconvert.source"  # the checkpoint the export came from (verify's reference where transformers
#   cannot read the GGUF)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32,
              "TQ1_0": 36, "TQ2_0": 37, "MXFP4": 38,  # llama.cpp's `general.file_type` (LlamaFileType);
              # a K type alone: what `llama-quantize --pure` writes for Q2_K, Q3_K_S, Q4_K_S, Q5_K_S, Q6_K
              "Q2_K": 10, "Q3_K": 11, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18}


def parse_quant(name: str) -> str:
    """The GGML type a --quant names; for one of llama.cpp's mixes (q4_k_m...), the mix's main type
    (`gguf_quant_mix.MIXES`; the tensors' own types are chosen as llama-quantize chooses them)."""
    if name.lower() in MIXES:
        return MIXES[name.lower()][1]
    if name.lower() not in QUANTS:
        raise InputError(f"--quant {name!r}: not a GGUF type lmconvert writes; choose one of "
                         f"{', '.join([*QUANTS, *MIXES])}")
    return QUANTS[name.lower()]


@dataclass(frozen=True)
class GgufTensor:
    """One tensor to write: GGUF name, shape in torch order, GGML type name, data on demand, and
    the check (if any) its encoded bytes must pass: no NaN/Inf that the encoding made."""

    name: str
    shape: tuple[int, ...]
    type: str
    produce: Callable[[], torch.Tensor]
    check: FiniteCheck | None = None
    encoded: bool = False  # `produce` gives the type's bytes themselves (uint8), written as they are
    # the same tensor as bands of rows read on demand (quant_bands.Banded), None where it has none; its
    # NaN/Inf, which `produce` refuses, are counted band by band and refused by `source_check`
    bands: Callable[[], Banded | None] | None = None
    source_check: FiniteCheck | None = None


def tensor_type(shape: Sequence[int], wanted: str) -> str:
    """The type a tensor is stored in: llama.cpp keeps 1-D tensors (norms, biases) in F32, and a
    row length the type's blocks do not divide falls back to F16, as llama.cpp's converter does
    (to K_FALLBACK's type first for a K type, as llama-quantize does)."""
    import gguf

    if len(shape) < 2:
        return "F32"
    for kind in (wanted, K_FALLBACK.get(wanted)):
        if kind is not None and shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][0] == 0:
            return kind
    return "F16"


def _encode(tensor: torch.Tensor, kind: str) -> np.ndarray:
    import gguf
    import torch

    if kind == "F32":
        return tensor.to(torch.float32).contiguous().numpy()
    if kind == "F16":
        return tensor.to(torch.float16).contiguous().numpy()
    if kind == "BF16":  # gguf's own BF16 rounds as torch does; torch's cast is the source of truth here
        return tensor.to(torch.bfloat16).contiguous().view(torch.uint16).numpy().view(np.uint8)
    if kind in kquants.ENCODERS:
        return kquants.quantize(tensor.to(torch.float32).contiguous().numpy(), kind)
    with np.errstate(over="ignore", invalid="ignore"):  # a scale float16 cannot hold: the written check says so
        return gguf.quants.quantize(tensor.to(torch.float32).contiguous().numpy(), gguf.GGMLQuantizationType[kind])


def _nbytes(shape: Sequence[int], kind: str) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    return prod(shape) // block * size


def _add_value(writer: Any, key: str, value: Any) -> None:  # noqa: ANN401 - gguf's writer; metadata of any type
    """llama.cpp's types: counts and ids as uint32, reals as float32, flags as bool."""
    import gguf
    from gguf.gguf_writer import GGUFValue

    t = gguf.GGUFValueType
    if isinstance(value, GGUFValue):  # typed already (the tokenizer's, by gguf's own writer methods)
        writer.add_key_value(key, value.value, value.type, sub_type=value.sub_type)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        sub = (t.BOOL if all(isinstance(v, bool) for v in value) else
               t.INT32 if all(isinstance(v, int) for v in value) else
               t.FLOAT32 if all(isinstance(v, float) for v in value) else t.STRING)
        writer.add_key_value(key, value, t.ARRAY, sub_type=sub)
    else:
        raise TypeError(f"metadata {key}: cannot write a {type(value).__name__}")


def write_gguf(path: Path, arch: str, values: Mapping[str, Any], tensors: Sequence[GgufTensor],
               progress: Callable[[int, int], None] | None = None, max_shard_bytes: int = 0) -> list[Path]:
    """Header, metadata and tensor table first, then each tensor as it is produced. With
    `max_shard_bytes`, llama.cpp's split format (gguf's writer: `NAME-00001-of-00003.gguf` beside
    `path`, each with its `split.*` keys), as llama.cpp's own converter writes it. Returns the
    files written."""
    import gguf

    writer = gguf.GGUFWriter(None, arch, split_max_size=max_shard_bytes)
    for key, value in values.items():
        if key != "general.architecture":
            _add_value(writer, key, value)
    for t in tensors:
        qtype = gguf.GGMLQuantizationType[t.type]
        if t.type in ("F32", "F16"):
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32 if t.type == "F32" else np.float16),
                                   _nbytes(t.shape, t.type))
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(t.shape, qtype)
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), _nbytes(t.shape, t.type), raw_dtype=qtype)
    shard_of = {name: i for i, shard in enumerate(writer.tensors) for name in shard}
    files = writer.format_shard_names(path)
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done, total = 0, sum(_nbytes(t.shape, t.type) for t in tensors)
        for t in tensors:
            fout = writer.fout[shard_of[t.name]]
            if t.encoded:
                writer.write_padding(fout, fout.tell())
                writer.write_padding(fout, _write(t.produce().contiguous().numpy(), fout, t.type, False)[0])
            else:
                banded = None if t.bands is None else t.bands()
                if banded is None or (banded.rows * banded.cols, banded.cols) != (prod(t.shape), t.shape[-1]):
                    _write_tensor(writer, fout, t.produce(), t.type, t.check)
                else:
                    _write_tensor(writer, fout, banded, t.type, t.check, t.source_check)
            done += _nbytes(t.shape, t.type)
            if progress is not None:
                progress(done, total)
    finally:
        writer.close()
    return files


def _write_tensor(writer: Any, fout: Any, tensor: torch.Tensor | Banded, kind: str,  # noqa: ANN401 - gguf's
                  check: FiniteCheck | None = None, source_check: FiniteCheck | None = None) -> None:
    """One tensor's data, aligned as gguf's writer aligns it, encoded a band of rows at a time:
    GGML's blocks lie within a row, so each band encodes to exactly its bytes of the whole, and
    the float32 copy and the quantizer's temporaries stay within CHUNK_BYTES. A `Banded` tensor is
    read a band at a time too (its NaN/Inf counted there and refused by `source_check`), so memory
    holds ENCODERS bands of it, never the whole (llama-quantize holds the whole float32 tensor).
    With `check`, the encoded bytes are checked for NaN/Inf as they are written."""
    writer.write_padding(fout, fout.tell())
    if isinstance(tensor, Banded):
        total, cols, band_of = tensor.rows, tensor.cols, _band_reader(tensor, source_check is not None)
    else:
        rows = tensor.reshape(-1, tensor.shape[-1]) if tensor.dim() > 1 else tensor.reshape(1, -1)
        total, cols = rows.shape
        band_of = lambda start, stop: (rows[start:stop], 0)  # noqa: E731
    band = max(1, CHUNK_BYTES // (cols * 4))
    written, bad, source_bad, pending = 0, 0, 0, deque()

    def encode(start: int) -> tuple[np.ndarray, int]:
        data, found = band_of(start, min(start + band, total))
        return _encode(data, kind), found

    def write(job: Any) -> None:  # noqa: ANN401 - a future
        nonlocal written, bad, source_bad
        data, found_in_source = job.result()
        n, found = _write(data, fout, kind, check is not None)
        written, bad, source_bad = written + n, bad + found, source_bad + found_in_source

    # the K-quant encoders (C), gguf's numpy quantizers, torch's casts and the reads release the GIL:
    # ENCODERS bands encode at once, in order, no more than that many held
    with ThreadPoolExecutor(max_workers=ENCODERS) as pool:
        for start in range(0, total, band):
            pending.append(pool.submit(encode, start))
            if len(pending) == ENCODERS:
                write(pending.popleft())
        while pending:
            write(pending.popleft())
    if source_check is not None:
        source_check.require(source_bad)
    if check is not None:
        check.require(bad)
    writer.write_padding(fout, written)


def _band_reader(tensor: Banded, checked: bool) -> Callable[[int, int], tuple[torch.Tensor, int]]:
    """Rows [start, stop) of a banded tensor, read into a buffer of their own, and their NaN/Inf count
    (if `checked`)."""
    import torch

    from .digest import memory_chunks, scan, tensor_bytes
    from .dtypes import of_torch

    def read(start: int, stop: int) -> tuple[torch.Tensor, int]:
        into = torch.empty(stop - start, tensor.cols, dtype=tensor.native)
        tensor.fill(start, stop, into)
        bad = scan(memory_chunks(tensor_bytes(into)), of_torch(tensor.native).name, None).nonfinite if checked else 0
        return into, bad
    return read


def _write(data: np.ndarray, fout: Any, kind: str, checked: bool) -> tuple[int, int]:  # noqa: ANN401 - gguf's file
    """Write encoded bytes a chunk at a time, each checked (if `checked`) while in cache; returns
    the bytes written and the NaN/Inf values found. Through the file object, not numpy's `tofile`,
    whose short write on a full disk raises an OSError that has lost its errno."""
    flat = memoryview(np.ascontiguousarray(data)).cast("B")
    step, found = chunk_bytes(kind), 0
    for start in range(0, len(flat), step):
        chunk = flat[start:start + step]
        if checked:
            found += nonfinite(chunk, kind)
        fout.write(chunk)
    return len(flat), found


def written_by_lmconvert(path: Path) -> bool:
    """Whether `path` is a GGUF file lmconvert wrote (its metadata says so)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return False
        import gguf

        field = gguf.GGUFReader(path).fields.get(WRITTEN_BY)
        return field is not None and field.contents() == "lmconvert"
    except Exception:  # noqa: BLE001 - anything unreadable is not ours
        return False
