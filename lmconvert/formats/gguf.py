"""GGUF in: llama.cpp's single-file format, read with the `gguf` package and presented in
transformers' layout (an HF config dict and tensors under HF names), so the family mappings do
the rest.

This module reads the file; what llama.cpp's converter changed on the way in is undone by the
tables in mappings/: the metadata becomes a config.json by mappings/gguf_metadata.py, and each
tensor is found and restored (q/k rows unpermuted, Gemma's `w + 1` norms, padded vocabulary rows)
by the GGUF tensor table in mappings/gguf.py, the way transformers' own GGUF loader does it.

Quantized tensors are dequantized into float32, bit for bit what `gguf.quants.dequantize` (the
function transformers uses) gives: ggml_dequant.py for the common types, many times faster, gguf's
code for the rest. F32, F16 and BF16 tensors pass through. One dtype per file, transformers' rule: the
half type of a float file (its F32 tensors are the norms), float32 once anything is quantized.
Tensors are read lazily, one at a time, with os.pread (gguf_header.py reads and checks the header).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmconvert.arch.shapes import parameter_shapes
from lmconvert.mappings import MappingError, family_for
from lmconvert.mappings.family import tensor_sizes as family_tensor_sizes
from lmconvert.mappings.gguf.metadata import LLAMA3_STATED, TOKEN_IDS, arch_entry, hf_config
from lmconvert.mappings.tables.gguf import GgufArch, tensor_sizes
from lmconvert.mappings.tables.table import IDENTITY, TensorTable, Transform, out_shape
from lmconvert.mappings.tables.transforms import same_bits

from . import ggml_dequant, schema
from .checkpoint_files import within
from .claims import check_layer_claim, layers_held
from .errors import InputError
from .gguf_header import MAGIC, TensorInfo, read_header
from .gguf_writer import HUB_SCHEME, SOURCE_KEY
from .quant_bands import Banded, pread_into, stored_rows
from .source import Loadable, Source

SUFFIX = ".gguf"

HUGE_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
# The types the metadata lmconvert reads must have (llama.cpp's gguf-py writers): a head count of 0 or
# "4", or a split.count of "abc", is refused where the file is read, not met as a ZeroDivisionError.
GENERAL_TYPES = schema.Object(
    required={"general.architecture": schema.String()},
    optional={"general.name": schema.String(), "split.count": schema.POSITIVE_INT,
              "tokenizer.ggml.model": schema.String(),
              **{key: schema.Nullable(schema.COUNT) for key in TOKEN_IDS.values()},
              **{key: schema.POSITIVE for key in LLAMA3_STATED},
              "lmconvert.ssm.chunk_size": schema.POSITIVE_INT,
              "lmconvert.attention.head_count_config": schema.POSITIVE_INT})
ARCH_TYPES: dict[str, schema.Spec] = {  # `{arch}.` keys
    **{key: schema.POSITIVE_INT for key in (
        "context_length", "embedding_length", "block_count", "attention.key_length", "attention.value_length",
        "rope.dimension_count", "vocab_size", "attention.sliding_window", "rope.scaling.original_context_length",
        "expert_feed_forward_length", "expert_shared_feed_forward_length",
        "attention.key_length_mla", "attention.value_length_mla", "shortconv.l_cache", "ssm.conv_kernel",
        "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count")},
    "ssm.dt_b_c_rms": schema.Boolean(),
    # 0 and 0: no experts (llama.cpp's loader: a dense model, Granite 4's granitehybrid without them)
    "expert_count": schema.COUNT, "expert_used_count": schema.COUNT,
    # one count, or one per layer (Laguna's query heads)
    "attention.head_count": schema.Either((schema.POSITIVE_INT, schema.Array(schema.POSITIVE_INT))),
    # one count, or one per layer (LFM2: 0 on a layer that does not attend)
    "attention.head_count_kv": schema.Either((schema.POSITIVE_INT, schema.Array(schema.COUNT))),
    # one width, or one per layer (Nemotron-H: 0 on a block without an MLP)
    "feed_forward_length": schema.Either((schema.POSITIVE_INT, schema.Array(schema.COUNT))),
    **{key: schema.POSITIVE for key in (
        "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base", "rope.freq_base_swa",
        "attn_logit_softcapping", "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
        "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow")},
    "attention.scale": schema.Number(minimum=0),  # 0: not stated
    "final_logit_softcapping": schema.Number(minimum=0),  # 0: none (gemma4: where its runtime's default is 30)
    "attention.temperature_scale": schema.Number(), "rope.scaling.yarn_log_multiplier": schema.Number(),
    "rope.scaling.type": schema.String(),
    # a period (0: every layer sliding), or one flag per layer (MiMo's converter writes them as int32 1 and 0)
    "attention.sliding_window_pattern": schema.Either((schema.COUNT, schema.Array(schema.Either(
        (schema.Boolean(), schema.Integer(minimum=0, maximum=1)))))),
    "attention.rope_pattern": schema.Array(schema.Boolean()),  # one flag per layer: whether it rotates
}
# llama.cpp's all-state-space architectures (mamba, mamba2: GgufArch.attends) state no heads and no FFN as 0
NO_ATTENTION_TYPES = {key: schema.COUNT for key in ("feed_forward_length", "attention.head_count")}


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def gguf_file_of(path: Path) -> Path | None:
    """The .gguf file a path means: the file itself, or the one .gguf in a directory without a
    config.json; None if the path is not a GGUF checkpoint."""
    if path.is_file():
        if path.suffix.lower() == SUFFIX:
            return path
        with open(path, "rb") as f:
            return path if f.read(4) == MAGIC else None
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(p for p in path.glob(f"*{SUFFIX}") if p.is_file())
        firsts = {split_parts(p)[0] for p in found if split_parts(p)}
        if len(firsts) == 1 and all(split_parts(p) for p in found):  # llama.cpp's split files of one model
            return firsts.pop()
        if len(found) > 1:
            raise InputError(f"{path}: holds {len(found)} .gguf files ({', '.join(p.name for p in found[:4])}); "
                             "point at one of them")
        return found[0] if found else None
    return None


SPLIT_NAME = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


def split_parts(path: Path) -> list[Path]:
    """Every part of the split set a file's name says it belongs to (llama.cpp's and gguf-py's
    `NAME-00001-of-00003.gguf`), in order; [] for a name that is not a split part's."""
    match = SPLIT_NAME.fullmatch(path.name)
    if match is None or int(match["count"]) < 1:
        return []
    count = int(match["count"])
    return [path.with_name(f"{match['stem']}-{no:05d}-of-{count:05d}{path.suffix}") for no in range(1, count + 1)]


