"""The tensor inventory of the canonical decoder, computed from an ArchConfig without torch.

Checking a checkpoint's tensor names and shapes against what its ArchConfig implies is the first
step of every conversion. Building `Decoder(cfg)` on the meta device answers that exactly, but
importing torch costs more than a whole raw-copy conversion, so this module restates the
Decoder's parameter layout in plain Python: the same names, in `state_dict()` order, with the
same shapes. An attention or mixer kind's tensors are not restated: they come from the parts its
declaration lists (`attention_kinds`, `mixer_kinds`), which its module attaches; `layer_mixers` and
`layer_ffns` say which a layer has. The Decoder stays the truth;
`tests/test_arch_shapes.py` holds this file to it over every variant ArchConfig allows, so a change
to the modules that is not mirrored here fails there.

Imports: the standard library and torch-free `arch` modules only (`block`, `attention` and the rest
import torch).
"""

from __future__ import annotations

from .attention_kinds import attention_kind
from .config import ACTIVATION_PARAMETERS, PARALLEL_MIXING, ArchConfig
from .mixer_kinds import mixer_kind
from .parts import LinearPart, NormPart, Part, Shapes, part_shapes

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


def norm_slots(cfg: ArchConfig, layer: int) -> tuple[str, ...]:
    """The norm slots one layer fills: its placement's (a mixer layer's `mixer_norm_placement` where
    set), but for the attention norm of a layer in
    `unnormed_attn_layers` (ModernBERT decoder's layer 0), and none around a sublayer the layer has
    not (`layer_mixers`, `layer_ffns`: a Nemotron-H block is one sublayer and its norm)."""
    mixer_placement = cfg.mixer_norm_placement if cfg.layer_mixers[layer] == "mixer" else None
    slots = NORM_SLOTS[mixer_placement or cfg.norm_placement]
    if layer in cfg.unnormed_attn_layers:
        slots = tuple(s for s in slots if s != "attn_norm")
    if cfg.layer_mixers[layer] == "none":
        slots = tuple(s for s in slots if not s.startswith("attn_"))
    if cfg.layer_ffns[layer] == "none":
        slots = tuple(s for s in slots if not s.startswith("mlp_"))
    return slots


def mixer_parts(cfg: ArchConfig, layer: int) -> list[tuple[str, dict[str, Part]]]:
    """The modules that mix one layer's tokens, as the attribute each is held under and its parts, in the
    Block's order: ("attn", the attention kind's), ("mixer", the mixer kind's), both for a parallel layer
    ("attention+mixer"), or none."""
    mixing = cfg.layer_mixers[layer]
    modules = []
    if mixing in ("attention", PARALLEL_MIXING):
        modules.append(("attn", attention_kind(cfg.attention).parts(cfg.layer_config(layer))))
    if mixing in ("mixer", PARALLEL_MIXING):
        modules.append(("mixer", mixer_kind(cfg.mixer).parts(cfg)))
    return modules


def _mlp(cfg: ArchConfig, name: str, width: int | None = None, bias: bool | None = None) -> Shapes:
    """Optional gate, then up and down; one bias switch for all three (`mlp_bias` unless `bias` says).
    `width`: an expert's."""
    d_ff = cfg.d_ff if width is None else width
    bias = cfg.mlp_bias if bias is None else bias
    up, down = LinearPart(cfg.d_model, d_ff, bias), LinearPart(d_ff, cfg.d_model, bias)
    shapes = up.shapes(f"{name}.gate") if cfg.gated else {}
    shapes.update(up.shapes(f"{name}.up"))
    shapes.update(down.shapes(f"{name}.down"))
    if cfg.sub_norms:
        shapes.update(NormPart(d_ff, cfg.norm).shapes(f"{name}.sub_norm"))
    for param, shape in ACTIVATION_PARAMETERS.get(cfg.activation, {}).items():
        shapes[f"{name}.act.{param}"] = shape
    return shapes


