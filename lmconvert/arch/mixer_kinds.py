"""Token-mixer kinds that are not attention (state-space scans, gated delta-nets, short
convolutions), each declared once: what `ArchConfig.mixer` may name.

A hybrid stack interleaves them with attention layers (`ArchConfig.layer_mixers` says which layer
is which), so a kind is declared as an attention kind is (`attention_kinds.py`): its settings, the
checks they need, its torch module, the parts (so the tensors) that module holds, the card's lines
about it, and the state it carries between decoding steps. Attention caches K and V per token; a
mixer carries a fixed state per sequence (a convolution window and a recurrent state), so its
size is stated per sequence, not per token. Consumers look the kind up here and name none.

Torch-free: the module is named ("package.module:Class") and imported when a model is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .kinds import Kinds
from .parts import ConvPart, LinearPart, NormPart, ParamPart, Part

if TYPE_CHECKING:
    from torch import nn

    from .config import ArchConfig


@dataclass(frozen=True)
class MixerKind:
    """One token-mixer kind. Its callables take the whole ArchConfig, already validated (`check`
    runs last, on a config otherwise complete).

    The module is built as `Class(cfg, parts, layer)`, with `parts = parts(cfg)` which it registers
    with `build.attach`, and has `forward(x, ctx, cache)`: x (B, T, d_model), ctx the forward's
    `Context` (padding in `ctx.keys`), cache a `KVCache` or None; it keeps its state between calls
    in `cache.states[layer]`, a dict of tensors it names itself. `settings` is a frozen dataclass of
    the kind's own fields, held in `ArchConfig.mixer_settings` and validating itself in
    `__post_init__`, or None for a kind that has none. `state_elements` is the number of state
    entries one sequence carries in one layer (convolution window plus recurrent state).
    """

    name: str
    module: str
    parts: Callable[[ArchConfig], dict[str, Part]]
    describe: Callable[[ArchConfig], list[str]]
    state_elements: Callable[[ArchConfig], int]
    settings: type | None = None
    check: Callable[[ArchConfig], None] | None = None

    def build(self, cfg: ArchConfig, layer: int) -> nn.Module:
        path, _, name = self.module.partition(":")
        return getattr(import_module(path), name)(cfg, self.parts(cfg), layer)


KINDS: Kinds[MixerKind] = Kinds("mixer kind", "mixer")
register, unregister = KINDS.register, KINDS.unregister


def mixer_kind(name: Any) -> MixerKind:  # noqa: ANN401 - a config value, unchecked
    """The kind `ArchConfig.mixer` names; a ConfigError naming the value when none is registered."""
    return KINDS.named(name)


# ----------------------------------------------------------------------------- shared checks
def _setting_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"ArchConfig.mixer_settings.{name}={value!r}: must be a positive integer")


def _setting_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"ArchConfig.mixer_settings.{name}={value!r}: must be true or false")


def _setting_number(name: str, value: Any, *, positive: bool = False) -> None:
    finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not finite or (positive and value <= 0):
        raise ConfigError(f"ArchConfig.mixer_settings.{name}={value!r}: must be a {'positive, ' if positive else ''}"
                          "finite number")


def _setting_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"ArchConfig.mixer_settings.{name}={value!r}: must be one of {', '.join(allowed)}")


# ----------------------------------------------------------------------------- mamba2: SSD
@dataclass(frozen=True)
class Mamba2Settings:
    """Mamba2's own sizes and switches (`arch/mamba2.py`), in one module for every family that runs it.

    d_inner = n_heads * head_dim; in_proj emits [z (d_inner) | x (d_inner) | B | C (n_groups * d_state
    each) | dt (n_heads)]; the conv runs over [x | B | C]. `in_bias` is in_proj's bias, `out_bias`
    out_proj's (transformers' `use_bias`; Falcon-H1 sets them apart: `mamba_proj_bias`,
    `projectors_bias`). `norm`: "mamba2" (Mamba2RMSNormGated: gate, then RMS over each of n_groups
    groups, weight after the cast back), "falcon_h1" (FalconH1RMSNormGated: the weight in fp32,
    `norm_before_gate` says where the gate goes), or "none" (the scan output times SiLU(z), no weight).
    dt is clamped to [time_step_min, time_step_max] (None: no upper bound) in the chunked prefill only,
    as transformers does. Falcon-H1's muP: the input times `in_multiplier` before in_proj, the
    projection times `zxbcdt_multipliers` (one per part of [z | x | B | C | dt]) after (its mixer's
    own); its decoder layer's `ssm_out_multiplier` on the output is the block's (`ArchConfig.mixer_out_multiplier`).
    """

    n_heads: int = 8
    head_dim: int = 64
    d_state: int = 128
    n_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 256
    conv_bias: bool = True
    in_bias: bool = False
    out_bias: bool = False
    norm: str = "mamba2"
    norm_before_gate: bool = False
    norm_eps: float = 1e-5
    time_step_min: float = 0.0
    time_step_max: float | None = None
    activation: str = "silu"
    in_multiplier: float = 1.0
    zxbcdt_multipliers: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("n_heads", "head_dim", "d_state", "n_groups", "conv_kernel", "chunk_size"):
            _setting_count(name, getattr(self, name))
        for name in ("conv_bias", "in_bias", "out_bias", "norm_before_gate"):
            _setting_flag(name, getattr(self, name))
        _setting_choice("norm", self.norm, ("mamba2", "falcon_h1", "none"))
        _setting_choice("activation", self.activation, ("silu",))
        _setting_number("norm_eps", self.norm_eps, positive=True)
        _setting_number("time_step_min", self.time_step_min)
        if self.time_step_max is not None:
            _setting_number("time_step_max", self.time_step_max)
        _setting_number("in_multiplier", self.in_multiplier)
        if self.n_heads % self.n_groups:
            raise ConfigError(f"ArchConfig.mixer_settings.n_groups={self.n_groups}: must divide "
                              f"n_heads={self.n_heads} (each group's B and C serve n_heads / n_groups heads)")
        if self.norm_before_gate and self.norm != "falcon_h1":
            raise ConfigError("ArchConfig.mixer_settings.norm_before_gate=True: only norm='falcon_h1' normalises "
                              "before the gate")
        if self.zxbcdt_multipliers is not None:
            value = tuple(self.zxbcdt_multipliers) if isinstance(self.zxbcdt_multipliers, (list, tuple)) else None
            if value is None or len(value) != 5:
                raise ConfigError(f"ArchConfig.mixer_settings.zxbcdt_multipliers={self.zxbcdt_multipliers!r}: must "
                                  "be five numbers, one for each of z, x, B, C and dt")
            for m in value:
                _setting_number("zxbcdt_multipliers", m)
            object.__setattr__(self, "zxbcdt_multipliers", value)

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def sizes(self) -> dict[str, int]:
        """The sizes a tensor table names (llama.cpp stores the gated norm's weight one row per group)."""
        return {"n_groups": self.n_groups}


def _mamba2_parts(cfg: ArchConfig) -> dict[str, Part]:
    """Its own parameters first (dt_bias, A_log, D: one per head), then in_proj, conv1d, the gated
    norm's weight and out_proj: transformers' names, so a family's mixer tensors map one to one."""
    s = cfg.mixer_settings
    parts: dict[str, Part] = {"dt_bias": ParamPart((s.n_heads,)), "A_log": ParamPart((s.n_heads,)),
                              "D": ParamPart((s.n_heads,)),
                              "in_proj": LinearPart(cfg.d_model, 2 * s.d_inner + 2 * s.n_groups * s.d_state
                                                    + s.n_heads, s.in_bias)}
    parts["conv1d"] = ConvPart(s.conv_dim, s.conv_kernel, s.conv_bias)
    if s.norm != "none":
        parts["norm.weight"] = ParamPart((s.d_inner,))
    parts["out_proj"] = LinearPart(s.d_inner, cfg.d_model, s.out_bias)
    return parts


def _mamba2_state(cfg: ArchConfig) -> int:
    """The conv window (the last conv_kernel inputs of every conv channel) and the SSM state."""
    s = cfg.mixer_settings
    return s.conv_dim * s.conv_kernel + s.n_heads * s.head_dim * s.d_state


def _mamba2_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    norm = {"mamba2": f"gated RMSNorm over {s.n_groups} group(s), eps={s.norm_eps:g}",
            "falcon_h1": f"gated RMSNorm over {s.n_groups} group(s), eps={s.norm_eps:g}, weight in fp32, gate "
                         + ("after" if s.norm_before_gate else "before") + " the norm",
            "none": "no norm, the output times SiLU(z)"}[s.norm]
    upper = "" if s.time_step_max is None else f", at most {s.time_step_max:g}"
    lines = [f"mixer: Mamba2 (SSD), {s.n_heads} heads x {s.head_dim}, {s.n_groups} group(s), state {s.d_state}, "
             f"conv {s.conv_kernel}, chunk {s.chunk_size}",
             f"Mamba2: {norm}; dt softplus(dt + dt_bias), at least {s.time_step_min:g}{upper} in prefill; biases: "
             + (", ".join(n for n, on in (("in_proj", s.in_bias), ("conv", s.conv_bias), ("out_proj", s.out_bias))
                          if on) or "none")]
    if s.zxbcdt_multipliers is not None or s.in_multiplier != 1.0:
        lines.append(f"Mamba2 muP: input x {s.in_multiplier:g}, [z|x|B|C|dt] x "
                     f"{list(s.zxbcdt_multipliers or (1.0,) * 5)}")
    lines.append(f"Mamba2 state: {_mamba2_state(cfg)} entries per sequence and layer (conv {s.conv_dim} x "
                 f"{s.conv_kernel}, SSM {s.n_heads} x {s.head_dim} x {s.d_state}, fp32)")
    return lines


register(MixerKind(
    name="mamba2",
    module=f"{__package__}.mamba2:Mamba2Mixer",
    parts=_mamba2_parts,
    describe=_mamba2_describe,
    state_elements=_mamba2_state,
    settings=Mamba2Settings,
))


# ----------------------------------------------------------------------------- mamba: selective scan (v1)
@dataclass(frozen=True)
class MambaSettings:
    """Mamba (v1)'s own sizes and switches (`arch/mamba.py`): in_proj emits [x | z] (d_inner each),
    x_proj [dt (dt_rank) | B | C (d_state each)], dt_proj maps dt back to d_inner with a bias;
    A_log is (d_inner, d_state). `proj_bias` is in_proj's and out_proj's bias (`use_bias`).
    `bc_dt_norm`: RMS norms on dt, B and C before dt_proj: "none" (Mamba), "weightless" (FalconMamba,
    `mixer_rms_eps`), "weighted" (Jamba, with weights dt_layernorm, b_layernorm, c_layernorm, `rms_norm_eps`).
    """

    d_inner: int = 1536
    d_state: int = 16
    dt_rank: int = 48
    conv_kernel: int = 4
    conv_bias: bool = True
    proj_bias: bool = False
    bc_dt_norm: str = "none"
    bc_dt_norm_eps: float = 1e-6
    activation: str = "silu"

    def __post_init__(self) -> None:
        for name in ("d_inner", "d_state", "dt_rank", "conv_kernel"):
            _setting_count(name, getattr(self, name))
        for name in ("conv_bias", "proj_bias"):
            _setting_flag(name, getattr(self, name))
        _setting_choice("bc_dt_norm", self.bc_dt_norm, ("none", "weightless", "weighted"))
        _setting_choice("activation", self.activation, ("silu",))
        _setting_number("bc_dt_norm_eps", self.bc_dt_norm_eps, positive=True)


def _mamba_parts(cfg: ArchConfig) -> dict[str, Part]:
    """A_log and D first (its own parameters), then in_proj, conv1d, x_proj, dt_proj, out_proj and
    Jamba's three norm weights: transformers' names."""
    s = cfg.mixer_settings
    parts: dict[str, Part] = {"A_log": ParamPart((s.d_inner, s.d_state)), "D": ParamPart((s.d_inner,)),
                              "in_proj": LinearPart(cfg.d_model, 2 * s.d_inner, s.proj_bias)}
    parts["conv1d"] = ConvPart(s.d_inner, s.conv_kernel, s.conv_bias)
    parts |= {"x_proj": LinearPart(s.d_inner, s.dt_rank + 2 * s.d_state),
              "dt_proj": LinearPart(s.dt_rank, s.d_inner, True),
              "out_proj": LinearPart(s.d_inner, cfg.d_model, s.proj_bias)}
    if s.bc_dt_norm == "weighted":
        parts |= {"dt_layernorm.weight": ParamPart((s.dt_rank,)), "b_layernorm.weight": ParamPart((s.d_state,)),
                  "c_layernorm.weight": ParamPart((s.d_state,))}
    return parts


def _mamba_state(cfg: ArchConfig) -> int:
    s = cfg.mixer_settings
    return s.d_inner * s.conv_kernel + s.d_inner * s.d_state


def _mamba_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    norms = {"none": "", "weightless": f"; dt, B, C RMS-normed (no weights, eps={s.bc_dt_norm_eps:g})",
             "weighted": f"; dt, B, C RMS-normed (weights, eps={s.bc_dt_norm_eps:g})"}[s.bc_dt_norm]
    return [f"mixer: Mamba (selective scan), d_inner {s.d_inner}, state {s.d_state}, dt rank {s.dt_rank}, "
            f"conv {s.conv_kernel}{norms}",
            f"Mamba state: {_mamba_state(cfg)} entries per sequence and layer (conv {s.d_inner} x {s.conv_kernel}, "
            f"SSM {s.d_inner} x {s.d_state}, fp32)"]


register(MixerKind(
    name="mamba",
    module=f"{__package__}.mamba:MambaMixer",
    parts=_mamba_parts,
    describe=_mamba_describe,
    state_elements=_mamba_state,
    settings=MambaSettings,
))


# ----------------------------------------------------------------------------- mamba_heads: Zamba's multi-head Mamba
@dataclass(frozen=True)
class MambaHeadsSettings:
    """Zamba's ZambaMambaMixer (`arch/mamba.py`'s MambaHeadsMixer): Mamba (v1) run as `n_heads` independent heads of
    d_inner / n_heads channels. in_proj's output holds x and z interleaved channel by channel; after the conv each
    head has its own x_proj ([dt (dt_rank) | B | C (d_state each)], a [n_heads, dt_rank + 2 d_state, head_dim]
    weight), dt_proj (weight [n_heads, head_dim, dt_rank], bias [n_heads, head_dim]), A_log and D, and its own
    selective scan; out_proj reads the heads' outputs side by side. `proj_bias` is in_proj's and out_proj's bias
    (`mamba_proj_bias`), `conv_bias` the conv's."""

    n_heads: int = 2
    d_inner: int = 7424
    d_state: int = 16
    dt_rank: int = 232
    conv_kernel: int = 4
    conv_bias: bool = True
    proj_bias: bool = False
    activation: str = "silu"

    def __post_init__(self) -> None:
        for name in ("n_heads", "d_inner", "d_state", "dt_rank", "conv_kernel"):
            _setting_count(name, getattr(self, name))
        for name in ("conv_bias", "proj_bias"):
            _setting_flag(name, getattr(self, name))
        _setting_choice("activation", self.activation, ("silu",))
        if self.d_inner % self.n_heads:
            raise ConfigError(f"ArchConfig.mixer_settings.n_heads={self.n_heads}: must divide d_inner={self.d_inner}")

    @property
    def head_dim(self) -> int:
        return self.d_inner // self.n_heads


def _mamba_heads_parts(cfg: ArchConfig) -> dict[str, Part]:
    """Its own parameters first (transformers' names), then in_proj, conv1d, out_proj."""
    s = cfg.mixer_settings
    h, p = s.n_heads, s.head_dim
    parts: dict[str, Part] = {"x_proj_weight": ParamPart((h, s.dt_rank + 2 * s.d_state, p)),
                              "dt_proj_weight": ParamPart((h, p, s.dt_rank)), "dt_proj_bias": ParamPart((h, p)),
                              "A_log": ParamPart((h, p, s.d_state)), "D": ParamPart((h, p)),
                              "in_proj": LinearPart(cfg.d_model, 2 * s.d_inner, s.proj_bias)}
    parts["conv1d"] = ConvPart(s.d_inner, s.conv_kernel, s.conv_bias)
    parts["out_proj"] = LinearPart(s.d_inner, cfg.d_model, s.proj_bias)
    return parts


def _mamba_heads_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    return [f"mixer: multi-head Mamba (Zamba's), {s.n_heads} heads x {s.head_dim}, state {s.d_state}, dt rank "
            f"{s.dt_rank}, conv {s.conv_kernel}; x and z interleaved in in_proj, x_proj and dt_proj per head",
            f"multi-head Mamba state: {_mamba_state(cfg)} entries per sequence and layer (conv {s.d_inner} x "
            f"{s.conv_kernel}, SSM {s.n_heads} x {s.head_dim} x {s.d_state}, fp32)"]


register(MixerKind(
    name="mamba_heads",
    module=f"{__package__}.mamba:MambaHeadsMixer",
    parts=_mamba_heads_parts,
    describe=_mamba_heads_describe,
    state_elements=_mamba_state,  # Mamba's: the conv window and d_inner x d_state
    settings=MambaHeadsSettings,
))


# ----------------------------------------------------------------------------- gated_deltanet: Qwen3-Next, OLMo-hybrid
GATED_NORM_ORDERS = ("cast_then_scale", "scale_then_cast")  # config.DTYPE_ORDERS (config.py imports this module)


@dataclass(frozen=True)
class GatedDeltaNetSettings:
    """The gated delta-net of Qwen3-Next / Qwen3.5 / OLMo-hybrid (their `linear_attention` layers,
    `arch/gated_deltanet.py`), in the configs' names: `key_heads` linear_num_key_heads, `value_heads`
    linear_num_value_heads (a multiple of key_heads: each q/k head serves value_heads // key_heads
    consecutive value heads), `key_head_dim` / `value_head_dim` linear_key_head_dim /
    linear_value_head_dim, `conv_kernel` linear_conv_kernel_dim (the depthwise causal conv over
    q | k | v), `norm_eps` the gated output RMSNorm's eps (Qwen: rms_norm_eps; OLMo-hybrid: 1e-5
    whatever its rms_norm_eps, as FLA's FusedRMSNormGated), `neg_eigval` OLMo-hybrid's
    linear_allow_neg_eigval (beta = 2 sigmoid(b), in [0, 2]: the state's eigenvalues may turn
    negative), `activation` the conv's (transformers applies `hidden_act`; SiLU only, as Mamba's),
    `norm_dtype_order` where the gated norm applies its weight: "cast_then_scale" after the cast back, then
    times silu(z) in fp32 (Qwen's RMSNormGated); "scale_then_cast" in fp32, times silu(z) in fp32, one cast
    at the end (LaraMini's)."""

    key_heads: int = 16
    value_heads: int = 32
    key_head_dim: int = 128
    value_head_dim: int = 128
    conv_kernel: int = 4
    norm_eps: float = 1e-6
    neg_eigval: bool = False
    activation: str = "silu"
    norm_dtype_order: str = "cast_then_scale"

    def __post_init__(self) -> None:
        for name in ("key_heads", "value_heads", "key_head_dim", "value_head_dim", "conv_kernel"):
            _setting_count(name, getattr(self, name))
        _setting_number("norm_eps", self.norm_eps, positive=True)
        _setting_flag("neg_eigval", self.neg_eigval)
        _setting_choice("activation", self.activation, ("silu",))
        _setting_choice("norm_dtype_order", self.norm_dtype_order, GATED_NORM_ORDERS)
        if self.value_heads % self.key_heads:
            raise ConfigError(f"ArchConfig.mixer_settings.value_heads={self.value_heads}: must be a multiple of "
                              f"key_heads={self.key_heads} (each key head serves whole value heads)")

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:  # the conv's channels: q | k | v
        return 2 * self.key_dim + self.value_dim

    @property
    def norm_rows(self) -> int:
        """The rows per token the gated norm normalises (one per value head), as both sides flatten them."""
        return self.value_heads

    @property
    def sizes(self) -> dict[str, int]:
        """The sizes a family's tensor table names (mappings/family.py's tensor_sizes): per key head, its
        q and k rows and the rows of the value heads it serves (Qwen3-Next stores them per key head)."""
        per_key = self.value_heads // self.key_heads
        return {"key_heads": self.key_heads, "key_head_dim": self.key_head_dim, "heads_per_key": per_key,
                "values_per_key": per_key * self.value_head_dim, "qkv": self.conv_dim, "values": self.value_dim,
                "key_dim": self.key_dim,
                "value_heads": self.value_heads}


def _gated_deltanet_parts(cfg: ArchConfig) -> dict[str, Part]:
    """Qwen3.5's layout and names (Qwen3_5GatedDeltaNet): its own parameters first, dt_bias and A_log
    (one per value head); in_proj_qkv, whose rows [q | k | v] are the conv's channels; the output
    gate in_proj_z; beta's in_proj_b and the decay's in_proj_a; conv1d; the gated RMSNorm over one
    value head (a plain weight, applied where `norm_dtype_order` says); out_proj. No biases."""
    s, d = cfg.mixer_settings, cfg.d_model
    gated_norm = replace(cfg.norm, kind="rms", eps=s.norm_eps, weight=True, bias=False, weight_offset=0.0,
                         dtype_order=s.norm_dtype_order, written_out=False)
    parts: dict[str, Part] = {"dt_bias": ParamPart((s.value_heads,)), "A_log": ParamPart((s.value_heads,)),
                              "in_proj_qkv": LinearPart(d, s.conv_dim), "in_proj_z": LinearPart(d, s.value_dim),
                              "in_proj_b": LinearPart(d, s.value_heads), "in_proj_a": LinearPart(d, s.value_heads)}
    return parts | {"conv1d": ConvPart(s.conv_dim, s.conv_kernel)} | {
        "norm": NormPart(s.value_head_dim, gated_norm), "out_proj": LinearPart(s.value_dim, d)}


def _gated_deltanet_state(cfg: ArchConfig) -> int:
    """The conv window and the fp32 recurrent state, a key_head_dim x value_head_dim matrix per value head."""
    s = cfg.mixer_settings
    return s.conv_dim * s.conv_kernel + s.value_heads * s.key_head_dim * s.value_head_dim


def _gated_deltanet_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    grouped = "" if s.value_heads == s.key_heads else f" ({s.value_heads // s.key_heads} value heads per key head)"
    beta = "2 sigmoid(b) (negative eigenvalues allowed)" if s.neg_eigval else "sigmoid(b)"
    return [f"mixer: gated delta-net, {s.key_heads} q/k heads x {s.key_head_dim}, {s.value_heads} value heads x "
            f"{s.value_head_dim}{grouped}, conv {s.conv_kernel} on q|k|v, q and k L2-normed",
            f"gated delta-net: decay exp(-exp(A_log) softplus(a + dt_bias)), beta {beta}; chunks of 64 in prefill, "
            f"token by token in decoding; output RMSNorm per value head (eps={s.norm_eps:g}"
            f"{', weight in fp32' if s.norm_dtype_order == 'scale_then_cast' else ''}) times SiLU(z)",
            f"gated delta-net state: {_gated_deltanet_state(cfg)} entries per sequence and layer (conv {s.conv_dim} "
            f"x {s.conv_kernel}, recurrent {s.value_heads} x {s.key_head_dim} x {s.value_head_dim}, fp32)"]


register(MixerKind(
    name="gated_deltanet",
    module=f"{__package__}.gated_deltanet:GatedDeltaNet",
    parts=_gated_deltanet_parts,
    describe=_gated_deltanet_describe,
    state_elements=_gated_deltanet_state,
    settings=GatedDeltaNetSettings,
))


# ----------------------------------------------------------------------------- short_conv: LFM2's gated convolution
@dataclass(frozen=True)
class ShortConvSettings:
    """LFM2's `Lfm2ShortConv`, in Lfm2Config's names: `kernel` is `conv_L_cache`, the depthwise
    convolution's width (and the number of inputs its state keeps), `bias` is `conv_bias`, which
    switches the biases of in_proj, conv and out_proj together."""

    kernel: int = 3
    bias: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.kernel, bool) or not isinstance(self.kernel, int) or self.kernel <= 0:
            raise ConfigError(f"ArchConfig.mixer_settings.kernel={self.kernel!r}: must be a positive integer")
        if not isinstance(self.bias, bool):
            raise ConfigError(f"ArchConfig.mixer_settings.bias={self.bias!r}: must be true or false")