def is_gguf(path: Path) -> bool:
    return gguf_file_of(path) is not None


DEQUANTIZE_BAND = 32 << 20  # float32 bytes of rows dequantized at a time, by each of up to 4 threads


def _dequantized(raw: Callable[[int, int], np.ndarray], rows: int, row_bytes: int, kind: Any,  # noqa: ANN401 - gguf's type enum
                 out: np.ndarray | None = None) -> np.ndarray:
    """`gguf.quants.dequantize`'s values, a band of rows at a time into one float32 array: GGML's
    blocks lie within a row, so each band's bytes are read (`raw(first row, rows)`) and dequantized
    on their own, and neither the raw bytes nor the float temporaries outgrow the bands (the reads,
    the C kernels and numpy release the GIL, so bands go in parallel). The types ggml_dequant.py
    knows (Q8_0, Q4_K, Q6_K, ...) go through it, bit for bit gguf's values many times faster; the
    others through gguf's own numpy code. `out`: the float32 (rows, values) array to fill, else a
    new one."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[kind]
    if out is None:
        out = np.empty((rows, row_bytes // size * block), dtype=np.float32)
    band = max(1, DEQUANTIZE_BAND // max(1, out.shape[1] * 4))

    def fill(start: int) -> None:
        data = raw(start, min(band, rows - start))
        if kind.name in ggml_dequant.LAYOUT:
            ggml_dequant.dequantize_into(np.ascontiguousarray(data), kind.name, out[start:start + data.shape[0]])
        else:
            out[start:start + band] = gguf.quants.dequantize(data, kind)

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        list(pool.map(fill, range(0, rows, band)))
    return out


class GgufFile:
    """The parsed file: metadata as Python values and the tensor table, checked (gguf_header.py);
    tensors are read with os.pread, not through a memory map, so a file truncated while being
    read is a short read, named, not a SIGBUS that kills the process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        header = read_header(path, counted=HUGE_ARRAYS)
        self.meta: dict[str, Any] = header.meta
        self.counts: dict[str, int] = header.counts
        self.tensors: dict[str, TensorInfo] = header.tensors
        self._order = header.order
        self._fd: int | None = None
        self._fds: list[int] = []
        self._part: dict[str, int] = {}  # tensor -> index of the part holding it (split sets)
        if self.meta.get("split.no", 0) != 0:  # a later part: no metadata but its split keys
            self._split_parts()
        if "general.architecture" not in self.meta:
            raise InputError(f"{path}: has no general.architecture metadata; not a llama.cpp model file")
        schema.validate(self.meta, GENERAL_TYPES, f"{path}: metadata", "the file is damaged or not llama.cpp's")
        self.parts = self._split_parts() if self.meta.get("split.count", 1) > 1 else [path]
        try:
            self._fds = [os.open(part, os.O_RDONLY) for part in self.parts]
        except OSError:
            self.close()
            raise
        self._fd = self._fds[0]

    def _split_parts(self) -> list[Path]:
        """llama.cpp's split format: the first part holds the metadata, every part some tensors and
        its `split.*` keys; the parts lie side by side, named `NAME-0000K-of-0000N.gguf`, and are
        read as one file, as llama.cpp loads them."""
        count, no = self.meta.get("split.count"), self.meta.get("split.no", 0)
        parts = split_parts(self.path)
        if not isinstance(count, int) or not isinstance(no, int):
            raise InputError(f"{self.path}: split.count {count!r} and split.no {no!r} are not counts; the file is "
                             "damaged or not llama.cpp's")
        if no != 0 or len(parts) != count or parts[0] != self.path:
            first = parts[0].name if parts else f"the part numbered 00001-of-{count:05d}"
            raise InputError(f"{self.path}: is part {no + 1} of a {count}-way split GGUF; point at its first part "
                             f"({first}), with the others beside it")
        missing = [p.name for p in parts if not p.is_file()]
        if missing:
            raise InputError(f"{self.path}: is the first part of a {count}-way split GGUF, but {', '.join(missing[:3])}"
                             f"{' ...' if len(missing) > 3 else ''} is not beside it; fetch every part")
        self._part = dict.fromkeys(self.tensors, 0)
        for i, part in enumerate(parts[1:], start=1):
            header = read_header(part, counted=HUGE_ARRAYS)
            if header.meta.get("split.no") != i or header.meta.get("split.count") != count:
                raise InputError(f"{part}: its split.no/split.count metadata ({header.meta.get('split.no')!r}, "
                                 f"{header.meta.get('split.count')!r}) is not part {i + 1} of {count}; the parts are "
                                 "of different files")
            twice = sorted(set(header.tensors) & set(self.tensors))
            if twice:
                raise InputError(f"{part}: holds tensor {twice[0]!r}, which an earlier part holds too; the parts "
                                 "are of different files")
            self.tensors.update(header.tensors)
            self._part.update(dict.fromkeys(header.tensors, i))
        stated = self.meta.get("split.tensors.count")
        if stated is not None and stated != len(self.tensors):
            raise InputError(f"{self.path}: the split set holds {len(self.tensors)} tensors, not the {stated} its "
                             "split.tensors.count states; a part is damaged or of another file")
        return parts

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in torch order (ggml lists dimensions fastest first)."""
        return self.tensors[name].shape

    def type_name(self, name: str) -> str:
        return self.tensors[name].kind.name

    def _raw(self, t: TensorInfo, start: int, length: int) -> np.ndarray:
        """`length` bytes of the tensor from byte `start`, read whole or refused by name."""
        out = np.empty(length, dtype=np.uint8)
        self._read_into(t, start, memoryview(out))
        return out

    def _read_into(self, t: TensorInfo, start: int, view: memoryview) -> None:
        """The tensor's bytes from byte `start` into `view`, whole or refused by name."""
        if self._fd is None:
            raise InputError(f"{self.path}: read after it was closed")  # pragma: no cover - a bug
        part = self._part.get(t.name, 0)
        fd = self._fds[part]

        def short() -> InputError:
            return InputError(f"{self.parts[part]}: tensor {t.name!r} ends at byte {t.offset + t.n_bytes}, past the "
                              f"end of the file ({os.fstat(fd).st_size} bytes now); it was truncated while being "
                              "read, read it again when it is complete")
        pread_into(fd, view, t.offset + start, short)

    def banded(self, name: str, dtype: torch.dtype) -> Banded | None:
        """The tensor as `read` gives it, cast to `dtype`, as bands of rows read (and dequantized) on
        demand, each band the bits of those rows (GGML's blocks lie within a row), so an export that
        encodes or casts it band by band never holds it whole; None where `read` gives another dtype
        than `dtype` (a cast of its own) or the bytes are not in this machine's order."""
        t = self.tensors[name]
        shape, kind = self.shape(name), t.kind.name
        stored = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(kind)
        if stored is not None:
            if stored != dtype or self._order != "<" or sys.byteorder != "little":
                return None
            return stored_rows(shape, stored, lambda offset, view: self._read_into(t, offset, view))
        if dtype != torch.float32 or not t.n_bytes:
            return None
        rows = math.prod(t.dims[1:])
        row_bytes = t.n_bytes // rows

        def fill(start: int, stop: int, into: torch.Tensor) -> None:
            raw = lambda first, n: self._raw(t, (start + first) * row_bytes, n * row_bytes).reshape(n, row_bytes)  # noqa: E731
            _dequantized(raw, stop - start, row_bytes, t.kind, into.numpy())
        return Banded(rows, shape[-1], torch.float32, fill, shape=shape)

    def read(self, name: str) -> torch.Tensor:
        """The tensor as stored, dequantized: float32 for quantized types, else the stored float type."""
        import gguf

        t = self.tensors[name]
        kind, shape = t.kind, self.shape(name)
        Q = gguf.GGMLQuantizationType
        floats = {Q.F32: "f4", Q.F16: "f2", Q.BF16: "i2"}
        try:
            if kind in floats:
                code = np.dtype(floats[kind])
                data = self._raw(t, 0, t.n_bytes).view(code.newbyteorder(self._order)).astype(code, copy=False)
                tensor = torch.from_numpy(data)
                return (tensor.view(torch.bfloat16) if kind == Q.BF16 else tensor).reshape(shape)
            rows = math.prod(t.dims[1:])
            if t.n_bytes == 0:
                return torch.empty(shape, dtype=torch.float32)
            row_bytes = t.n_bytes // rows
            out = _dequantized(lambda first, n: self._raw(t, first * row_bytes, n * row_bytes).reshape(n, row_bytes),
                               rows, row_bytes, kind)
            return torch.from_numpy(out).reshape(shape)
        except InputError:
            raise
        except (ValueError, RuntimeError, OSError) as exc:
            raise InputError(f"{self.path}: tensor {name!r} ({kind.name}) cannot be read ({_one_line(exc)}); "
                             "the file may be truncated") from None

    def check_types(self) -> None:
        """Every tensor in a type gguf can dequantize; checked once per type, before any work."""
        import gguf

        Q = gguf.GGMLQuantizationType
        for kind in {t.kind for t in self.tensors.values()} - {Q.F32, Q.F16, Q.BF16}:
            block, size = gguf.GGML_QUANT_SIZES[kind]
            try:
                gguf.quants.dequantize(np.zeros(size, dtype=np.uint8), kind)
            except NotImplementedError:
                names = [n for n, t in self.tensors.items() if t.kind == kind]
                raise InputError(f"{self.path}: tensor {names[0]!r} is quantized as {kind.name}, which gguf "
                                 f"{_gguf_version()} cannot dequantize; use a file quantized to another type "
                                 "(F16, Q8_0, Q4_K, Q6_K, ...)") from None

    def dtype(self) -> torch.dtype:
        """transformers' rule: float32 once anything is quantized, else the file's half type, if any."""
        kinds = {self.type_name(n) for n in self.tensors}
        if not kinds <= {"F32", "F16", "BF16"}:
            return torch.float32
        return torch.bfloat16 if "BF16" in kinds else torch.float16 if "F16" in kinds else torch.float32

    def close(self) -> None:
        self.tensors = {}
        for fd in self._fds:
            os.close(fd)
        self._fds, self._fd = [], None


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


