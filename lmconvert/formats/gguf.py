"""GGUF in: llama.cpp's single-file format, read with the `gguf` package and presented in
transformers' layout (an HF config dict and tensors under HF names), so the family mappings do
the rest.

llama.cpp's converter (`convert_hf_to_gguf.py`) changes a checkpoint on the way in; each change is
undone here, the way transformers' own GGUF loader (`modeling_gguf_pytorch_utils.py`) undoes it,
so that an import gives the tensors transformers gives:

- names: `blk.{i}.attn_q.weight` and so on. gguf's own `TensorNameMap` (the table llama.cpp
  converts with) maps every HF name the family expects to its GGUF name, and that map is read
  backwards, as transformers does;
- the q and k rows of `llama` files (Mistral included) are permuted for llama.cpp's interleaved
  RoPE (`LlamaModel.permute`); the inverse permutation is applied to weights and biases;
- Gemma 2 and 3 norm weights are stored as `w + 1`; 1 is subtracted in float32;
- llama.cpp writes no config: the metadata (`{arch}.embedding_length`, ...) is translated by the
  per-architecture tables below; what llama.cpp's runtime hard-codes instead of writing (Gemma's
  sliding pattern and score scale, Gemma 2's soft-caps) comes from the same tables;
- Llama 3's RoPE scaling is not in the metadata but in a `rope_freqs` tensor of per-frequency
  factors; the llama3 parameters that produce exactly those factors are recovered from it;
- embedding / output rows past the vocabulary (`{arch}.vocab_size`, else the token list) are
  padding and are trimmed.

Quantized tensors are dequantized with `gguf.quants.dequantize`, the function transformers uses,
into float32; F32, F16 and BF16 tensors pass through. One dtype per file, transformers' rule: the
half type of a float file (its F32 tensors are the norms), float32 once anything is quantized.
Tensors are read lazily from the reader's memory map, one at a time.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import schema
from .claims import check_layer_claim
from .errors import InputError
from .source import Loadable, Source

SUFFIX = ".gguf"
MAGIC = b"GGUF"

# ---------------------------------------------------------------------------------------------
# metadata -> HF config.json, as data

# `{arch}.` metadata keys every decoder here states, and the HF config keys they become
SHARED_KEYS: dict[str, str] = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
}
REQUIRED_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
                 "attention.head_count", "attention.layer_norm_rms_epsilon")
# values llama.cpp's runtime assumes when the file leaves a key out
SHARED_DEFAULTS: dict[str, Any] = {"rope_theta": 10000.0}
TOKEN_IDS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
             "pad_token_id": "tokenizer.ggml.padding_token_id"}
# `{arch}.rope.scaling.type` -> HF rope_type, and the scaling keys -> HF rope parameter keys
ROPE_TYPES: dict[str, str | None] = {"none": None, "linear": "linear", "yarn": "yarn"}
ROPE_KEYS = {"rope.scaling.factor": "factor",
             "rope.scaling.original_context_length": "original_max_position_embeddings",
             "rope.scaling.attn_factor": "attention_factor", "rope.scaling.yarn_beta_fast": "beta_fast",
             "rope.scaling.yarn_beta_slow": "beta_slow"}
ROPE_IGNORED = {"rope.scaling.type", "rope.scaling.finetuned"}  # read elsewhere, or informational only
# llama.cpp's converter writes Llama 3 scaling as `rope_freqs` factors computed with these (it reads
# `original_max_position_embeddings` from the top level of config.json, where Llama 3 has none: 8192)
LLAMA3_CANDIDATES = ({"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},)


@dataclass(frozen=True)
class GgufArch:
    """How one llama.cpp architecture maps to a transformers model_type."""

    model_type: str
    keys: Mapping[str, str] = field(default_factory=dict)  # `{arch}.` keys beyond SHARED_KEYS -> HF keys
    defaults: Mapping[str, Any] = field(default_factory=dict)  # HF keys the file does not state
    bias_flags: Mapping[str, str] = field(default_factory=dict)  # HF bool key -> GGUF tensor that sets it
    permute_qk: bool = False  # q/k rows interleaved for llama.cpp's RoPE (LlamaModel.permute)
    norm_offset: float = 0.0  # norm weights stored as w + offset
    swa_pattern: int | None = None  # llama.cpp's hard-coded sliding pattern: every n-th layer is full
    big_layers: int | None = None  # Gemma: the layer count llama.cpp treats as 27B (score scale hidden/heads)


ATTENTION_BIAS = {"attention_bias": "blk.0.attn_q.bias"}
GEMMA_KEYS = {"attention.sliding_window": "sliding_window", "final_logit_softcapping": "final_logit_softcapping"}
ARCHS: dict[str, GgufArch] = {
    "llama": GgufArch("llama", defaults={"hidden_act": "silu"},
                      bias_flags={**ATTENTION_BIAS, "mlp_bias": "blk.0.ffn_up.bias"}, permute_qk=True),
    "qwen2": GgufArch("qwen2", defaults={"hidden_act": "silu", "use_sliding_window": False}),
    "qwen3": GgufArch("qwen3", defaults={"hidden_act": "silu", "use_sliding_window": False}, bias_flags=ATTENTION_BIAS),
    "olmo2": GgufArch("olmo2", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS),
    "gemma2": GgufArch("gemma2", keys={**GEMMA_KEYS, "attn_logit_softcapping": "attn_logit_softcapping"},
                       defaults={"hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
                                 "final_logit_softcapping": 30.0},
                       bias_flags=ATTENTION_BIAS, norm_offset=1.0, swa_pattern=2, big_layers=46),
    "gemma3": GgufArch("gemma3_text", keys={**GEMMA_KEYS, "rope.freq_base_swa": "rope_local_base_freq"},
                       defaults={"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
                                 "rope_local_base_freq": 10000.0},
                       bias_flags=ATTENTION_BIAS, norm_offset=1.0, swa_pattern=6, big_layers=62),
}
# llama.cpp writes Mistral as `llama`; like transformers, tell it by its general.name
BY_NAME: tuple[tuple[str, str, GgufArch], ...] = (
    ("llama", "mistral", GgufArch("mistral", keys={"attention.sliding_window": "sliding_window"},
                                  defaults={"hidden_act": "silu", "sliding_window": None}, permute_qk=True)),
)
HUGE_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
# The types the metadata lmconvert reads must have (llama.cpp's gguf-py writers): a head count of 0 or
# "4", or a split.count of "abc", is refused where the file is read, not met as a ZeroDivisionError.
GENERAL_TYPES = schema.Object(
    required={"general.architecture": schema.String()},
    optional={"general.name": schema.String(), "split.count": schema.POSITIVE_INT,
              "tokenizer.ggml.model": schema.String(),
              **{key: schema.Nullable(schema.COUNT) for key in TOKEN_IDS.values()}})
ARCH_TYPES: dict[str, schema.Spec] = {  # `{arch}.` keys
    **{key: schema.POSITIVE_INT for key in (
        "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
        "vocab_size", "attention.sliding_window", "rope.scaling.original_context_length")},
    **{key: schema.POSITIVE for key in (
        "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.freq_base_swa", "attn_logit_softcapping",
        "final_logit_softcapping", "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
        "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow")},
    "attention.scale": schema.Number(minimum=0),  # 0: not stated
    "rope.scaling.type": schema.String(),
    # a period (0: every layer sliding), or one flag per layer
    "attention.sliding_window_pattern": schema.Either((schema.COUNT, schema.Array(schema.Boolean()))),
}


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
        if len(found) > 1:
            raise InputError(f"{path}: holds {len(found)} .gguf files ({', '.join(p.name for p in found[:4])}); "
                             "point at one of them")
        return found[0] if found else None
    return None


def is_gguf(path: Path) -> bool:
    return gguf_file_of(path) is not None


class GgufFile:
    """The parsed file: metadata as Python values and the tensor table over the memory map."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            head = f.read(4)
        if head != MAGIC:
            raise InputError(f"{path}: not a GGUF file (starts with {head!r}, not b'GGUF'); point at a .gguf "
                             "model file")
        import gguf

        try:
            self.reader = gguf.GGUFReader(path)
        except Exception as exc:  # noqa: BLE001 - the reader raises anything from struct to numpy on a bad file
            raise InputError(f"{path}: not a readable GGUF file ({_one_line(exc)}); it may be truncated or "
                             "corrupt, re-download it") from None
        self.meta: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        for key, entry in self.reader.fields.items():
            if key in HUGE_ARRAYS:
                self.counts[key] = len(entry.data)
            elif not key.startswith("GGUF."):
                try:
                    self.meta[key] = entry.contents()
                except (UnicodeDecodeError, ValueError) as exc:
                    raise InputError(f"{path}: metadata {key!r} cannot be read ({_one_line(exc)})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        if "general.architecture" not in self.meta:
            raise InputError(f"{path}: has no general.architecture metadata; not a llama.cpp model file")
        schema.validate(self.meta, GENERAL_TYPES, f"{path}: metadata", "the file is damaged or not llama.cpp's")
        if self.meta.get("split.count", 1) > 1:
            raise InputError(f"{path}: is one part of a {self.meta['split.count']}-way split GGUF; merge the parts "
                             "first (llama-gguf-split --merge)")

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in torch order (ggml lists dimensions fastest first)."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def read(self, name: str) -> torch.Tensor:
        """The tensor as stored, dequantized: float32 for quantized types, else the stored float type."""
        import gguf

        t = self.tensors[name]
        kind, shape = t.tensor_type, self.shape(name)
        Q = gguf.GGMLQuantizationType
        try:
            if kind == Q.F32:
                return torch.from_numpy(np.array(t.data, dtype=np.float32)).reshape(shape)
            if kind == Q.F16:
                return torch.from_numpy(np.array(t.data, dtype=np.float16)).reshape(shape)
            if kind == Q.BF16:
                raw = np.array(t.data, dtype=np.uint8).view(np.int16)
                return torch.from_numpy(raw).view(torch.bfloat16).reshape(shape)
            return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(t.data, kind))).reshape(shape)
        except (ValueError, RuntimeError, OSError) as exc:
            raise InputError(f"{self.path}: tensor {name!r} ({kind.name}) cannot be read ({_one_line(exc)}); "
                             "the file may be truncated") from None

    def check_types(self) -> None:
        """Every tensor in a type gguf can dequantize; checked once per type, before any work."""
        import gguf

        Q = gguf.GGMLQuantizationType
        for kind in {t.tensor_type for t in self.tensors.values()} - {Q.F32, Q.F16, Q.BF16}:
            block, size = gguf.GGML_QUANT_SIZES[kind]
            try:
                gguf.quants.dequantize(np.zeros(size, dtype=np.uint8), kind)
            except NotImplementedError:
                names = [n for n, t in self.tensors.items() if t.tensor_type == kind]
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
        self.reader = None  # type: ignore[assignment]  # drops the memory map with the last view


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def _arch_entry(file: GgufFile) -> tuple[str, GgufArch]:
    arch = str(file.meta["general.architecture"])
    if arch not in ARCHS:
        raise InputError(f"{file.path}: GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(sorted(ARCHS))}")
    name = str(file.meta.get("general.name") or "").lower()
    for base, word, variant in BY_NAME:
        if base == arch and word in name:
            return arch, variant
    return arch, ARCHS[arch]