def _ffn(cfg: ArchConfig, layer: int, name: str) -> Shapes:
    """The dense MLP, or on a sparse layer the mixture of experts (arch/moe.py): the router, each
    expert one at a time (so conversion streams them), then the shared expert and its gate."""
    moe = cfg.moe
    if moe is None or not moe.sparse(layer):
        return _mlp(cfg, name)
    shapes = _mlp(cfg, name) if moe.beside_dense else {}  # moe.BesideDense: the dense MLP's own, first
    shapes.update(LinearPart(cfg.d_model, moe.n_experts, moe.router_bias).shapes(f"{name}.router"))
    if moe.selection_bias:
        shapes[f"{name}.router.selection_bias"] = (moe.n_experts,)
    if moe.router_norm:
        shapes[f"{name}.router.scale"] = (cfg.d_model,)
    if moe.expert_scale:
        shapes[f"{name}.router.expert_scale"] = (moe.n_experts,)
    if moe.sum_bias:  # the experts module's own tensor, before its experts'
        shapes[f"{name}.experts.bias"] = (cfg.d_model,)
    for e in range(moe.n_experts):
        shapes.update(_mlp(cfg, f"{name}.experts.{e}", moe.d_expert, moe.expert_bias))
    if moe.d_shared is not None:
        shapes.update(_mlp(cfg, f"{name}.shared", moe.d_shared))
    if moe.shared == "gated":
        shapes.update(LinearPart(cfg.d_model, 1).shapes(f"{name}.shared_gate"))
    norms = ("input_norm", "dense_norm", "norm") if moe.beside_dense else ("norm",) if moe.output_norm else ()
    for norm in norms:
        shapes.update(NormPart(cfg.d_model, cfg.norm).shapes(f"{name}.{norm}"))
    return shapes


def _block(cfg: ArchConfig, layer: int, name: str) -> Shapes:
    filled, norm = norm_slots(cfg, layer), NormPart(cfg.d_model, cfg.norm)
    # Gemma 4's scalar: the block's own parameter, so first in its state_dict
    shapes: Shapes = {f"{name}.scalar": (1,)} if cfg.layer_scalar else {}
    for slot in SLOTS:
        if slot in filled:
            shapes.update(norm.shapes(f"{name}.{slot}"))
    for module, parts in mixer_parts(cfg, layer):  # its kind's parts, the very ones its module attaches
        shapes.update(part_shapes(parts, f"{name}.{module}"))
    if cfg.layer_ffns[layer] == "ffn":  # its own width (Gemma 4's shared layers)
        shapes.update(_ffn(cfg.layer_config(layer), layer, f"{name}.mlp"))
    shapes.update(_gemma3n_block(cfg, name))
    if cfg.shared_blocks is not None and layer in cfg.shared_blocks.layers:
        shapes.update(_shared_call(cfg, f"{name}.shared"))
    return shapes


def shared_attention_parts(cfg: ArchConfig) -> dict[str, Part]:
    """A shared block's attention parts (Zamba2): the standard kind's, reading 2 d_model, `o` back to d_model."""
    wide = cfg.shared_attention_config()
    parts = dict(attention_kind(wide.attention).parts(wide))
    parts["o"] = LinearPart(wide.o_dim, cfg.d_model, wide.o_bias)
    return parts


def _adapter(d_in: int, rank: int, d_out: int, name: str) -> Shapes:
    return {**LinearPart(d_in, rank).shapes(f"{name}.0"), **LinearPart(rank, d_out).shapes(f"{name}.1")}


def _shared_call(cfg: ArchConfig, name: str) -> Shapes:
    """A layer's call of a shared block (arch/shared_blocks.SharedCall): its adapters, then its linear."""
    shared, d, shapes = cfg.shared_blocks, cfg.d_model, {}
    if shared.attn_adapters:
        for proj in ("q", "k", "v"):
            shapes.update(_adapter(2 * d, shared.adapter_rank, 2 * d, f"{name}.{proj}_adapter"))
    if shared.adapter_rank is not None:
        shapes.update(_adapter(d, shared.adapter_rank, 2 * cfg.d_ff, f"{name}.gate_up_adapter"))
    shapes.update(LinearPart(d, d).shapes(f"{name}.linear"))
    return shapes


def _shared_block(cfg: ArchConfig, name: str) -> Shapes:
    """One shared block (arch/shared_blocks.SharedBlock): its norms, attention and fused-gate FFN."""
    shapes = NormPart(2 * cfg.d_model, cfg.norm).shapes(f"{name}.attn_norm")
    shapes.update(part_shapes(shared_attention_parts(cfg), f"{name}.attn"))
    shapes.update(NormPart(cfg.d_model, cfg.norm).shapes(f"{name}.mlp_norm"))
    if cfg.shared_blocks.fused_gate_up:
        shapes.update(LinearPart(cfg.d_model, 2 * cfg.d_ff, cfg.mlp_bias).shapes(f"{name}.mlp.gate_up"))
    else:
        for proj in ("gate", "up"):
            shapes.update(LinearPart(cfg.d_model, cfg.d_ff, cfg.mlp_bias).shapes(f"{name}.mlp.{proj}"))
    shapes.update(LinearPart(cfg.d_ff, cfg.d_model, cfg.mlp_bias).shapes(f"{name}.mlp.down"))
    return shapes