# ---------------------------------------------------------------------------------------------
# tensors


@dataclass(frozen=True)
class TensorPlan:
    gguf_name: str | tuple[str, ...]  # several: the parts of a gathered tensor (DeepSeek's k_b and v_b)
    shape: tuple[int, ...]  # the HF shape, after the transform
    transform: Transform  # the GGUF table's, bound to this file's sizes
    # the same tensor stored a second way (kv_b whole beside its parts): read too, and bit for bit the same
    check: TensorPlan | None = None


class GgufTensors:
    """A GGUF file's tensors under HF names, each dequantized only when asked for."""

    def __init__(self, file: GgufFile, plans: dict[str, TensorPlan], dtype: torch.dtype) -> None:
        self.file, self.plans, self._dtype = file, plans, dtype
        self._last: tuple[str | None, Any] = (None, None)  # a stacked experts tensor, dequantized once
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return list(self.plans)

    def dtype(self, name: str) -> torch.dtype:
        return self._dtype

    def shape(self, name: str) -> tuple[int, ...]:
        return self.plans[name].shape

    def where(self, name: str) -> Path:
        return self.file.path

    def parts(self, name: str) -> tuple[str, ...]:
        """The GGUF tensor(s) it is read from: one expert's weights come from the stacked tensor
        of its layer (`blk.N.ffn_gate_exps.weight`), and several HF tensors from one GGUF tensor."""
        plan = self.plans[name]
        names = [plan.gguf_name, *([] if plan.check is None else [plan.check.gguf_name])]
        return tuple(dict.fromkeys(part for one in names for part in (one if isinstance(one, tuple) else (one,))))

    def stored_type(self, name: str) -> str:
        """The ggml type the tensor is stored as (Q8_0, F16, ...), or those of its parts joined by +."""
        return "+".join(dict.fromkeys(self.file.type_name(part) for part in self.parts(name)))

    def get(self, name: str) -> torch.Tensor:
        """Dequantized, transformed (an offset computes in float32, as transformers does), then
        cast to the file's one dtype."""
        plan = self.plans[name]
        tensor = self._tensor(plan)
        if plan.check is not None and not same_bits(tensor, self._tensor(plan.check)):
            raise InputError(f"{self.file.path}: holds {name} twice, as {_stored(plan)} and as {_stored(plan.check)}, "
                             "and they differ; the file is not one model (llama.cpp's loader reads one of them)")
        return tensor.to(self._dtype).contiguous()

    def banded(self, name: str) -> Banded | None:
        """`get(name)` as bands of rows read on demand (GgufFile.banded), for a tensor that is one
        GGUF tensor unchanged, in the file's one dtype; else None."""
        plan = self.plans[name]
        if not isinstance(plan.gguf_name, str) or plan.check is not None or plan.transform.forward is not \
                IDENTITY.forward:
            return None
        return self.file.banded(plan.gguf_name, self._dtype)

    def _tensor(self, plan: TensorPlan) -> torch.Tensor:
        if isinstance(plan.gguf_name, tuple):  # a gathered tensor's parts
            return plan.transform.forward([self._read(part) for part in plan.gguf_name])
        return plan.transform.forward(self._read(plan.gguf_name))

    def _read(self, gguf_name: str) -> torch.Tensor:
        """The dequantized GGUF tensor; the last one is kept, because every expert of a stacked
        tensor is read from it in turn."""
        with self._lock:
            if self._last[0] != gguf_name:
                self._last = (None, None)
                self._last = (gguf_name, self.file.read(gguf_name))
            return self._last[1]

    def close(self) -> None:
        self.file.close()