def hf_config(file: GgufFile) -> tuple[dict[str, Any], GgufArch]:
    """The transformers config dict the metadata describes, and the architecture's table entry."""
    arch, entry = _arch_entry(file)

    def key(name: str) -> Any:
        return file.meta.get(f"{arch}.{name}")

    missing = [f"{arch}.{k}" for k in REQUIRED_KEYS if key(k) is None]
    if missing:
        raise InputError(f"{file.path}: metadata lacks {', '.join(missing)}; the file is incomplete")
    types = schema.Object(optional={f"{arch}.{k}": spec for k, spec in ARCH_TYPES.items()})
    schema.validate(file.meta, types, f"{file.path}: metadata", "the file is damaged or not llama.cpp's")
    # before anything per layer (layer types, the tensor-name map) is built for what it claims
    check_layer_claim(key("block_count"), file.tensors, file.path, "its metadata", f"{arch}.block_count")
    config: dict[str, Any] = {"model_type": entry.model_type, **SHARED_DEFAULTS, **entry.defaults}
    for gguf_key, hf_key in {**SHARED_KEYS, **entry.keys}.items():
        if key(gguf_key) is not None:
            config[hf_key] = key(gguf_key)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    config.setdefault("num_key_value_heads", heads)
    if "head_dim" not in config:
        if hidden % heads:
            raise InputError(f"{file.path}: {arch}.attention.key_length is missing and embedding_length "
                             f"{hidden} is not a multiple of head_count {heads}")
        config["head_dim"] = hidden // heads
    head_dim = config["head_dim"]
    for name, expected in (("attention.value_length", head_dim), ("rope.dimension_count", head_dim)):
        if key(name) is not None and key(name) != expected:
            raise InputError(f"{file.path}: {arch}.{name}={key(name)} differs from the head size {expected}; "
                             f"{entry.model_type} has no such variant")
    for hf_key, tensor in entry.bias_flags.items():
        config[hf_key] = tensor in file.tensors
    config["tie_word_embeddings"] = "output.weight" not in file.tensors
    config["vocab_size"] = _vocab_size(file, arch)
    config.update(_rope_scaling(file, arch, config))
    if entry.swa_pattern is not None:
        config["layer_types"] = _layer_types(file, arch, entry, config["num_hidden_layers"])
    if entry.big_layers is not None:
        config["query_pre_attn_scalar"] = _query_pre_attn_scalar(file, arch, entry, config)
    for hf_key, gguf_key in TOKEN_IDS.items():
        if file.meta.get(gguf_key) is not None:
            config[hf_key] = int(file.meta[gguf_key])
    return config, entry


