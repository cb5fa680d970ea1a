"""GGUF metadata -> the transformers config.json it describes. llama.cpp writes no config: the
`{arch}.` keys are translated by the tables here and in gguf.py's architecture table; what
llama.cpp's runtime hard-codes instead of writing (Gemma's sliding pattern and score scale,
Gemma 2's soft-caps) comes from the same tables. Llama 3's RoPE scaling is not in the metadata but
in a `rope_freqs` tensor of per-frequency factors; the llama3 parameters that produce exactly
those factors are recovered from it.

No file I/O: the reader (formats/gguf.py) passes its parsed file; errors are MappingErrors the
reader prefixes with the file's path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import MappingError
from ..registry import ARCHS, BY_NAME
from ..tables.gguf import GgufArch

if TYPE_CHECKING:
    import numpy as np
    import torch

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
                 "attention.head_count")  # and the architecture's norm eps key (GgufArch.norm_eps)
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
# lmconvert's GGUF export also states the llama3 parameters, under these keys; the factors still decide
LLAMA3_STATED = {f"lmconvert.rope.{name}": name for name in LLAMA3_CANDIDATES[0]}


class Metadata(Protocol):
    """What the translation reads of a parsed GGUF file."""

    meta: Mapping[str, Any]  # metadata values, but the huge token arrays
    counts: Mapping[str, int]  # lengths of the huge token arrays
    tensors: Mapping[str, Any]  # tensor name -> the reader's entry

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str) -> torch.Tensor: ...


def hf_config(file: Metadata) -> tuple[dict[str, Any], GgufArch]:
    """The transformers config dict the metadata describes, and the architecture's table entry."""
    arch = str(file.meta["general.architecture"])
    entry = arch_entry(arch, str(file.meta.get("general.name") or ""))
    entry = entry.stating(lambda name: file.meta.get(f"{arch}.{name}")).holding(file.tensors)
    for tensor, layout in entry.refused.items():
        if tensor in file.tensors:
            raise MappingError(f"holds {tensor}: {layout}, which llama.cpp's {arch} architecture does not run "
                               "and lmconvert does not read from GGUF; convert the original checkpoint instead")
    for tensor, what in entry.unread.items():
        if tensor in file.tensors:
            raise MappingError(f"holds {tensor}: {what}, which transformers' GGUF loader does not read (it loads the "
                               "model without them), so lmconvert cannot check an import against it and does not "
                               "import them; convert the original checkpoint instead")

    def key(name: str) -> Any:  # noqa: ANN401 - metadata values are of any type
        return file.meta.get(f"{arch}.{name}")

    missing = [f"{arch}.{k}" for k in (*REQUIRED_KEYS, entry.norm_eps) if key(k) is None]
    if missing:
        raise MappingError(f"metadata lacks {', '.join(missing)}; the file is incomplete")
    config: dict[str, Any] = {"model_type": entry.model_type, **SHARED_DEFAULTS, **entry.defaults, **entry.folded}
    for gguf_key, hf_key in {**SHARED_KEYS, **entry.keys}.items():
        if key(gguf_key) is not None:
            _set(config, hf_key, key(gguf_key))
    for own, hf_key in entry.own.items():
        if file.meta.get(f"lmconvert.{own}") is not None:
            _set(config, hf_key, file.meta[f"lmconvert.{own}"])
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    config.setdefault("num_key_value_heads", heads)
    if heads == 0 and entry.attends:
        raise MappingError(f"{arch}.attention.head_count is 0, which only llama.cpp's state-space architectures "
                           "state; the file is damaged")
    if "head_dim" not in config and entry.attends:
        if hidden % heads:
            raise MappingError(f"{arch}.attention.key_length is missing and embedding_length "
                               f"{hidden} is not a multiple of head_count {heads}")
        config["head_dim"] = hidden // heads
    head_dim = config.get("head_dim")
    rotated = key("rope.dimension_count")
    if entry.partial_rotary and rotated is not None:  # StableLM: the rotated part of a head
        config[entry.rotary_key] = rotated / head_dim
    for name, expected in (("attention.value_length", head_dim), ("rope.dimension_count", head_dim)):
        if entry.latent or entry.per_kind_heads or (name == "rope.dimension_count" and entry.partial_rotary) \
                or name in entry.keys:
            continue  # (a key the entry reads as its own: MiMo's value width, v_head_dim)
        if key(name) is not None and key(name) != expected:
            raise MappingError(f"{arch}.{name}={key(name)} differs from the head size {expected}; "
                               f"{entry.model_type} has no such variant")
    for hf_key, tensor in entry.bias_flags.items():
        config[hf_key] = tensor in file.tensors
    config["tie_word_embeddings"] = "output.weight" not in file.tensors
    config["vocab_size"] = _vocab_size(file, arch)
    if entry.rope_in is not None and "rope_freqs.weight" in file.tensors:  # RoPE of the architecture's own
        config.update(entry.rope_in(file.read("rope_freqs.weight"), config))
    else:
        config.update(_rope_scaling(file, arch, config, entry.keys, entry.rope_fixed))
    if entry.swa_pattern is not None:
        config["layer_types"] = _layer_types(file, arch, entry, config["num_hidden_layers"])
    if entry.big_layers is not None:
        config["query_pre_attn_scalar"] = _query_pre_attn_scalar(file, arch, entry, config)
    for hf_key, tensor in entry.layer_tensors.items():
        config[hf_key] = [i for i in range(config["num_hidden_layers"]) if tensor.format(i) in file.tensors]
    if entry.derived is not None:
        config.update(entry.derived(config))
    for hf_key in (*entry.layer_tensors, *entry.transient):
        config.pop(hf_key, None)
    for hf_key, gguf_key in TOKEN_IDS.items():
        if file.meta.get(gguf_key) is not None:
            config[hf_key] = int(file.meta[gguf_key])
    for hf_key, own in entry.renamed.items():  # the family's own spelling of a shared key (MPT's d_model)
        if hf_key in config:
            _set(config, own, config.pop(hf_key))
    return config, entry


