"""Mamba2 (state-space duality; `Mamba2ForCausalLM`).

Same as llama, except: no attention and no FFN; every layer is one Mamba2 mixer (`mixer="mamba2"`,
arch/mamba2.py) after a pre-norm, `layer_ffns` all "none"; the residual stream is kept in fp32
(`residual_in_fp32`, default true: `residual_fp32`); tensors under `backbone.` (`embeddings`,
`layers.{i}.norm`, `layers.{i}.mixer.*` with transformers' names, `norm_f`); the norms' eps is
`layer_norm_epsilon` (default 1e-5), which the mixer's gated RMSNorm shares; the mixer's sizes are
`num_heads` x `head_dim` (their product must be `expand` x `hidden_size`, as Mamba2Config checks),
`state_size`, `n_groups`, `conv_kernel`, `chunk_size`; `use_bias` switches in_proj's and out_proj's
biases, `use_conv_bias` the conv's; `time_step_limit` clamps dt in the chunked prefill
(`time_step_min`/`time_step_max`/`time_step_floor`/`time_step_rank` only initialise); `hidden_act`
is the conv's activation (SiLU only); embeddings untied by default. The attention fields an all-mixer
model does not use are fixed (`n_heads` 1, `d_ff` its width).

The pieces here (the mixer table, the `backbone.` edges, the all-mixer schedule) are what the other
state-space families state their differences against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, plain
from ..tables.gguf import PADDED, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.table import Rule, TensorTable
from ..tables.transforms import NEG_EXP, Chain, Sizes, Transform

MAMBA2_PARAMS = ("dt_bias", "A_log", "D", "in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias",
                 "norm.weight", "out_proj.weight", "out_proj.bias")


def mixer_rules(stored: str, params: tuple[str, ...] = MAMBA2_PARAMS) -> tuple[Rule, ...]:
    """A mixer's tensors under `stored` (with `{}` for the layer), named as transformers names them."""
    return tuple(Rule(f"{stored}.{p}", f"layers.{{}}.mixer.{p}") for p in params)


