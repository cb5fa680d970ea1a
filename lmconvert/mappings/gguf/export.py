"""GGUF out as the inverse of GGUF in: an HF config -> llama.cpp's architecture name and `{arch}.`
metadata (gguf_metadata.py's key tables read backwards), and what llama.cpp expects beside the
metadata (Llama 3's `rope_freqs` tensor). The tensor names and transforms are the GGUF table of
mappings/gguf.py run backwards (the table's inverses: q/k rows permuted, Gemma's `w + 1`).

Nothing here decides on its own that the metadata is right: `gguf_model` reads what it wrote back
through the import's `hf_config`, and a model that comes back different is refused, naming what
llama.cpp's architecture cannot hold. No file I/O and no `gguf` package (formats/gguf_export.py
writes the file).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from lmconvert.arch import ArchConfig, RopeConfig

from ..errors import MappingError
from ..registry import ARCHS, BY_NAME, FAMILIES
from ..tables.gguf import GgufArch
from .metadata import LLAMA3_STATED, ROPE_KEYS, SHARED_KEYS, TOKEN_IDS, hf_config, llama3_factors

# families with a llama.cpp architecture name that lmconvert does not write (yet), and why
NOT_WRITTEN = {t: f.no_gguf for f in FAMILIES.values() for t in f.model_types if f.no_gguf}
# entries written only for the models another entry hands them (GgufArch.written_as)
WRITTEN_AS = {id(e) for entry in ARCHS.values() for _, e in entry.written_as}
# transformers model_type -> (llama.cpp architecture, its table entry)
EXPORTS: dict[str, tuple[str, GgufArch]] = {
    **{variant.model_type: (arch, variant) for arch, entry in ARCHS.items() for _, variant in entry.variants},
    **{entry.model_type: (arch, entry) for arch, entry in ARCHS.items() if entry.model_type not in NOT_WRITTEN
       and id(entry) not in WRITTEN_AS},
    **{told.model_type: (arch, told) for arch, entry in ARCHS.items() for _, _, told in entry.told_apart},
    **{entry.model_type: (arch, entry) for arch, _, entry in BY_NAME},
}
# HF keys the import writes that a family's config.json may spell otherwise (transformers'
# attribute_map): Qwen-MoE's num_experts is num_local_experts in transformers 5, GPT-2 has its own names
SPELLINGS = {"num_experts": "num_local_experts", "hidden_size": "n_embd", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"}
# HF keys a config may leave out where llama.cpp states the value: GPT-2's d_ff (null) and MPT's (not
# a key: transformers ignores expansion_ratio) are 4 x the width
IMPLIED = {"n_inner": lambda config, renamed: 4 * _get(config, "hidden_size", renamed),
           "intermediate_size": lambda config, renamed: 4 * _get(config, "hidden_size", renamed)}


# the eps DeepSeek's MLA norms (q_a, kv_a) use whatever rms_norm_eps says; llama.cpp's deepseek2 uses the
# model's for them
LATENT_NORM_EPS = 1e-6


def _latent_sizes(arch: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """MLA in llama.cpp's layout without absorption: every head a key of the no-RoPE part and the
    rotary width, a value of v_head_dim, as many KV heads as heads (kv_b decompresses them)."""
    if config.get("rms_norm_eps") != LATENT_NORM_EPS:
        raise MappingError(f"llama.cpp's {arch} normalises the latent q and kv with rms_norm_eps "
                           f"({config.get('rms_norm_eps')}), DeepSeek and Kimi with {LATENT_NORM_EPS}")
    kind = _rope(config)[0].get("rope_type") or "default"
    if kind != "default":
        raise MappingError(f"llama.cpp's {arch} derives the attention scale of scaled RoPE ({kind}) its own way (from "
                           "yarn_log_mul alone, taking mscale as 1, or as mscale_all_dim for DeepSeek-V2), not as "
                           "transformers does; lmconvert writes it with unscaled RoPE only")
    rotary = config["qk_rope_head_dim"]
    return {f"{arch}.attention.key_length": config["qk_nope_head_dim"] + rotary,
            f"{arch}.attention.value_length": config["v_head_dim"], f"{arch}.rope.dimension_count": rotary,
            f"{arch}.attention.head_count_kv": config["num_attention_heads"]}


def _get(config: Mapping[str, Any], hf_key: str, renamed: Mapping[str, str]) -> Any:  # noqa: ANN401 - any value
    """A config value under the import's name, the family's own spelling of it (`renamed`, then
    transformers' aliases), or a key of a nested dict (`attn_config.clip_qkv`)."""
    value: Any = config
    for part in renamed.get(hf_key, hf_key).split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    value = config.get(SPELLINGS.get(hf_key, "")) if value is None else value
    return IMPLIED[hf_key](config, renamed) if value is None and hf_key in IMPLIED else value


ROPE_TYPES_OUT = {"linear": "linear", "yarn": "yarn"}  # HF rope_type -> `{arch}.rope.scaling.type`




@dataclass
class GgufModel:
    """What a GGUF file says of its model, before any tensor data."""

    arch: str
    entry: GgufArch
    values: dict[str, Any]  # metadata key -> value
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # tensors llama.cpp wants beside the weights


def _told_apart(arch: str, entry: GgufArch) -> dict[str, Any]:
    """The `{arch}.` value that tells this entry's model apart from the architecture's others
    (DeepSeek-V2's softmax router in llama.cpp's deepseek2), if any."""
    told = next(((key, value) for key, value, e in ARCHS[arch].told_apart if e is entry and value is not None), None)
    return {} if told is None else {f"{arch}.{told[0]}": told[1]}


def _rope(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """RoPE theta and scaling of the global layers and of the local ones (Gemma 3: `rope_parameters`
    per layer kind), from either spelling (rope_parameters, or rope_theta and rope_scaling)."""
    params = dict(config.get("rope_parameters") or {})
    if not params:
        params = {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta")}
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    if "full_attention" in params:
        return dict(params["full_attention"]), dict(params.get("sliding_attention") or {})
    return params, {}


def _rope_metadata(arch: str, config: Mapping[str, Any], head_dim: int) -> tuple[dict[str, Any],
                                                                                  dict[str, torch.Tensor]]:
    params, local = _rope(config)
    values: dict[str, Any] = {}
    if params.get("rope_theta") is not None:
        values[f"{arch}.rope.freq_base"] = float(params["rope_theta"])
    if local.get("rope_theta") is not None:
        values[f"{arch}.rope.freq_base_swa"] = float(local["rope_theta"])
    kind = params.get("rope_type") or "default"
    if kind == "dynamic" and params.get("alpha"):  # HunYuan's NTK alpha: llama.cpp's converter writes the
        # static base theta * alpha ** (d / (d - 2)) and no scaling
        alpha = float(params["alpha"])
        values[f"{arch}.rope.freq_base"] = float(params["rope_theta"]) * alpha ** (head_dim / (head_dim - 2))
        return values, {}
    if kind == "default":
        return values, {}
    if kind == "llama3":
        args = {k: params[k] for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
        factors = llama3_factors(float(params["rope_theta"]), head_dim, float(params["factor"]), **args)
        values.update({key: args[name] for key, name in LLAMA3_STATED.items()})  # for readers, not llama.cpp
        return values, {"rope_freqs.weight": torch.from_numpy(factors)}
    if kind not in ROPE_TYPES_OUT:
        raise MappingError(f"RoPE scaling {kind!r} has no llama.cpp metadata lmconvert writes; it writes "
                           f"{', '.join(['llama3', *ROPE_TYPES_OUT])}")
    values[f"{arch}.rope.scaling.type"] = ROPE_TYPES_OUT[kind]
    for gguf_key, hf_key in {"rope.scaling.factor": "factor", **ROPE_KEYS}.items():
        if params.get(hf_key) is not None:
            values[f"{arch}.{gguf_key}"] = params[hf_key]
    return values, {}


def _layer_pattern(arch: str, entry: GgufArch, config: Mapping[str, Any]) -> dict[str, Any]:
    """One flag per layer when the layer kinds are not llama.cpp's hard-coded pattern."""
    types = config.get("layer_types")
    if entry.swa_pattern is None or not types:
        return {}
    n = entry.swa_pattern
    hard_coded = ["sliding_attention" if i % n < n - 1 else "full_attention" for i in range(len(types))]
    if list(types) == hard_coded and "attention.sliding_window_pattern" not in entry.stated:
        return {}
    return {f"{arch}.attention.sliding_window_pattern": [t == "sliding_attention" for t in types]}


def _score_scale(arch: str, entry: GgufArch, config: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma's query_pre_attn_scalar, stated when llama.cpp's own rule would get it wrong."""
    scalar = config.get("query_pre_attn_scalar")
    if entry.big_layers is None or scalar is None:
        return {}
    implied = (config["hidden_size"] // config["num_attention_heads"]
               if config["num_hidden_layers"] == entry.big_layers else config["head_dim"])
    return {} if scalar == implied else {f"{arch}.attention.scale": float(scalar) ** -0.5}


def named(entry: GgufArch, arch: str, name: str) -> str:
    """`general.name` as the import reads it back: a variant llama.cpp files tell apart only by the
    model's name (Mistral in llama.cpp's llama) with its word in it, any other model without one."""
    for base, word, variant in BY_NAME:
        if variant is entry and word not in name.lower():
            name = f"{name} ({word})"
        elif variant is not entry and base == arch and word in name.lower():  # a LLaMA in a folder named
            # "mistral" would be read back, by us and by transformers, as a Mistral
            name = re.sub(re.escape(word), "", name, flags=re.IGNORECASE).strip(" -_.") or arch
    return name


# Optional `{arch}.` keys llama.cpp's converter writes for some models only; where it leaves one out, its
# runtime takes a default (the head size from the width and head count, every dimension rotated, the
# token list's length, a RoPE base of 10000). lmconvert leaves out what llama.cpp's converter leaves out
# where the value is that default, and writes it where it is not (a model llama.cpp's converter would get
# wrong). What each architecture's converter class states anyway, or never writes, its entry says
# (GgufArch.stated, .omitted). The head size: llama.cpp's converter writes config.json's `head_dim` where
# the config has one (transformers' config classes of Llama, Mistral, Gemma, Qwen3 ... write it; Mixtral's
# is null, Qwen2's, OLMo's and StarCoder2's classes have none: GgufArch.head_dim_stated).


def _unwritten(arch: str, entry: GgufArch, config: Mapping[str, Any], values: Mapping[str, Any],
               listed: bool) -> set[str]:
    """The optional keys llama.cpp's converter leaves out of this model's file, among those that
    hold llama.cpp's runtime default; `listed`: the file lists the vocabulary's tokens."""
    p, stated = f"{arch}.", entry.stated
    heads = values[p + "attention.head_count"]
    heads = heads[0] if isinstance(heads, list) else heads  # one per layer (Laguna): llama.cpp's n_head(0)
    implied = values[p + "embedding_length"] // heads if heads else None
    head = values.get(p + "attention.key_length")
    keys = set()
    said = "attention.key_length" in stated or (entry.head_dim_stated and config.get("head_dim") is not None)
    if not said and head == implied == values.get(p + "attention.value_length"):
        keys |= {"attention.key_length", "attention.value_length"}
    if "rope.dimension_count" not in stated and values.get(p + "rope.dimension_count") == head:
        keys.add("rope.dimension_count")
    if "vocab_size" not in stated and listed:  # llama.cpp counts the token list
        keys.add("vocab_size")
    return {p + key for key in keys}


def metadata(config: Mapping[str, Any], name: str, listed: bool = False) -> GgufModel:
    """The metadata llama.cpp reads for this HF config, as llama.cpp's converter writes it;
    `listed`: the file will list the vocabulary's tokens. Raises MappingError for a model type
    llama.cpp has no architecture for here."""
    model_type = config.get("model_type")
    if model_type not in EXPORTS and model_type in NOT_WRITTEN:
        raise MappingError(f"{model_type}: {NOT_WRITTEN[model_type]}; export it as HF safetensors instead")
    if model_type not in EXPORTS:
        raise MappingError(f"{model_type} has no llama.cpp architecture lmconvert writes; it writes "
                           f"{', '.join(sorted(EXPORTS))}")
    arch, entry = EXPORTS[model_type]
    entry = next((e for test, e in entry.written_as if test(config)), entry)  # Nemotron-H's MoE: nemotron_h_moe
    arch = entry.arch
    values: dict[str, Any] = {"general.architecture": arch, "general.name": named(entry, arch, name)}
    renamed = entry.renamed
    head_dim = (config.get("head_dim") or (_get(config, "hidden_size", renamed)
                                           // _get(config, "num_attention_heads", renamed))) if entry.attends else 0
    for gguf_key, hf_key in {**SHARED_KEYS, **entry.keys}.items():
        value = _get(config, hf_key, renamed)
        if value is None and hf_key in entry.unstated:
            value = entry.unstated[hf_key](config)
        if value is not None and gguf_key != "rope.freq_base":
            values[f"{arch}.{gguf_key}"] = value
    values.update({f"{arch}.{key}": value for key, value in entry.constants.items()})
    values.update(_told_apart(arch, entry))
    values.update({f"lmconvert.{own}": _get(config, hf_key, {}) for own, hf_key in entry.own.items()
                   if _get(config, hf_key, {}) is not None})
    if entry.attends and not entry.per_kind_heads:  # no head size and no rotation where nothing attends (Mamba);
        # Gemma 4's per layer kind: `exported` states them
        values[f"{arch}.attention.key_length"] = values[f"{arch}.attention.value_length"] = head_dim
        params, _ = _rope(config)
        rotated = params.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0
        values[f"{arch}.rope.dimension_count"] = int(head_dim * rotated)  # the rotated part of a head
    elif not entry.attends:  # a head_dim in the config is the mixer's (Mamba2's)
        values.pop(f"{arch}.attention.key_length", None)
    values[f"{arch}.vocab_size"] = config["vocab_size"]
    if entry.latent:
        values.update(_latent_sizes(arch, config))
    if entry.exported is not None:  # over the head sizes above (MiMo's value width and rotated part, Kimi Linear's
        # absorbed MLA sizes)
        values.update({f"{arch}.{key}": value for key, value in entry.exported(config).items()})
    if entry.rope_out is not None:  # `{arch}.` keys and tensors of its own
        own, extra = entry.rope_out(config)
        rope = {f"{arch}.{key}": value for key, value in own.items()}
    else:
        rope, extra = _rope_metadata(arch, config, head_dim)
    values.update(rope)
    values.update(_layer_pattern(arch, entry, config))
    values.update(_score_scale(arch, entry, config))
    for key in _unwritten(arch, entry, config, values, listed) if not entry.latent else ():
        values.pop(key, None)  # a model without attention has no head size to leave out
    for key in [f"{arch}.{k}" for k, default in entry.omitted.items() if values.get(f"{arch}.{k}") == default]:
        del values[key]
    for hf_key, gguf_key in TOKEN_IDS.items():
        if isinstance(config.get(hf_key), int):
            values[gguf_key] = config[hf_key]
    return GgufModel(arch, entry, values, extra)


def family_tokens(entry: GgufArch, config: Mapping[str, Any], tokens: Sequence[str],
                  stated: Collection[str]) -> dict[str, int]:
    """The tokenizer ids this architecture's converter states beyond what the tokenizer's files say
    (`stated`: the keys they give), from the config or by the token's text in `tokens`."""
    ids = {key: config[hf_key] for key, hf_key in entry.token_keys.items() if isinstance(config.get(hf_key), int)}
    index = {text: i for i, text in enumerate(tokens)} if entry.token_texts else {}
    ids.update({key: index[text] for key, text in entry.token_texts.items()
                if key not in stated and key not in ids and text in index})
    return ids


def for_tensors(model: GgufModel, names: Collection[str]) -> GgufModel:
    """The model with the entry, or the variant (Falcon-40B's two norms), whose table stores every one
    of these canonical tensors; the entry itself when none does (the caller names what has no home)."""
    for entry in (model.entry, *(variant for _, variant in model.entry.variants)):
        if all(entry.tensors.stored_names(name) for name in names):
            return replace(model, entry=entry)
    return model


@dataclass
class _Described:
    """The file as the import reads it, before it exists."""

    meta: Mapping[str, Any]
    shapes: Mapping[str, tuple[int, ...]]
    extra: Mapping[str, torch.Tensor]
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def tensors(self) -> Mapping[str, tuple[int, ...]]:
        return self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def read(self, name: str) -> torch.Tensor:
        return self.extra[name]


def read_back(model: GgufModel, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], GgufArch]:
    """The HF config the import makes of this metadata and these GGUF tensor shapes."""
    meta = {k: v for k, v in model.values.items() if not k.startswith("tokenizer.ggml.") or k in TOKEN_IDS.values()}
    extra_shapes = {name: tuple(t.shape) for name, t in model.extra.items()}
    return hf_config(_Described(meta, {**shapes, **extra_shapes}, model.extra))


def lost(ours: ArchConfig, back: ArchConfig) -> list[str]:
    """The ArchConfig fields llama.cpp's metadata did not carry. NTK-alpha RoPE is carried as the
    static base it is (llama.cpp's converter writes only that base), so it is compared as that."""
    ours = replace(ours, rope=_static_rope(ours.rope, ours.head_dim))
    return [f.name for f in fields(ArchConfig) if getattr(back, f.name) != getattr(ours, f.name)]


def _static_rope(rope: RopeConfig, head_dim: int) -> RopeConfig:
    if rope.scaling != "ntk_alpha" or rope.alpha is None:
        return rope
    d = rope.rotary_dim(head_dim)
    return replace(rope, theta=rope.theta * rope.alpha ** (d / (d - 2)), scaling="none", alpha=None)


__all__ = ["EXPORTS", "GgufModel", "family_tokens", "for_tensors", "lost", "metadata", "named", "read_back"]