def _set(config: dict[str, Any], hf_key: str, value: Any) -> None:  # noqa: ANN401 - a config value
    """config[hf_key] = value, a dotted name a key of a nested dict (MPT's `attn_config.clip_qkv`, DBRX's
    `ffn_config.ffn_hidden_size`, MiMo's `rope_parameters.full_attention.partial_rotary_factor`)."""
    *outer, last = hf_key.split(".")
    nested = config
    for part in outer:
        nested = nested.setdefault(part, {})
    nested[last] = value


def _vocab_size(file: Metadata, arch: str) -> int:
    if "token_embd.weight" not in file.tensors:
        raise MappingError("has no token_embd.weight tensor; not a complete decoder")
    rows = file.shape("token_embd.weight")[0]
    stated = file.meta.get(f"{arch}.vocab_size") or file.counts.get("tokenizer.ggml.tokens") or rows
    if stated > rows:
        raise MappingError(f"the vocabulary has {stated} tokens but token_embd.weight only {rows} rows")
    return int(stated)


def _rope_scaling(file: Metadata, arch: str, config: dict[str, Any], own: Mapping[str, str],
                  fixed: Mapping[str, Any]) -> dict[str, Any]:
    """`rope_scaling` from the `{arch}.rope.scaling.` keys; those in `own` (the entry's keys) are read there, and
    the parameters llama.cpp's runtime fixes (`fixed`, GgufArch.rope_fixed) are those values whatever is stated."""
    prefix = f"{arch}."
    kind = file.meta.get(f"{arch}.rope.scaling.type")
    legacy = file.meta.get(f"{arch}.rope.scale_linear")
    if kind is None and legacy is not None:
        kind, factor = "linear", legacy
    else:
        factor = file.meta.get(f"{arch}.rope.scaling.factor")
    if kind is not None and kind not in ROPE_TYPES:
        raise MappingError(f"{arch}.rope.scaling.type={kind!r} is not supported; supported: "
                           f"{', '.join(ROPE_TYPES)}")
    rope_type = ROPE_TYPES.get(kind) if kind is not None else None
    if "rope_freqs.weight" in file.tensors:
        if rope_type is not None:
            raise MappingError(f"states both {arch}.rope.scaling.type={kind!r} and a rope_freqs tensor")
        return {"rope_scaling": _llama3_from_factors(file, config)}
    if rope_type is None:
        return {}
    params: dict[str, Any] = {"rope_type": rope_type, "factor": float(factor) if factor is not None else None}
    for name, value in file.meta.items():
        short = name.removeprefix(prefix)
        if not name.startswith(prefix + "rope.scaling.") or short in ROPE_IGNORED or short == "rope.scaling.factor" \
                or short in own:
            continue
        if short not in ROPE_KEYS:
            raise MappingError(f"{name}={value!r} is a RoPE scaling setting lmconvert does not support")
        params[ROPE_KEYS[short]] = value
    params.update(fixed)
    return {"rope_scaling": {k: v for k, v in params.items() if v is not None}}