def _gemma3n_block(cfg: ArchConfig, name: str) -> Shapes:
    """A block's AltUp (arch/altup.py), LAuReL and per-layer-embedding gate (arch/ple.py), in that order."""
    d, shapes = cfg.d_model, {}
    norm = NormPart(d, cfg.norm)
    if cfg.altup is not None:
        n = cfg.altup.n_inputs
        shapes[f"{name}.altup.correct_scale"] = (d,)
        shapes.update(LinearPart(n, n).shapes(f"{name}.altup.correction"))
        shapes.update(LinearPart(n, n * n).shapes(f"{name}.altup.prediction"))
        shapes.update(LinearPart(d, n).shapes(f"{name}.altup.router"))
        shapes.update(norm.shapes(f"{name}.altup.router_norm"))
    if cfg.laurel_rank is not None:
        shapes.update(LinearPart(d, cfg.laurel_rank).shapes(f"{name}.laurel.left"))
        shapes.update(LinearPart(cfg.laurel_rank, d).shapes(f"{name}.laurel.right"))
        shapes.update(norm.shapes(f"{name}.laurel.norm"))
    if cfg.ple is not None:
        shapes.update(LinearPart(d, cfg.ple.dim).shapes(f"{name}.ple.gate"))
        shapes.update(LinearPart(cfg.ple.dim, d).shapes(f"{name}.ple.proj"))
        shapes.update(norm.shapes(f"{name}.ple.norm"))
    return shapes


def _streams(cfg: ArchConfig, name: str) -> Shapes:
    """AltUp's projections of the streams in or out (arch/altup.py), `{name}.proj.{i}`."""
    shapes: Shapes = {}
    for i in range(cfg.altup.n_inputs - 1):
        shapes.update(LinearPart(cfg.d_model, cfg.d_model).shapes(f"{name}.proj.{i}"))
    return shapes


def parameter_shapes(cfg: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor in `Decoder(cfg).state_dict()`, in that order, with its shape.

    The Decoder has no buffers (RoPE tables are plain attributes), and the shared T5 relative-bias
    table is registered once, as `rel_bias`, not under each layer that uses it.
    """
    shapes: Shapes = {"embed.weight": (cfg.vocab_size, cfg.embed_dim)}
    if cfg.projects_embeddings:
        shapes.update(LinearPart(cfg.embed_dim, cfg.d_model).shapes("project_in"))
    if cfg.absolute_positions == "learned":
        shapes["pos_embed.weight"] = (cfg.max_positions + cfg.position_offset, cfg.d_model)
    if cfg.embed_norm:
        shapes.update(NormPart(cfg.d_model, cfg.norm).shapes("embed_norm"))
    if "relative" in cfg.layer_positions:
        shapes["rel_bias.weight"] = (cfg.relative_buckets, cfg.n_heads)
    if cfg.ple is not None:  # arch/ple.py's PerLayerInputs
        wide = cfg.n_layers * cfg.ple.dim
        shapes["ple.embed.weight"] = (cfg.ple.vocab_size, wide)
        shapes.update(LinearPart(cfg.d_model, wide).shapes("ple.project"))
        shapes.update(NormPart(cfg.ple.dim, cfg.norm).shapes("ple.norm"))
    if cfg.altup is not None:
        shapes.update(_streams(cfg, "altup_in"))
    for j in range(0 if cfg.shared_blocks is None else cfg.shared_blocks.n_blocks):
        shapes.update(_shared_block(cfg, f"shared_blocks.{j}"))
    for i in range(cfg.n_layers):
        shapes.update(_block(cfg, i, f"layers.{i}"))
    if cfg.altup is not None:
        shapes.update(_streams(cfg, "altup_out"))
    if cfg.final_norm:
        shapes.update(NormPart(cfg.d_model, cfg.norm).shapes("final_norm"))
    if cfg.head_transform is not None:  # decoder.HeadTransform
        shapes.update(LinearPart(cfg.d_model, cfg.d_model, cfg.head_transform_bias).shapes("head_transform.dense"))
        shapes.update(NormPart(cfg.d_model, cfg.norm).shapes("head_transform.norm"))
    if cfg.projects_embeddings:
        shapes.update(LinearPart(cfg.d_model, cfg.embed_dim).shapes("project_out"))
    if not cfg.tie_embeddings:
        shapes.update(LinearPart(cfg.embed_dim, cfg.head_vocab, cfg.lm_head_bias).shapes("lm_head"))
    elif cfg.lm_head_bias:  # a tied head's own bias (decoder.TiedHead)
        shapes["lm_head.bias"] = (cfg.vocab_size,)
    return shapes