def _vocab_size(file: GgufFile, arch: str) -> int:
    if "token_embd.weight" not in file.tensors:
        raise InputError(f"{file.path}: has no token_embd.weight tensor; not a complete decoder")
    rows = file.shape("token_embd.weight")[0]
    stated = file.meta.get(f"{arch}.vocab_size") or file.counts.get("tokenizer.ggml.tokens") or rows
    if stated > rows:
        raise InputError(f"{file.path}: the vocabulary has {stated} tokens but token_embd.weight only {rows} rows")
    return int(stated)


def _rope_scaling(file: GgufFile, arch: str, config: dict[str, Any]) -> dict[str, Any]:
    prefix = f"{arch}."
    kind = file.meta.get(f"{arch}.rope.scaling.type")
    legacy = file.meta.get(f"{arch}.rope.scale_linear")
    if kind is None and legacy is not None:
        kind, factor = "linear", legacy
    else:
        factor = file.meta.get(f"{arch}.rope.scaling.factor")
    if kind is not None and kind not in ROPE_TYPES:
        raise InputError(f"{file.path}: {arch}.rope.scaling.type={kind!r} is not supported; supported: "
                         f"{', '.join(ROPE_TYPES)}")
    rope_type = ROPE_TYPES.get(kind) if kind is not None else None
    if "rope_freqs.weight" in file.tensors:
        if rope_type is not None:
            raise InputError(f"{file.path}: states both {arch}.rope.scaling.type={kind!r} and a rope_freqs tensor")
        return {"rope_scaling": _llama3_from_factors(file, config)}
    if rope_type is None:
        return {}
    params: dict[str, Any] = {"rope_type": rope_type, "factor": float(factor) if factor is not None else None}
    for name, value in file.meta.items():
        short = name.removeprefix(prefix)
        if not name.startswith(prefix + "rope.scaling.") or short in ROPE_IGNORED or short == "rope.scaling.factor":
            continue
        if short not in ROPE_KEYS:
            raise InputError(f"{file.path}: {name}={value!r} is a RoPE scaling setting lmconvert does not support")
        params[ROPE_KEYS[short]] = value
    return {"rope_scaling": {k: v for k, v in params.items() if v is not None}}