def _short_conv_parts(cfg: ArchConfig) -> dict[str, Part]:
    """transformers' order: conv, in_proj, out_proj (Lfm2ShortConv builds the convolution first)."""
    s, d = cfg.mixer_settings, cfg.d_model
    return {"conv": ConvPart(d, s.kernel, s.bias), "in_proj": LinearPart(d, 3 * d, s.bias),
            "out_proj": LinearPart(d, d, s.bias)}


def _short_conv_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    return [f"short convolution (LFM2): in_proj to B, C, x (3 x {cfg.d_model}); B*x through a depthwise causal "
            f"conv of width {s.kernel}; C times it; out_proj; biases {'on' if s.bias else 'off'}",
            f"short-convolution state: the last {s.kernel} inputs of the conv, {s.kernel * cfg.d_model} entries "
            "per sequence and layer"]


register(MixerKind(
    name="short_conv",
    module=f"{__package__}.short_conv:ShortConv",
    parts=_short_conv_parts,
    describe=_short_conv_describe,
    state_elements=lambda cfg: cfg.mixer_settings.kernel * cfg.d_model,
    settings=ShortConvSettings,
))


# ----------------------------------------------------------------------------- kimi_delta: Kimi Linear's KDA
@dataclass(frozen=True)
class KimiDeltaSettings:
    """Kimi delta attention (Kimi Linear's `linear_attention` layers, `arch/kimi_delta.py`), in
    KimiLinearConfig's names: `heads` linear_num_heads and `head_dim` linear_head_dim (q, k and v alike:
    no grouping), `conv_kernel` linear_conv_kernel_dim (the depthwise causal conv over q | k | v),
    `norm_eps` the gated output RMSNorm's eps (rms_norm_eps), `activation` the conv's (`hidden_act`;
    SiLU only). What Ling 3 (bailing_hybrid's BailingHybridDeltaAttention) does otherwise:
    `gate_projections` "low_rank" (Kimi: the forget gate f_b_proj(f_a_proj(x)) and the output gate
    g_b_proj(g_a_proj(x)), through head_dim) or "full" (Ling: one f_proj, one g_proj); `forget_gate`
    "softplus" (Kimi: -exp(A_log) * where(g > 20, g, log(1 + exp(g))), left in fp32), "bounded" (Ling's
    kda_safe_gate: gate_lower_bound * sigmoid(exp(A_log) * g)) or "softplus_cast" (Ling without it:
    -exp(A_log) * F.softplus(g)), Ling's two cast to the activation dtype; `fp32_kept` "dt_bias" (Kimi's
    `_keep_in_fp32_modules_strict`) or "dt_bias+A_log+conv1d" (Ling's: the conv then runs in fp32)."""

    heads: int = 32
    head_dim: int = 128
    conv_kernel: int = 4
    norm_eps: float = 1e-5
    activation: str = "silu"
    gate_projections: str = "low_rank"
    forget_gate: str = "softplus"
    gate_lower_bound: float = -5.0
    fp32_kept: str = "dt_bias"

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "conv_kernel"):
            _setting_count(name, getattr(self, name))
        _setting_number("norm_eps", self.norm_eps, positive=True)
        _setting_choice("activation", self.activation, ("silu",))
        _setting_choice("gate_projections", self.gate_projections, ("low_rank", "full"))
        _setting_choice("forget_gate", self.forget_gate, ("softplus", "bounded", "softplus_cast"))
        _setting_number("gate_lower_bound", self.gate_lower_bound)
        _setting_choice("fp32_kept", self.fp32_kept, ("dt_bias", "dt_bias+A_log+conv1d"))

    @property
    def dim(self) -> int:  # each of q, k, v
        return self.heads * self.head_dim