def tensor_plans(file: GgufFile, config: dict[str, Any], entry: GgufArch) -> dict[str, TensorPlan]:
    """{HF name: how to read it}: the GGUF table gives each tensor's canonical name and transform,
    the family's table the HF name it has for this config."""
    try:
        family = family_for(config["model_type"])
        arch = family.arch_config(config)
        # canonical name (a tuple for a fused tensor's pieces) -> the HF name and its HF-table transform
        hf_plan = family.tensors_for(arch).plan_export(parameter_shapes(arch), family_tensor_sizes(arch))
        hf_of = {canonical: (hf, step) for hf, (canonical, step) in hf_plan.items()}
    except MappingError as exc:
        raise InputError(f"{file.path}: {str(exc).removeprefix('config.json: ')}") from None
    # a canonical tensor the HF layout stores as several parts (Kimi Linear's q_conv1d, k_conv1d, v_conv1d): each
    # part's HF name and the step that cuts it out
    hf_parts: dict[str, list[tuple[str, Transform]]] = {}
    for hf, (canonical, step) in hf_plan.items():
        if step.gathers and isinstance(canonical, str):
            hf_parts.setdefault(canonical, []).append((hf, step))
    table, sizes = entry.tensors_for(config), tensor_sizes(config, entry.renamed)
    plans: dict[str, TensorPlan] = {}
    gathered: dict[str, TensorPlan] = {}
    # an HF tensor joining canonical tensors the file holds apart (GraniteMoE's input_linear, every expert's gate
    # and up; its shared_mlp.input_linear): each canonical name -> that HF tensor's; where each is, as found
    in_stack = {c: key for key in hf_of if isinstance(key, tuple) for c in key}
    stacked: dict[tuple[str, ...], dict[str, tuple[str, Transform]]] = {}
    for name in file.tensors:
        if table.drops(name):  # rope_freqs: read into the config (llama3 RoPE scaling)
            continue
        parts = table.gathered(name)
        if parts is not None:  # one part of a tensor stored as several: planned from all of them
            gathered.update(gathered_plan(file, parts, hf_of, sizes, hf_parts))
            continue
        try:
            pieces = table.to_canonical_names(name)
        except MappingError:
            pieces = []
        canonical = tuple(c for c, _ in pieces) if len(pieces) > 1 else pieces[0][0] if pieces else None
        if pieces and all("{}" in c for c, _ in pieces):  # a mixture's stacked experts: one plan per expert (and
            # per part, where each expert's gate and up are stacked as one: granite_swa's ffn_gate_up_exps)
            plans.update(expert_plans(file, name, table, hf_of, sizes, in_stack, stacked))
            continue
        shape = file.shape(name)
        if isinstance(canonical, str) and canonical in in_stack:
            steps = [step.bind({**sizes, "rows": shape[0]}) for _, step in pieces]
            stacked.setdefault(in_stack[canonical], {})[canonical] = (name, _to_hf(steps, IDENTITY))
            continue
        if canonical not in hf_of:
            raise InputError(f"{file.path}: tensor {name!r} has no counterpart in {config['model_type']} as this "
                             "metadata describes it; the file holds something lmconvert does not convert")
        for hf, hf_step in hf_parts.get(canonical, [hf_of[canonical]]) if isinstance(canonical, str) \
                else [hf_of[canonical]]:
            transform = _to_hf([step.bind({**sizes, "rows": shape[0]}) for _, step in pieces], hf_step)
            plans[hf] = TensorPlan(name, out_shape(transform.forward, shape), transform)
    for key, found in stacked.items():
        plans.update(joined_plan(file, key, found, hf_of))
    for hf, plan in gathered.items():  # kv_b whole beside its parts: read whole, checked against them
        plans[hf] = replace(plans[hf], check=plan) if hf in plans else plan
    return plans