def llama3_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                   original_max_position_embeddings: int) -> np.ndarray:
    """The `rope_freqs` llama.cpp's converter writes for llama3 scaling (LlamaModel.generate_extra_tensors)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    out = []
    for freq in freqs:  # 0-d float32 tensors, so the arithmetic below rounds as llama.cpp's does
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            ratio = original_max_position_embeddings / wavelen
            smooth = (ratio - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def _llama3_from_factors(file: GgufFile, config: dict[str, Any]) -> dict[str, Any]:
    factors = file.read("rope_freqs.weight").float().numpy()
    factor = float(factors.max())
    for candidate in LLAMA3_CANDIDATES:
        expected = llama3_factors(float(config["rope_theta"]), config["head_dim"], factor, **candidate)
        if expected.shape == factors.shape and np.allclose(expected, factors, rtol=1e-6, atol=0):
            return {"rope_type": "llama3", "factor": factor, **candidate}
    raise InputError(f"{file.path}: its rope_freqs tensor is not Llama 3 RoPE scaling with low/high frequency "
                     "factors 1/4 over 8192 positions; lmconvert cannot express these RoPE factors")


def _layer_types(file: GgufFile, arch: str, entry: GgufArch, n_layers: int) -> list[str]:
    """Sliding or full per layer: from `attention.sliding_window_pattern` (a period, or one flag per
    layer), else llama.cpp's hard-coded period, in llama.cpp's rule (set_swa_pattern)."""
    pattern = file.meta.get(f"{arch}.attention.sliding_window_pattern", entry.swa_pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise InputError(f"{file.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} flags for "
                             f"{n_layers} layers")
        sliding = [bool(flag) for flag in pattern]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def _query_pre_attn_scalar(file: GgufFile, arch: str, entry: GgufArch, config: dict[str, Any]) -> float | int:
    """llama.cpp states no score scale for Gemma: it scales by head_dim ** -0.5, or for the 27B models
    (told apart by their layer count) by (hidden / heads) ** -0.5; `attention.scale` overrides both."""
    scale = file.meta.get(f"{arch}.attention.scale")
    if scale:
        return 1.0 / float(scale) ** 2
    if config["num_hidden_layers"] == entry.big_layers:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


# ---------------------------------------------------------------------------------------------
# tensors


def unpermute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `LlamaModel.permute`, which interleaves the two rotary halves of each
    head's rows; transformers' `LlamaTensorProcessor._reverse_permute_weights`."""
    dim = t.shape[0] // heads // 2
    return t.reshape(heads, dim, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


@dataclass(frozen=True)
class TensorPlan:
    gguf_name: str
    shape: tuple[int, ...]  # the HF shape, after trimming
    permute_heads: int | None = None
    norm_offset: float = 0.0
    rows: int | None = None  # keep only the first `rows` rows (padded vocabulary)


class GgufTensors:
    """A GGUF file's tensors under HF names, each dequantized only when asked for."""

    def __init__(self, file: GgufFile, plans: dict[str, TensorPlan], dtype: torch.dtype) -> None:
        self.file, self.plans, self._dtype = file, plans, dtype

    def names(self) -> list[str]:
        return list(self.plans)

    def dtype(self, name: str) -> torch.dtype:
        return self._dtype

    def shape(self, name: str) -> tuple[int, ...]:
        return self.plans[name].shape

    def where(self, name: str) -> Path:
        return self.file.path

    def get(self, name: str) -> torch.Tensor:
        plan = self.plans[name]
        t = self.file.read(plan.gguf_name)
        if plan.rows is not None:
            t = t[:plan.rows]
        if plan.permute_heads is not None:
            t = unpermute(t, plan.permute_heads)
        if plan.norm_offset:
            t = t.float() - plan.norm_offset  # in float32, as transformers does (rounding first costs precision)
        return t.to(self._dtype).contiguous()

    def close(self) -> None:
        self.file.close()


def tensor_plans(file: GgufFile, config: dict[str, Any], entry: GgufArch) -> dict[str, TensorPlan]:
    """{HF name: how to read it}. The HF names are the ones the family expects for this config;
    gguf's TensorNameMap says what llama.cpp calls each, as in transformers' GGUF loader."""
    import gguf

    from lmconvert.arch.shapes import parameter_shapes
    from lmconvert.mappings import MappingError, family_for

    try:
        family = family_for(config["model_type"])
        arch = family.arch_config(config)
        hf_names = family.tensors.plan_export(parameter_shapes(arch))
    except MappingError as exc:
        raise InputError(f"{file.path}: {str(exc).removeprefix('config.json: ')}") from None
    gguf_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == file.meta["general.architecture"])
    name_map = gguf.get_tensor_name_map(gguf_arch, config["num_hidden_layers"])
    to_hf: dict[str, str] = {}
    for hf_name in hf_names:
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = name_map.get_name(base)
        if gguf_base is not None:
            to_hf[f"{gguf_base}.{suffix}"] = hf_name
    vocab = config["vocab_size"]
    plans: dict[str, TensorPlan] = {}
    for name in file.tensors:
        if name == "rope_freqs.weight":  # read into the config (llama3 RoPE scaling)
            continue
        if name not in to_hf:
            raise InputError(f"{file.path}: tensor {name!r} has no counterpart in {config['model_type']} as this "
                             "metadata describes it; the file holds something lmconvert does not convert")
        shape = file.shape(name)
        rows = vocab if name in ("token_embd.weight", "output.weight") and shape[0] > vocab else None
        heads = None
        if entry.permute_qk and ".attn_q." in name:
            heads = config["num_attention_heads"]
        elif entry.permute_qk and ".attn_k." in name:
            heads = config["num_key_value_heads"]
        offset = entry.norm_offset if name.endswith("norm.weight") else 0.0
        plans[to_hf[name]] = TensorPlan(name, (rows, *shape[1:]) if rows else shape, heads, offset, rows)
    return plans