def _kimi_delta_parts(cfg: ArchConfig) -> dict[str, Part]:
    """KimiLinearDeltaAttention's names and order: q_proj, k_proj, v_proj; conv1d over [q | k | v]
    (the checkpoints' q_conv1d, k_conv1d, v_conv1d stacked); the forget gate's dt_bias (one per key
    channel) and A_log (one per head), its low-rank f_a_proj, f_b_proj; beta's b_proj; the output
    gate's low-rank g_a_proj, g_b_proj; the gated RMSNorm's weight over one head; o_proj. No biases."""
    s, d = cfg.mixer_settings, cfg.d_model
    qkv = {"q_proj": LinearPart(d, s.dim), "k_proj": LinearPart(d, s.dim), "v_proj": LinearPart(d, s.dim),
           "conv1d": ConvPart(3 * s.dim, s.conv_kernel)}
    if s.gate_projections == "full":  # BailingHybridDeltaAttention's names and order
        return qkv | {"forget_gate.A_log": ParamPart((s.heads,)), "forget_gate.dt_bias": ParamPart((s.dim,)),
                      "forget_gate.f_proj": LinearPart(d, s.dim), "b_proj": LinearPart(d, s.heads),
                      "o_norm.weight": ParamPart((s.head_dim,)), "o_proj": LinearPart(s.dim, d),
                      "g_proj": LinearPart(d, s.dim)}
    return qkv | {"forget_gate.dt_bias": ParamPart((s.dim,)), "forget_gate.A_log": ParamPart((s.heads,)),
                  "forget_gate.f_a_proj": LinearPart(d, s.head_dim),
                  "forget_gate.f_b_proj": LinearPart(s.head_dim, s.dim), "b_proj": LinearPart(d, s.heads),
                  "g_a_proj": LinearPart(d, s.head_dim), "g_b_proj": LinearPart(s.head_dim, s.dim),
                  "o_norm.weight": ParamPart((s.head_dim,)), "o_proj": LinearPart(s.dim, d)}