def gathered_plan(file: GgufFile, parts: tuple[str, list[tuple[str, Any]]], hf_of: dict[Any, tuple[str, Transform]],
                  sizes: dict[str, int], hf_parts: dict[str, list[tuple[str, Transform]]]) -> dict[str, TensorPlan]:
    """{HF name: plan} of a canonical tensor stored as several parts (DeepSeek's kv_b as llama.cpp's
    converter stores it: `attn_k_b`, `attn_v_b`), every one of which the file must hold; one plan per HF
    part where the HF layout stores it in parts too (`hf_parts`: Kimi Linear's convolutions)."""
    canonical, stored = parts
    names = tuple(name for name, _ in stored)
    missing = [name for name in names if name not in file.tensors]
    if missing or canonical not in hf_of:
        why = f"lacks {', '.join(missing)}" if missing else "describes a model without it"
        raise InputError(f"{file.path}: tensor {names[0]!r} is one part of {canonical}, stored as {', '.join(names)}, "
                         f"and the file {why}; the file holds something lmconvert does not convert")
    plans = {}
    for hf, hf_step in hf_parts.get(canonical, [hf_of[canonical]]):
        transform = _to_hf([stored[0][1].bind(sizes)], hf_step)
        try:
            shape = out_shape(transform.forward, [file.shape(name) for name in names])
        except MappingError as exc:
            raise InputError(f"{file.path}: {', '.join(names)}: {exc}") from None
        plans[hf] = TensorPlan(names, shape, transform)
    return plans