def llama3_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                   original_max_position_embeddings: int) -> np.ndarray:
    """The `rope_freqs` llama.cpp's converter writes for llama3 scaling (LlamaModel.generate_extra_tensors)."""
    import torch

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


def _llama3_from_factors(file: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    factors = file.read("rope_freqs.weight").float().numpy()
    factor = float(factors.max())
    stated = {name: file.meta[key] for key, name in LLAMA3_STATED.items() if key in file.meta}
    for candidate in (stated, *LLAMA3_CANDIDATES) if len(stated) == len(LLAMA3_STATED) else LLAMA3_CANDIDATES:
        expected = llama3_factors(float(config["rope_theta"]), config["head_dim"], factor, **candidate)
        if expected.shape == factors.shape and np.allclose(expected, factors, rtol=1e-6, atol=0):
            return {"rope_type": "llama3", "factor": factor, **candidate}
    raise MappingError("its rope_freqs tensor is not Llama 3 RoPE scaling with low/high frequency "
                       "factors 1/4 over 8192 positions, nor with the parameters the file states; lmconvert "
                       "cannot express these RoPE factors")


def _layer_types(file: Metadata, arch: str, entry: GgufArch, n_layers: int) -> list[str]:
    """Sliding or full per layer: from `attention.sliding_window_pattern` (a period, or one flag per
    layer), else llama.cpp's hard-coded period, in llama.cpp's rule (set_swa_pattern)."""
    pattern = file.meta.get(f"{arch}.attention.sliding_window_pattern", entry.swa_pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise MappingError(f"{arch}.attention.sliding_window_pattern has {len(pattern)} flags for "
                               f"{n_layers} layers")
        sliding = [bool(flag) for flag in pattern]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def _query_pre_attn_scalar(file: Metadata, arch: str, entry: GgufArch, config: dict[str, Any]) -> float | int:
    """llama.cpp states no score scale for Gemma: it scales by head_dim ** -0.5, or for the 27B models
    (told apart by their layer count) by (hidden / heads) ** -0.5; `attention.scale` overrides both."""
    scale = file.meta.get(f"{arch}.attention.scale")
    if scale:
        return 1.0 / float(scale) ** 2
    if config["num_hidden_layers"] == entry.big_layers:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def arch_entry(architecture: str, general_name: str = "") -> GgufArch:
    """The table entry for `general.architecture` (and, for variants llama.cpp does not tell
    apart, `general.name`)."""
    if architecture not in ARCHS:
        raise MappingError(f"GGUF architecture {architecture!r} is not supported; supported: "
                           f"{', '.join(sorted(ARCHS))}")
    name = general_name.lower()
    for base, word, variant in BY_NAME:
        if base == architecture and word in name:
            return variant
    return ARCHS[architecture]
