"""Rotary position embeddings: inverse frequencies per scaling type, cos/sin tables, rotation.

Frequencies are computed exactly as transformers computes them (fp32 torch pow, fp32 position
products): cos/sin of large positions are only reproducible to 1e-5 that way. The frequencies are
kept as a plain tensor attribute, not a buffer, so `module.to(bfloat16)` cannot round them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .config import RopeConfig

InvFreq = tuple[torch.Tensor, float]  # (inverse frequencies, attention scaling of cos/sin)


def _base_inv_freq(theta: float | torch.Tensor, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))


def _none(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    return _base_inv_freq(cfg.theta, dim), 1.0


def _linear(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    return _base_inv_freq(cfg.theta, dim) / cfg.factor, 1.0


def _dynamic(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    """NTK-aware base that grows once the sequence passes max_positions. Like transformers, the
    grown base is computed in fp32 tensor maths and the original one in Python floats."""
    if seq_len <= max_positions:
        return _base_inv_freq(cfg.theta, dim), 1.0
    length = torch.tensor(seq_len)
    base = cfg.theta * ((cfg.factor * length / max_positions) - (cfg.factor - 1)) ** (dim / (dim - 2))
    return _base_inv_freq(base, dim), 1.0


def _ntk_alpha(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    """HunYuan's NTK-alpha (transformers' `compute_ntk_alpha_rope_parameters`): the base stretched once,
    theta * alpha ** (d / (d - 2)) in Python floats, whatever the sequence length (checkpoints call it
    "dynamic", but a fixed alpha makes it static)."""
    return _base_inv_freq(cfg.theta * cfg.alpha ** (dim / (dim - 2)), dim), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    factor, original = cfg.factor, cfg.original_max_positions
    attention_factor = cfg.attention_factor
    if attention_factor is None:
        if cfg.mscale and cfg.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, cfg.mscale) / _yarn_mscale(factor, cfg.mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(cfg.theta))

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = cfg.theta ** (torch.arange(0, dim, 2).to(torch.float) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _llama3(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    inv_freq = _base_inv_freq(cfg.theta, dim)
    original = cfg.original_max_positions
    low_wavelen = original / cfg.low_freq_factor
    high_wavelen = original / cfg.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / cfg.factor, inv_freq)
    smooth = (original / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def _longrope(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    """LongRoPE (Phi-3): each frequency divided by its own factor, the short ones while the
    sequence fits in original_max_positions, the long ones once it does not."""
    factors = cfg.long_factor if seq_len > cfg.original_max_positions else cfg.short_factor
    ext = torch.tensor(factors, dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * cfg.theta ** shape), cfg.longrope_attention_factor()


def _proportional(cfg: RopeConfig, dim: int, seq_len: int, max_positions: int) -> InvFreq:
    """Gemma 4's "proportional" RoPE over the whole head (`dim`): the first int(fraction * dim // 2)
    frequencies as the base's over `dim`, the rest 0 (those pairs stay as they are), all divided by factor."""
    angles = int(cfg.fraction * dim // 2)
    rotated = 1.0 / (cfg.theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(torch.float) / dim))
    inv_freq = torch.cat((rotated, torch.zeros(dim // 2 - angles, dtype=torch.float32)))
    return inv_freq / cfg.factor, 1.0


SCALINGS: dict[str, Callable[[RopeConfig, int, int, int], InvFreq]] = {
    "none": _none,
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
    "ntk_alpha": _ntk_alpha,
    "proportional": _proportional,
}


def _grown(cfg: RopeConfig, max_positions: int) -> int:
    """The sequence length past which a scaling's frequencies change (transformers'
    `dynamic_rope_update`, per forward call and for the whole batch): dynamic's base grows past
    max_positions, longrope switches to its long factors past original_max_positions."""
    return max_positions if cfg.scaling == "dynamic" else cfg.original_max_positions


PER_CALL = ("dynamic", "longrope")


class Rotary:
    """Cos/sin for one layer kind; shared by every layer that uses the same RopeConfig."""

    def __init__(self, cfg: RopeConfig, head_dim: int, max_positions: int) -> None:
        self.cfg = cfg
        self.dim = cfg.rotary_dim(head_dim)
        self.max_positions = max_positions
        # the frequencies of a sequence within max_positions (longrope: within the original length)
        within = min(max_positions, cfg.original_max_positions or max_positions)
        with torch.device("cpu"):  # real numbers even when the module is built on the meta device
            self.inv_freq, self.scaling = SCALINGS[cfg.scaling](cfg, self.dim, within, max_positions)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [..., T, rotary_dim] for integer positions [..., T]."""
        inv_freq = self.inv_freq
        if self.cfg.scaling in PER_CALL:  # stateless form of transformers' dynamic_rope_update
            seq_len = int(positions.max()) + 1
            if seq_len > _grown(self.cfg, self.max_positions):
                with torch.device("cpu"):
                    inv_freq, _ = SCALINGS[self.cfg.scaling](self.cfg, self.dim, seq_len, self.max_positions)
        freqs = positions.float()[..., None] * inv_freq.to(positions.device)
        if self.cfg.complex_product:  # transformers' freqs_cis = torch.polar(1, freqs), each pair's twice
            polar = torch.polar(torch.ones_like(freqs), freqs)
            cos, sin = (torch.repeat_interleave(part, 2, dim=-1) for part in (polar.real, polar.imag))
        else:
            half = self.cfg.layout == "half"
            emb = torch.cat((freqs, freqs), dim=-1) if half else torch.repeat_interleave(freqs, 2, dim=-1)
            cos, sin = emb.cos(), emb.sin()
        cos, sin = cos * self.scaling, sin * self.scaling
        if self.cfg.fp32_tables or self.cfg.complex_product:
            return cos, sin
        return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _rotate_half_reversed(x: torch.Tensor) -> torch.Tensor:
    """nanochat's rotate_half, [x2, -x1]: each pair turns by minus its angle (`RopeConfig.reverse`)."""
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], -x[..., :half]), dim=-1)


# (layout, RopeConfig.reverse) -> the rotation
ROTATIONS = {("half", False): _rotate_half, ("interleaved", False): _rotate_pairs,
             ("half", True): _rotate_half_reversed}


def _complex_product(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' DeepSeek-V2 `apply_rotary_emb` on x's pairs, op for op: fp32 complex numbers times
    cos + i sin (the polar tables' even positions), cast back. Not the real ops' sum: where the CPU
    kernel runs scalar (a short contiguous run, as a head's rotary slice is) it fuses a multiply-add."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    angles = torch.complex(cos[..., ::2].float(), sin[..., ::2].float())
    return torch.view_as_real(pairs * angles).flatten(-2).type_as(x)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 upcast: bool = False, complex_product: bool = False, reverse: bool = False) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of x [B, H, T, D]; the rest pass through. `upcast`
    rotates in fp32 and casts back (Cohere's `q.float()`), whatever dtype cos/sin are in;
    `complex_product` (interleaved pairs only) rotates as `RopeConfig.complex_product` says; `reverse`
    turns the other way (`RopeConfig.reverse`)."""
    dim = cos.shape[-1]
    rotated, passed = x[..., :dim], x[..., dim:]
    if complex_product:
        out = _complex_product(rotated, cos, sin)
        return torch.cat((out, passed), dim=-1) if passed.shape[-1] else out
    if upcast:
        rotated = rotated.float()
    out = (rotated * cos + ROTATIONS[layout, reverse](rotated) * sin).to(x.dtype)
    return torch.cat((out, passed), dim=-1) if passed.shape[-1] else out