def _stored(plan: TensorPlan) -> str:
    return " and ".join(plan.gguf_name) if isinstance(plan.gguf_name, tuple) else plan.gguf_name


def _to_hf(steps: list[Transform], hf_step: Transform) -> Transform:
    """GGUF -> canonical (one step, or one per piece of a fused tensor), then canonical -> the HF
    layout the family's table stores (GPT-2's Conv1D is transposed; for the others, as is)."""
    if len(steps) == 1 and hf_step is IDENTITY:
        return steps[0]

    def forward(t: torch.Tensor) -> torch.Tensor:
        canonical = [s.forward(t) for s in steps]
        return hf_step.inverse(canonical if len(steps) > 1 else canonical[0])

    return Transform(" then ".join(s.name for s in (*steps, hf_step)), forward)


def expert_plans(file: GgufFile, name: str, table: TensorTable, hf_of: dict[Any, tuple[str, Transform]],
                 sizes: dict[str, int], in_stack: dict[str, tuple[str, ...]],
                 stacked: dict[tuple[str, ...], dict[str, tuple[str, Transform]]]) -> dict[str, TensorPlan]:
    """{HF name: plan} for each expert a stacked GGUF tensor holds, as many as its first dimension;
    an expert the HF layout stacks too is noted in `stacked` (its HF tensor is planned once every
    GGUF stack is seen)."""
    shape = file.shape(name)
    plans = {}
    for (pattern, step), e in itertools.product(table.expanding(name), range(shape[0])):
        canonical = pattern.replace("{}", str(e))
        if canonical in in_stack:
            stacked.setdefault(in_stack[canonical], {})[canonical] = (name, step.bind({**sizes, "index": e}))
            continue
        if canonical not in hf_of:
            raise InputError(f"{file.path}: tensor {name!r} holds {shape[0]} experts, but the metadata describes "
                             f"fewer; the file holds something lmconvert does not convert")
        hf, hf_step = hf_of[canonical]
        transform = _to_hf([step.bind({**sizes, "index": e})], hf_step)
        plans[hf] = TensorPlan(name, out_shape(transform.forward, shape), transform)
    return plans


def joined_plan(file: GgufFile, key: tuple[str, ...], found: dict[str, tuple[str, Transform]],
                hf_of: dict[Any, tuple[str, Transform]]) -> dict[str, TensorPlan]:
    """{HF name: plan} of an HF tensor that joins canonical tensors the file holds apart: every
    expert's gate and up (GraniteMoE's input_linear) out of the GGUF stacks `ffn_gate_exps` and
    `ffn_up_exps`, or a gate and an up (its shared_mlp.input_linear) from `ffn_gate_shexp` and
    `ffn_up_shexp`: each canonical matrix from where the file holds it, then the HF table's join."""
    hf, hf_step = hf_of[key]
    missing = [c for c in key if c not in found]
    if missing:
        raise InputError(f"{file.path}: {hf} joins {len(key)} matrices, but the file holds no "
                         f"{', '.join(missing[:3])}; the file holds something lmconvert does not convert")
    names = tuple(dict.fromkeys(found[c][0] for c in key))

    def forward(tensors: list[torch.Tensor]) -> torch.Tensor:
        by_name = dict(zip(names, tensors, strict=True))
        return hf_step.inverse([found[c][1].forward(by_name[found[c][0]]) for c in key])

    transform = Transform(f"{len(key)} matrices joined from {', '.join(names)}", forward)
    return {hf: TensorPlan(names, out_shape(forward, [file.shape(n) for n in names]), transform)}