def _kimi_delta_state(cfg: ArchConfig) -> int:
    """The conv window and the fp32 recurrent state, a head_dim x head_dim matrix per head."""
    s = cfg.mixer_settings
    return 3 * s.dim * s.conv_kernel + s.heads * s.head_dim * s.head_dim


def _kimi_delta_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.mixer_settings
    f, g = ("f_b(f_a(x))", "g_b(g_a(x))") if s.gate_projections == "low_rank" else ("f(x)", "g(x)")
    decay = {"softplus": f"exp(-exp(A_log) softplus({f} + dt_bias))",
             "softplus_cast": f"exp(-exp(A_log) softplus({f} + dt_bias)), cast to the activation dtype",
             "bounded": f"exp({s.gate_lower_bound:g} sigmoid(exp(A_log) ({f} + dt_bias))), cast to the activation "
                        "dtype"}[s.forget_gate]
    return [f"mixer: Kimi delta attention, {s.heads} heads x {s.head_dim}, conv {s.conv_kernel} on q|k|v, "
            "q and k L2-normed" + (", conv and A_log kept in fp32" if s.fp32_kept != "dt_bias" else ""),
            f"Kimi delta attention: decay per key channel {decay}, beta "
            "sigmoid(b); chunks of 64 in prefill, token by token in decoding; output RMSNorm per head "
            f"(eps={s.norm_eps:g}, weight in fp32) times sigmoid({g})",
            f"Kimi delta attention state: {_kimi_delta_state(cfg)} entries per sequence and layer (conv {3 * s.dim} "
            f"x {s.conv_kernel}, recurrent {s.heads} x {s.head_dim} x {s.head_dim}, fp32)"]


register(MixerKind(
    name="kimi_delta",
    module=f"{__package__}.kimi_delta:KimiDeltaAttention",
    parts=_kimi_delta_parts,
    describe=_kimi_delta_describe,
    state_elements=_kimi_delta_state,
    settings=KimiDeltaSettings,
))