BACKBONE_RULES = (
    Rule("backbone.embeddings.weight", "embed.weight"),
    Rule("backbone.norm_f.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
    Rule("backbone.layers.{}.norm.weight", "layers.{}.attn_norm.weight"),
)
TENSORS = TensorTable(BACKBONE_RULES + mixer_rules("backbone.layers.{}.mixer"))


SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def decoded(value: Any) -> Any:
    """A float as transformers 5 writes one JSON has no number for (`{"__float__": "Infinity"}`)."""
    if isinstance(value, dict) and set(value) == {"__float__"} and value["__float__"] in SPECIAL_FLOATS:
        return SPECIAL_FLOATS[value["__float__"]]
    return value


def time_step_limit(hf: HfConfig, key: str = "time_step_limit") -> dict[str, Any]:
    """`time_step_limit` (lower, upper): dt's clamp in the chunked prefill; an infinite upper bound is none."""
    limit = hf.get(key)
    limit = [decoded(v) for v in limit] if isinstance(limit, (list, tuple)) else limit
    good = (isinstance(limit, (list, tuple)) and len(limit) == 2
            and all(not isinstance(v, bool) and isinstance(v, (int, float)) for v in limit)
            and math.isfinite(limit[0]) and not math.isnan(limit[1]) and limit[0] <= limit[1])
    if not good:
        raise MappingError(f"config.json: {key}={show(limit)} should be [lower, upper], two numbers, the lower "
                           "finite; remove the key for the default (no clamp)")
    return {"time_step_min": float(limit[0]), "time_step_max": None if math.isinf(limit[1]) else float(limit[1])}


def limit_to_hf(settings: Any) -> list[float]:
    """No upper bound is infinity (JSON's `Infinity`, which transformers reads as the Hub's files spell it)."""
    return [settings.time_step_min, math.inf if settings.time_step_max is None else settings.time_step_max]


def silu_only(key: str) -> Key:
    """The conv's activation: transformers applies `ACT2FN[key]`; the mixer kinds run SiLU only."""
    return Key(key, str, "silu", choices={"silu": "silu", "swish": "silu"})


MIXER_KEYS = (Key("num_heads", int, 128), Key("head_dim", int, 64), Key("state_size", int, 128),
              Key("n_groups", int, 8), Key("conv_kernel", int, 4), Key("chunk_size", int, 256),
              Key("expand", int, 2), Key("use_bias", bool, False), Key("use_conv_bias", bool, True),
              Key("time_step_limit", list, (0.0, math.inf)), silu_only("hidden_act"))


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    heads, head_dim, d = hf.get("num_heads"), hf.get("head_dim"), fields["d_model"]
    if heads * head_dim != hf.get("expand") * d:
        raise MappingError(f"config.json: num_heads={heads} x head_dim={head_dim} should equal expand="
                           f"{hf.get('expand')} x hidden_size={d}, as Mamba2Config requires; fix the sizes")
    return {"mixer": "mamba2", "mixer_settings": {
        "n_heads": heads, "head_dim": head_dim, "d_state": hf.get("state_size"), "n_groups": hf.get("n_groups"),
        "conv_kernel": hf.get("conv_kernel"), "chunk_size": hf.get("chunk_size"), "conv_bias": hf.get("use_conv_bias"),
        "in_bias": hf.get("use_bias"), "out_bias": hf.get("use_bias"), "norm_eps": fields["norm"].eps,
        **time_step_limit(hf)}}


def keys_of(cfg: ArchConfig, names: dict[str, str]) -> dict[str, Any]:
    """A Mamba2 mixer's settings under a family's keys (`names`: setting -> key; "time_step_limit" the clamp,
    "expand" d_inner / d_model); nothing for another mixer, which reads back otherwise: export refuses it
    (as it does biases in_proj and out_proj do not share: the families switch both with one key)."""
    s = cfg.mixer_settings if cfg.mixer == "mamba2" else None
    if s is None:
        return {}
    special = {"time_step_limit": limit_to_hf(s),
               "expand": s.d_inner // cfg.d_model if s.d_inner % cfg.d_model == 0 else DEFAULT}
    return {key: special[field] if field in special else getattr(s, field) for field, key in names.items()}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return keys_of(cfg, {"n_heads": "num_heads", "head_dim": "head_dim", "d_state": "state_size",
                         "n_groups": "n_groups", "conv_kernel": "conv_kernel", "chunk_size": "chunk_size",
                         "conv_bias": "use_conv_bias", "in_bias": "use_bias", "expand": "expand",
                         "time_step_limit": "time_step_limit", "activation": "hidden_act"})


def all_mixers(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Every layer one mixer and nothing else; attention's head count and the FFN width are unused: fixed."""
    n = fields["n_layers"]
    return {"layer_mixers": ("mixer",) * n, "layer_ffns": ("none",) * n, "n_heads": 1, "d_ff": fields["d_model"]}


SCHEDULE = Entry("layer schedule", (), all_mixers, lambda cfg: {})
RESIDUAL_FP32 = plain("residual_in_fp32", "residual_fp32", bool, True)


def eps_norm(key: str, eps: float) -> Entry:
    """Mamba2RMSNorm (LLaMA's: the weight after the cast back), its eps under `key`."""
    return Entry("norm", (Key(key, float, eps),), lambda hf, _: {"norm": NormConfig(eps=hf.get(key))},
                 lambda cfg: {key: cfg.norm.eps})


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 32768),
    plain("hidden_size", "d_model", int, 4096),
    plain("num_hidden_layers", "n_layers", int, 64),
    plain("tie_word_embeddings", "tie_embeddings", bool, False),
    eps_norm("layer_norm_epsilon", 1e-5),
    RESIDUAL_FP32,
    Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf),
    SCHEDULE,
))