# ---------------------------------------------------------------------------------------------
# tokenizer and generation files


def sidecar_writer(file: GgufFile, info: dict[str, Any]) -> Callable[[Path], list[str]]:
    """Writes the tokenizer transformers builds from the GGUF metadata (`gguf_file=`) and a
    generation_config.json with the file's token ids; notes in `info` what happened."""
    path = file.path
    has_tokenizer = "tokenizer.ggml.model" in file.meta
    ids = {hf: int(file.meta[g]) for hf, g in TOKEN_IDS.items() if file.meta.get(g) is not None}

    def write(directory: Path) -> list[str]:
        written: list[str] = []
        if has_tokenizer:
            from transformers import AutoTokenizer
            from transformers.utils import logging

            logging.disable_progress_bar()
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                info["tokenizer"] = f"not converted: transformers cannot build it ({_one_line(exc)})"
            else:
                written += [Path(p).name for p in tokenizer.save_pretrained(str(directory))]
                kind = file.meta["tokenizer.ggml.model"]
                info["tokenizer"] = f"built by transformers from the GGUF metadata ({kind})"
        else:
            info["tokenizer"] = "none in the file"
        if ids:
            (directory / "generation_config.json").write_text(json.dumps(ids, indent=2, sort_keys=True) + "\n")
            written.append("generation_config.json")
        return sorted(set(written) & {p.name for p in directory.iterdir()})

    return write


def open_gguf(path: Path) -> Source:
    target = gguf_file_of(path)
    if target is None:
        raise InputError(f"{path}: not a GGUF file or a directory holding one")
    file = GgufFile(target)
    try:
        file.check_types()
        config, entry = hf_config(file)
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
        tokenizer = loadable if "tokenizer.ggml.model" in file.meta else None
        return Source(target, "gguf", config, tensors, info=info, sidecars=sidecar_writer(file, info),
                      reference=loadable, tokenizer=tokenizer)
    except BaseException:
        file.close()
        raise