# ---------------------------------------------------------------------------------------------
# tokenizer and generation files


NO_VOCABULARY = ("none", "no_vocab")  # llama.cpp's names for a model file without a tokenizer


def has_vocabulary(file: GgufFile) -> bool:
    return file.meta.get("tokenizer.ggml.model", NO_VOCABULARY[0]) not in NO_VOCABULARY


def _without_invented(tokenizer: Any, n_tokens: int) -> Any:  # noqa: ANN401 - transformers' tokenizer
    """transformers' byte-level GGUF builder makes a GPT2Tokenizer, whose default special tokens add
    `<|endoftext|>` where the file lists no such token (Llama 3's vocabulary has none): an id past
    the file's tokens, and past the model's embedding rows, which `generate` and GGUF export then
    refuse. Only the file's tokens are kept."""
    if n_tokens <= 0 or all(i < n_tokens for i in tokenizer.added_tokens_decoder):
        return tokenizer
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["id"] < n_tokens]
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(state))  # noqa: SLF001 - the backend it wraps
    return tokenizer


def build_tokenizer(path: Path, meta: dict[str, Any], n_tokens: int) -> tuple[Any, str]:
    """The tokenizer the file describes (`n_tokens` of them: the count of `tokenizer.ggml.tokens`) and
    how it was built: from the file's own metadata where its layout is one gguf_vocab.py rebuilds as
    llama.cpp reads it (SentencePiece, and BPE over SentencePiece-shaped pieces: Gemma 3's current
    layout), else by transformers' GGUF builder."""
    from . import gguf_vocab

    kind = meta.get("tokenizer.ggml.model")
    if gguf_vocab.kind_of(meta) is not None:
        try:
            return gguf_vocab.build(gguf_vocab.full_metadata(path)), f"built from the GGUF metadata ({kind})"
        except gguf_vocab.Unbuildable as exc:
            why = str(exc)
    else:
        why = ""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        return (_without_invented(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), n_tokens),
                f"built by transformers from the GGUF metadata ({kind})")
    except Exception as exc:  # noqa: BLE001 - any failure of a library's builder is the same: no tokenizer
        said = str(exc).strip().replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")[:200]
        theirs = f"transformers' GGUF builder: {type(exc).__name__} {said}".rstrip()
        raise gguf_vocab.Unbuildable("; ".join(filter(None, (why, theirs)))) from None


def sidecar_writer(file: GgufFile, info: dict[str, Any]) -> Callable[[Path], list[str]]:
    """Writes the tokenizer built from the GGUF metadata and a generation_config.json with the
    file's token ids; notes in `info` what happened. A tokenizer that cannot be built leaves the
    weights converted without one, said in one warning line: the weights are the conversion's
    product and are right, and the model's own tokenizer files can be put beside them."""
    path = file.path
    has_tokenizer = has_vocabulary(file)
    ids = {hf: int(file.meta[g]) for hf, g in TOKEN_IDS.items() if file.meta.get(g) is not None}

    def write(directory: Path) -> list[str]:
        from .gguf_vocab import Unbuildable

        written: list[str] = []
        if has_tokenizer:
            try:
                tokenizer, how = build_tokenizer(path, file.meta, file.counts.get("tokenizer.ggml.tokens", 0))
            except Unbuildable as exc:
                info["tokenizer"] = f"not converted: {exc}"
                print(f"lmconvert: warning: {path}: its tokenizer cannot be rebuilt ({exc}); the output has no "
                      "tokenizer: copy the original model's tokenizer files into it", file=sys.stderr)
            else:
                written += [Path(p).name for p in tokenizer.save_pretrained(str(directory))]
                info["tokenizer"] = how
        else:
            info["tokenizer"] = "none in the file"
        if ids:
            (directory / "generation_config.json").write_text(json.dumps(ids, indent=2, sort_keys=True) + "\n")
            written.append("generation_config.json")
        return sorted(set(written) & {p.name for p in directory.iterdir()})

    return write


