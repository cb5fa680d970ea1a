"""The RoPE keys of config.json, in both of their styles, as config-table rows.

Hub config.json files come in two styles: transformers 4's `rope_theta` + `rope_scaling`, and
transformers 5's `rope_parameters`. Both are read here, the way transformers' own
`convert_rope_params_to_dict` merges them; export always writes `rope_parameters`. The parameters
inside the dict are checked like top-level keys: a zero factor or theta is refused, not defaulted.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, RopeConfig

from ..errors import MappingError
from .config_table import Entry
from .hf_config import HfConfig, Key

ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3",
              "longrope": "longrope", "proportional": "proportional"}
SCALED = ("yarn", "llama3", "longrope")  # the types transformers gives original_max_position_embeddings
# rope_type -> (the RopeConfig fields it reads, those of them transformers' validation requires)
_READS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ("factor",)), "dynamic": (("factor",), ("factor",)),
    "yarn": (("factor", "original_max_positions", "beta_fast", "beta_slow", "attention_factor",
              "mscale", "mscale_all_dim", "truncate"), ("factor", "original_max_positions")),
    "llama3": (("factor", "original_max_positions", "low_freq_factor", "high_freq_factor"),) * 2,
    "longrope": (("factor", "original_max_positions", "attention_factor", "short_factor", "long_factor"),
                 ("original_max_positions", "short_factor", "long_factor")),
    "proportional": (("factor",), ()),  # Gemma 4: partial_rotary_factor too, always (below)
}
_ROPE_KEYS = {  # rope_parameters key -> RopeConfig field
    "factor": "factor", "original_max_position_embeddings": "original_max_positions",
    "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
    "beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attention_factor",
    "mscale": "mscale", "mscale_all_dim": "mscale_all_dim", "truncate": "truncate",
    "short_factor": "short_factor", "long_factor": "long_factor",
}
FRACTION = Key("partial_rotary_factor", float, None, nullable=True, bound="fraction")
# the keys of one rope parameter dict; an optional parameter may be null (transformers reads it with
# `.get(...) or default`), a present one must be valid
PARAMETER_KEYS: dict[str, Key] = {key.name: key for key in (
    Key("rope_type", str, "default", choices=ROPE_TYPES), Key("type", str, "default", choices=ROPE_TYPES),
    Key("rope_theta", float, None),
    Key("factor", float, None, nullable=True), Key("original_max_position_embeddings", int, None, nullable=True),
    Key("low_freq_factor", float, None, nullable=True), Key("high_freq_factor", float, None, nullable=True),
    Key("beta_fast", float, None, nullable=True), Key("beta_slow", float, None, nullable=True),
    Key("attention_factor", float, None, nullable=True),
    Key("mscale", float, None, nullable=True, bound="finite"),
    Key("mscale_all_dim", float, None, nullable=True, bound="finite"),
    Key("truncate", bool, None, nullable=True), FRACTION,
    Key("short_factor", list, None, nullable=True), Key("long_factor", list, None, nullable=True),
)}
# the top-level keys one RoPE for every layer is read from
KEYS = (Key("rope_parameters", dict, None, nullable=True),
        Key("rope_scaling", dict, None, nullable=True, legacy=True),
        Key("rope_theta", float, 10000.0, legacy=True), Key(FRACTION.name, float, None, nullable=True,
                                                            bound="fraction", legacy=True))


def rope_parameters(hf: HfConfig) -> tuple[dict[str, Any], str]:
    """The merged rope parameter dict, whichever style the file uses (rope_scaling wins, as in
    transformers), and where it is in the file."""
    if hf.get("rope_scaling"):
        return dict(hf.get("rope_scaling")), "rope_scaling."
    return dict(hf.get("rope_parameters") or {}), "rope_parameters."


def rope_from_hf(hf: HfConfig, params: dict[str, Any], where: str, theta: float | None = None,
                 partial: bool = False, **fixed: Any) -> RopeConfig:
    """RopeConfig from one (non-nested) rope parameter dict found at `where`; `theta` is the
    rope_theta it lacks (else the top-level key's); `partial`: the family's own default init reads
    partial_rotary_factor too; `fixed` sets family constants."""
    p = HfConfig(params, PARAMETER_KEYS, where)
    kind = p.get("rope_type") if p.stated("rope_type") else p.get("type")
    values: dict[str, Any] = {"theta": p.get("rope_theta", hf.get("rope_theta") if theta is None else theta),
                              "scaling": ROPE_TYPES[kind]}
    for key, name in _ROPE_KEYS.items():  # only what this type reads: a stray key changes nothing
        if name in _READS[kind][0] and p.get(key) is not None:
            values[name] = p.get(key)
    max_pos = hf.get("max_position_embeddings")
    if kind in SCALED:
        values.setdefault("original_max_positions", max_pos)
    fraction = p.get(FRACTION.name) if p.stated(FRACTION.name) else hf.get(FRACTION.name)
    if fraction is not None and (partial or kind == "proportional"):
        values["fraction"] = fraction
    elif fraction not in (None, 1.0) and kind != "default":  # llama's default init ignores it
        raise MappingError(f"config.json: partial_rotary_factor={fraction} with rope_type {kind!r}: the scaled "
                           "tables cover part of each head but this family's attention rotates all of it, which "
                           "transformers cannot run either; remove partial_rotary_factor")
    try:
        if kind in ("yarn", "longrope") and p.get("factor") is None:
            values["factor"] = max_pos / values["original_max_positions"]
        values.update(fixed)
        return RopeConfig(**values)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise MappingError(f"config.json: {where.rstrip('.')}={params!r}: {exc}") from None


def rope_to_hf(rope: RopeConfig, partial: bool = False) -> dict[str, Any]:
    # a scaling only one family spells (HunYuan's ntk_alpha) is written as the default, so export to
    # another family loses it and is refused naming it
    kind = {v: k for k, v in ROPE_TYPES.items()}.get(rope.scaling, "default")
    out: dict[str, Any] = {"rope_type": kind, "rope_theta": rope.theta}
    defaults = RopeConfig()
    relevant, required = _READS[kind]
    for key, name in _ROPE_KEYS.items():
        value = getattr(rope, name)
        if name in relevant and (name in required or value != getattr(defaults, name)):
            out[key] = list(value) if isinstance(value, tuple) else value  # longrope's factors: JSON lists
    if partial or rope.fraction != 1.0 or kind == "proportional":  # partial: an absent fraction means the family's
        #   default; proportional's is always written (transformers does)
        out["partial_rotary_factor"] = rope.fraction
    return out


def rope(partial: bool = False, **fixed: Any) -> Entry:
    """`rope_parameters` (or the older keys) <-> one RoPE for every layer; `partial`: the family's
    default RoPE init reads `partial_rotary_factor` (Nemotron, StableLM), so it is read for every
    rope type and always written; `fixed` sets the RopeConfig fields config.json does not state
    (OLMo 2's fp32 tables)."""
    return Entry("rope", KEYS,
                 lambda hf, _: {"rope": rope_from_hf(hf, *rope_parameters(hf), partial=partial, **fixed)},
                 lambda cfg: {"rope_parameters": rope_to_hf(cfg.rope, partial)})


def rope_by_kind(full: RopeConfig, sliding: RopeConfig, kinds: tuple[str, ...]) -> dict[str, Any]:
    """`rope` for full layers and `rope_local` for sliding ones (None when the same, or when no layer
    is sliding); with no full layer, `rope` is the sliding layers'."""
    full = full if "global" in kinds else sliding
    return {"rope": full, "rope_local": sliding if "local" in kinds and sliding != full else None}


def rope_by_layer_type_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """`rope_parameters` nested by layer type (Gemma 3, OLMo 3)."""
    return {"rope_parameters": {"full_attention": rope_to_hf(cfg.rope),
                                "sliding_attention": rope_to_hf(cfg.rope_local or cfg.rope)}}


TYPED_KEYS = (Key("rope_parameters", dict, None, nullable=True),)


def ropes_by_layer_type(hf: HfConfig, kinds: tuple[str, ...], defaults: dict[str, dict[str, Any]],
                        default_fraction: float) -> dict[str, Any]:
    """`rope_parameters` keyed by layer type, as MiMo-V2-Flash and Laguna read it (their own
    `convert_rope_params_to_dict` takes no older key): absent or null, the family's `defaults`; else a
    JSON object per layer type a layer uses, each with its own `rope_theta` and partial rotary factor
    (absent: `default_fraction` for the default rope type, as the family's own init reads it, and 1 for
    the others, as transformers' shared inits read it). As `rope` for the full layers, `rope_local` for
    the sliding ones."""
    params = hf.get("rope_parameters")
    params = defaults if params is None else params
    ropes = {}
    for kind, name in (("global", "full_attention"), ("local", "sliding_attention")):
        if kind not in kinds:
            continue
        where = f"rope_parameters.{name}."
        one = params.get(name)
        if not isinstance(one, dict) or "rope_theta" not in one:
            raise MappingError(f"config.json: rope_parameters should hold {name} (its layers' rope_type and "
                               f"rope_theta) as a JSON object, not {one!r}; transformers cannot build those "
                               "layers' rotary tables without it")
        stated = HfConfig(one, PARAMETER_KEYS, where)
        kind_of = stated.get("rope_type") if stated.stated("rope_type") else stated.get("type")
        fraction = stated.get(FRACTION.name)
        fraction = (default_fraction if kind_of == "default" else 1.0) if fraction is None else fraction
        ropes[kind] = rope_from_hf(hf, {**one, FRACTION.name: fraction}, where, theta=stated.get("rope_theta"),
                                   partial=True)
    return rope_by_kind(ropes.get("global", ropes.get("local")), ropes.get("local", ropes.get("global")), kinds)


def ropes_by_layer_type_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """`rope_parameters` keyed by the layer types the layers use, each with its partial rotary factor (absent
    would mean the family's own default)."""
    ropes = {"full_attention": ("global", cfg.rope), "sliding_attention": ("local", cfg.rope_local or cfg.rope)}
    return {"rope_parameters": {name: rope_to_hf(rope, partial=True) for name, (kind, rope) in ropes.items()
                                if kind in cfg.layer_kinds}}