# -- llama.cpp (GGUF): its mamba2 architecture (Mamba2Model in its converter). The mixer's tensors are `ssm_*`: the
# conv kernel stored [channels, kernel] (squeezed; F32, as ggml_ssm_conv takes it), dt_bias as `ssm_dt.bias`, A
# as -exp(A_log) and D each one row per head ([heads, 1]), the gated norm's weight one row per group ([n_groups,
# d_inner / n_groups]); no in_proj or out_proj biases (llama.cpp loads none: an export holding them is refused,
# naming them). The metadata states the heads as `ssm.time_step_rank`, d_inner as `ssm.inner_size`, and no
# attention (head count and FFN width 0, a context of 2**20 as its converter writes); no time-step clamp (llama.cpp
# runs none: a clamped model reads back otherwise and is refused) and no chunk size (llama.cpp's scan is not
# chunked), which lmconvert states as its own `lmconvert.ssm.chunk_size` for its own decoder.
SQUEEZED_CONV = Transform("the convolution's middle dimension of 1 left out", lambda t: t.unsqueeze(1),
                          lambda t: t.squeeze(1))
PER_HEAD = Transform("a trailing dimension of 1", lambda t: t.squeeze(-1), lambda t: t.unsqueeze(-1))


@dataclass(frozen=True)
class PerGroup:
    """The gated norm's weight, one row per group ([n_groups, d_inner / n_groups]); the rows joined on import."""

    def bind(self, sizes: Sizes) -> Transform:
        groups = sizes.get("mixer.n_groups")  # export's sizes (the import needs none)
        return Transform("one row per group", lambda t: t.reshape(-1), lambda t: t.reshape(groups, -1))


NO_ATTENTION = {"context_length": 2**20, "feed_forward_length": 0, "attention.head_count": 0}
# the projections' biases, which llama.cpp's mamba and mamba2 do not load
PROJECTION_BIASES = {f"blk.0.ssm_{p}.bias": f"an {p}_proj bias (use_bias)" for p in ("in", "out")}


def gguf_mixer_rules(mixer: str = "layers.{}.mixer") -> tuple[Rule, ...]:
    """A Mamba2 mixer's tensors in llama.cpp's layout, canonical ones under `mixer`."""
    return (Rule("blk.{}.ssm_in.weight", f"{mixer}.in_proj.weight"),
            Rule("blk.{}.ssm_conv1d.weight", f"{mixer}.conv1d.weight", SQUEEZED_CONV),
            Rule("blk.{}.ssm_conv1d.bias", f"{mixer}.conv1d.bias"),
            Rule("blk.{}.ssm_dt.bias", f"{mixer}.dt_bias"),
            Rule("blk.{}.ssm_a", f"{mixer}.A_log", Chain(PER_HEAD, NEG_EXP)),
            Rule("blk.{}.ssm_d", f"{mixer}.D", PER_HEAD),
            Rule("blk.{}.ssm_norm.weight", f"{mixer}.norm.weight", PerGroup()),
            Rule("blk.{}.ssm_out.weight", f"{mixer}.out_proj.weight"))


def gguf_all_mixer_table(*mixer: Rule) -> TensorTable:
    """An all-mixer model (mamba, mamba2) in llama.cpp's layout: each layer's norm is `attn_norm`."""
    edges = (Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED))
    return TensorTable((*edges,
                        Rule("output_norm.weight", "final_norm.weight"),
                        Rule("blk.{}.attn_norm.weight", "layers.{}.attn_norm.weight"), *mixer))


def _sizes_from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    inner, heads = config["intermediate_size"], config["num_heads"]
    return {"head_dim": inner // heads, "expand": inner // config["hidden_size"]}


GGUF_MAMBA2 = written("mamba2", arch="mamba2", keys={
    "ssm.conv_kernel": "conv_kernel", "ssm.state_size": "state_size", "ssm.group_count": "n_groups",
    "ssm.time_step_rank": "num_heads", "ssm.inner_size": "intermediate_size"},
    renamed={"rms_norm_eps": "layer_norm_epsilon"}, constants=NO_ATTENTION, head_dim_stated=False,
    table=gguf_all_mixer_table(*gguf_mixer_rules()), derived=_sizes_from_gguf,
    exported=lambda config: {"ssm.inner_size": config["num_heads"] * config["head_dim"]},
    own={"ssm.chunk_size": "chunk_size"}, refused=PROJECTION_BIASES)

FAMILY = Family("mamba2", ("mamba2",), "Mamba2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MAMBA2,))
