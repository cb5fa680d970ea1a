"""The tensor inventory of the canonical decoder, computed from an ArchConfig without torch.

Checking a checkpoint's tensor names and shapes against what its ArchConfig implies is the first
step of every conversion. Building `Decoder(cfg)` on the meta device answers that exactly, but
importing torch costs more than a whole raw-copy conversion, so this module restates the
Decoder's parameter layout in plain Python: the same names, in `state_dict()` order, with the
same shapes. The Decoder stays the truth; `tests/test_arch_shapes.py` holds this file to it over
every variant ArchConfig allows, so a change to the modules that is not mirrored here fails there.

Imports: the standard library, `config` and `errors` only (`block`, `attention` and the rest import torch).
"""

from __future__ import annotations

from collections.abc import Callable

from .config import ArchConfig, NormConfig
from .errors import ConfigError

Shapes = dict[str, tuple[int, ...]]

# A block's norm slots in registration order, and the slots each placement fills (the others are
# parameterless identities). Block reads both from here.
SLOTS = ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm")
NORM_SLOTS: dict[str, tuple[str, ...]] = {
    "pre": ("attn_norm", "mlp_norm"),
    "post": ("attn_norm", "mlp_norm"),
    "sandwich": ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm"),
    "output": ("attn_post_norm", "mlp_post_norm"),
    "parallel_shared": ("attn_norm",),
    "parallel_separate": ("attn_norm", "mlp_norm"),
}


def _linear(name: str, d_in: int, d_out: int, bias: bool) -> Shapes:
    """nn.Linear: weight [out, in], then the optional bias [out]."""
    shapes = {f"{name}.weight": (d_out, d_in)}
    if bias:
        shapes[f"{name}.bias"] = (d_out,)
    return shapes


def _norm(name: str, dim: int, norm: NormConfig) -> Shapes:
    """Norm: optional weight [dim], then optional bias [dim]."""
    present = (("weight", norm.weight), ("bias", norm.bias))
    return {f"{name}.{part}": (dim,) for part, on in present if on}


def _standard_attention(cfg: ArchConfig, name: str) -> Shapes:
    """q, k, v, o projections, then the QK norms: over one head or over the whole projection."""
    shapes = {
        **_linear(f"{name}.q", cfg.d_model, cfg.q_dim, cfg.q_bias),
        **_linear(f"{name}.k", cfg.d_model, cfg.kv_dim, cfg.k_bias),
        **_linear(f"{name}.v", cfg.d_model, cfg.kv_dim, cfg.v_bias),
        **_linear(f"{name}.o", cfg.q_dim, cfg.d_model, cfg.o_bias),
    }
    norm_dims = {"head": (cfg.head_dim, cfg.head_dim), "projection": (cfg.q_dim, cfg.kv_dim)}.get(cfg.qk_norm)
    if norm_dims:
        shapes.update(_norm(f"{name}.q_norm", norm_dims[0], cfg.norm))
        shapes.update(_norm(f"{name}.k_norm", norm_dims[1], cfg.norm))
    return shapes


# Mirrors `attention.ATTENTION`: one shape rule per attention kind the Decoder can build.
ATTENTION: dict[str, Callable[[ArchConfig, str], Shapes]] = {"standard": _standard_attention}


def _mlp(cfg: ArchConfig, name: str) -> Shapes:
    """Optional gate, then up and down; one bias switch for all three."""
    shapes = _linear(f"{name}.gate", cfg.d_model, cfg.d_ff, cfg.mlp_bias) if cfg.gated else {}
    shapes.update(_linear(f"{name}.up", cfg.d_model, cfg.d_ff, cfg.mlp_bias))
    shapes.update(_linear(f"{name}.down", cfg.d_ff, cfg.d_model, cfg.mlp_bias))
    return shapes


def _block(cfg: ArchConfig, name: str) -> Shapes:
    try:
        attention = ATTENTION[cfg.attention]
    except KeyError:
        raise ConfigError(f"ArchConfig.attention={cfg.attention!r}: lmconvert.arch.shapes has no shape rule "
                          f"for this attention kind; add one to its ATTENTION table") from None
    filled = NORM_SLOTS[cfg.norm_placement]
    shapes: Shapes = {}
    for slot in SLOTS:
        if slot in filled:
            shapes.update(_norm(f"{name}.{slot}", cfg.d_model, cfg.norm))
    shapes.update(attention(cfg, f"{name}.attn"))
    shapes.update(_mlp(cfg, f"{name}.mlp"))
    return shapes


def parameter_shapes(cfg: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor in `Decoder(cfg).state_dict()`, in that order, with its shape.

    The Decoder has no buffers (RoPE tables are plain attributes), and the shared T5 relative-bias
    table is registered once, as `rel_bias`, not under each layer that uses it.
    """
    shapes: Shapes = {"embed.weight": (cfg.vocab_size, cfg.d_model)}
    if cfg.absolute_positions == "learned":
        shapes["pos_embed.weight"] = (cfg.max_positions + cfg.position_offset, cfg.d_model)
    if "relative" in cfg.layer_positions:
        shapes["rel_bias.weight"] = (cfg.relative_buckets, cfg.n_heads)
    for i in range(cfg.n_layers):
        shapes.update(_block(cfg, f"layers.{i}"))
    if cfg.final_norm:
        shapes.update(_norm("final_norm", cfg.d_model, cfg.norm))
    if not cfg.tie_embeddings:
        shapes.update(_linear("lm_head", cfg.d_model, cfg.vocab_size, cfg.lm_head_bias))
    return shapes