def check_metadata(file: GgufFile) -> None:
    """The architecture's keys have the types llama.cpp writes, and the layers it claims fit the
    tensors the file holds, before anything per layer (layer types, the tensor table) is built."""
    arch = str(file.meta["general.architecture"])
    entry = arch_entry(arch)  # an architecture lmconvert does not read is named before its keys are checked
    specs = ARCH_TYPES if entry.attends else {**ARCH_TYPES, **NO_ATTENTION_TYPES}
    types = schema.Object(optional={f"{arch}.{k}": spec for k, spec in specs.items()})
    schema.validate(file.meta, types, f"{file.path}: metadata", "the file is damaged or not llama.cpp's")
    check_layer_claim(file.meta.get(f"{arch}.block_count"), layers_held(file.tensors), file.path, "its metadata",
                      f"{arch}.block_count")


FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})


def unread_reference(file: GgufFile, entry: GgufArch, types: Counter[str]) -> Loadable:
    """For an architecture transformers' GGUF loader does not read: a float file's recorded source;
    a quantized file's own weights, dequantized (its float source is another model by the
    quantization error, which fp32's bar would count against us); so too a file whose multipliers
    llama.cpp's layout folds into the weights (Falcon-H1's muP, GgufArch.folded), whose source is the
    same model only to the fold's rounding and whose inner points (in_proj's output, before the muP
    vector) are not the source's: transformers' model of the file's config (unit multipliers) holds them."""
    if set(types) <= FLOAT_TYPES and not entry.folded:
        return recorded_reference(file, entry)
    return Loadable(None, origin=file.path, dequantized=True)


def recorded_reference(file: GgufFile, entry: GgufArch) -> Loadable:
    """For an architecture transformers' GGUF loader does not read: the source lmconvert's export
    recorded in the file (`lmconvert.source`), as transformers loads it, if it is still there."""
    recorded = file.meta.get(SOURCE_KEY)
    layout = " in this file's layout" if entry.transformers_reads else ""  # Falcon-40B's, say
    why = f"{file.path}: transformers' GGUF loader does not read {entry.model_type}{layout}"
    if not isinstance(recorded, str) or not recorded:
        return Loadable(None, refusal=f"{why}, and the file records no source; pass --reference SRC")
    if recorded.startswith(HUB_SCHEME):
        return hub_reference(recorded.removeprefix(HUB_SCHEME), why)
    source = Path(recorded)
    if source.is_dir():
        return Loadable(source)
    if source.is_file() and source.suffix == ".gguf":
        return Loadable(source.parent, {"gguf_file": source.name}, origin=source)
    return Loadable(None, refusal=f"{why}, and the source it records, {recorded!r}, is not available; "
                                  "pass --reference SRC")


def hub_reference(repo_at_sha: str, why: str) -> Loadable:
    """A recorded Hub source, `REPO@SHA`, from the HF cache only: verify downloads nothing."""
    from huggingface_hub import try_to_load_from_cache

    repo, _, sha = repo_at_sha.rpartition("@")
    try:
        config = try_to_load_from_cache(repo, "config.json", revision=sha) if repo and sha else None
    except ValueError:  # not a repo id
        config = None
    if not isinstance(config, str):
        return Loadable(None, refusal=f"{why}, and the source it records, {repo_at_sha!r}, is not in the HF "
                                      f"cache; run `lmconvert pull {repo or repo_at_sha} --revision {sha or '?'}` "
                                      "or pass --reference SRC")
    return Loadable(Path(config).parent)


def open_gguf(path: Path) -> Source:
    target = gguf_file_of(path)
    if target is None:
        raise InputError(f"{path}: not a GGUF file or a directory holding one")
    within(path, target.name)  # the .gguf in a directory SRC; a .gguf file named directly is the user's choice
    file = GgufFile(target)
    try:
        file.check_types()
        try:
            check_metadata(file)
            config, entry = hf_config(file)
        except MappingError as exc:
            raise InputError(f"{file.path}: {exc}") from None
        plans = tensor_plans(file, config, entry)
        types = Counter(file.type_name(n) for n in file.tensors)
        info: dict[str, Any] = {
            "gguf_file": target.name, "gguf_architecture": file.meta["general.architecture"],
            "gguf_tensor_types": dict(sorted(types.items())),
        }
        if file.meta.get("general.name"):
            info["gguf_name"] = file.meta["general.name"]
        tensors = GgufTensors(file, plans, file.dtype())
        loadable = Loadable(target.parent, {"gguf_file": target.name}, origin=target)  # transformers dequantizes it
        tokenizer = loadable if has_vocabulary(file) else None  # the metadata: all in the first part
        if len(file.parts) > 1:  # transformers' GGUF loader reads one file: the parts' own weights, dequantized
            info["gguf_parts"] = len(file.parts)
            reference = Loadable(None, origin=target, dequantized=True)
        else:
            reference = loadable if entry.read_by_transformers(config) else unread_reference(file, entry, types)
        return Source(target, "gguf", config, tensors, info=info, sidecars=sidecar_writer(file, info),
                      reference=reference, tokenizer=tokenizer)
    except BaseException:
        file.close()
        raise
