"""Each point's layout, declared on both sides, and the one conversion between them.

The same values may sit in different layouts on the two sides: Gemma 3's transformers module
normalises q and k per head after moving heads before time (B, H, T, D), where our decoder does it
before (B, T, H, D). Such a difference is declared here, per point kind and, on transformers'
side, per model type where its module differs from the llama-style default; the reference's
value is converted to our layout by that declaration alone. Nothing is inferred from shapes: a
guess (say, the permutation closest to ours) picks the wrong axes whenever two sizes repeat
(T == head_dim), and then a real transposition compares equal. A value whose shape does not fit
its declaration raises PointLayoutError, which the comparison reports as a failed point that could
not be compared: verify cannot vouch for it, so it does not pass.

A layout names its axes in order; `*` joins axes flattened into one dimension; a last dimension
written as segments joined by `|` is a fused output (Phi-3's qkv_proj, [q | k | v]), of which the
bracketed segment is the point's value:
B batch, T time, d d_model, E the embedding width (d_model, but for OPT-350m's projection), F d_ff,
H query heads, KV key/value heads, D head_dim, P the pieces of a fused projection, X experts, S a shared
expert's width; for latent
attention (MLA) Q q_lora_rank, C kv_lora_rank, QK a query/key head (qk_nope_head_dim + head_dim),
CR the joint latent (C + head_dim), NV a head's expanded key and value (qk_nope_head_dim +
v_head_dim), and `one` the single latent "head" both sides expand from; for a mixture of attention
heads XA its experts and R its (token, slot) rows, sorted by expert.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from lmconvert.arch import ArchConfig
from lmconvert.arch.mixer_kinds import mixer_kind
from lmconvert.arch.parts import ConvPart, LinearPart, NormPart
from lmconvert.mappings import FAMILIES
from lmconvert.mappings.tables.points import LATENT, RESIDUAL, SPARSE, Layout, Parallel, Piece, Returned, Summed

from .trace import layer_of, sublayer_of

EXPERT = re.compile(r"^mlp\.experts\.\d+$")

# A mixture of experts (arch/moe.py) runs on the tokens flattened, as transformers' does: the
# router's logits over the X experts, the routed experts' weighted sum (and each expert alone on
# every token, `mlp.experts.{e}`, of kind "mlp.expert"), the shared expert (width S) and its
# one-column gate. The same on both sides.
MOE: Mapping[str, Layout] = {
    "mlp.router": "B*T X", "mlp.experts": "B*T d", "mlp.expert": "B*T d", "mlp.shared.gate": "B*T S",
    "mlp.shared.up": "B*T S", "mlp.shared.down": "B*T d", "mlp.shared_gate": "B*T one",
}

# Our Decoder's points, by kind (`sublayer_of`): every block output, norm and projection is
# (B, T, features); q/k/v stay flat until attention splits the heads.
OURS: Mapping[str, Layout] = {
    "embed": RESIDUAL, "final_norm": "B T E", "output": RESIDUAL,  # final_norm: what the LM head reads
    "attn_norm": RESIDUAL, "attn_post_norm": RESIDUAL, "mlp_norm": RESIDUAL, "mlp_post_norm": RESIDUAL,
    "attn.q": "B T H*D", "attn.k": "B T KV*D", "attn.v": "B T KV*DV", "attn.o": RESIDUAL,
    "attn": RESIDUAL,  # the attention's output, a point where its module holds a tensor of its own (gpt-oss's sinks)
    "mlp.gate": "B T F", "mlp.up": "B T F", "mlp.down": RESIDUAL, **MOE,
    "mlp.norm": RESIDUAL,  # a mixture's output norm (A.X-K1's post_mlp_layernorm), on (B, T, d) as transformers'
    # beside the dense MLP (moe.BesideDense: Gemma 4's): the experts' input norm on the flat tokens, the dense
    # output's norm on (B, T, d), both as transformers' (pre_feedforward_layernorm_2, post_feedforward_layernorm_1)
    "mlp.input_norm": "B*T d", "mlp.dense_norm": RESIDUAL,
    # BitNet's sub-norms (the attention output before `o`, the product before `down`); xIELU's module
    "attn.sub_norm": "B T H*DV", "mlp.sub_norm": "B T F", "mlp.act": "B T F",
    "attn.out_gate": "B T H*DV",  # the attention output gate's projection, before its sigmoid (AFMoE's gate_proj)
}

# Our QK norms, by ArchConfig.qk_norm: per head on the (B, T, H, D) view, or over the whole
# projection before the view ("none" has no QK-norm points).
OURS_QK_NORM: Mapping[str, Mapping[str, Layout]] = {
    "head": {"attn.q_norm": "B T H D", "attn.k_norm": "B T KV D"},
    "projection": {"attn.q_norm": "B T H*D", "attn.k_norm": "B T KV*D"},
}

# a per-head QK norm after RoPE (ArchConfig.qk_norm_after_rope) normalises the rotated (B, H, T, D) heads
OURS_QK_NORM_AFTER_ROPE: Mapping[str, Layout] = {"attn.q_norm": "B H T D", "attn.k_norm": "B KV T D"}

# A mixture of attention heads (arch/head_mixture.py): its router's logits over the XA attention experts; each
# expert's q and o run on the (token, slot) rows sorted by expert, R of them (B * T * top_k), in that order
MIXTURE: Mapping[str, Layout] = {"attn.router": "B*T XA", "attn.q": "R KV*D", "attn.o": "R d"}
OURS_BY_ATTENTION: Mapping[str, Mapping[str, Layout]] = {"latent": LATENT, "sparse": SPARSE, "head_mixture": MIXTURE}

# q emitting each head's output gate beside its query (ArchConfig.attn_output_gate="q_heads", Qwen3-Next): H * 2D
# one gate per head (Laguna's "projection_head"): H wide
OURS_BY_OUTPUT_GATE: Mapping[str, Mapping[str, Layout]] = {"q_heads": {"attn.q": "B T H*QG"},
                                                           "projection_head": {"attn.out_gate": "B T H"}}

# transformers' llama-style decoders: hidden states, norms and nn.Linear projections are
# (B, T, features), as ours. QK norms have no default: each model type that has them says where.
TRANSFORMERS: Mapping[str, Layout] = dict(OURS)

# transformers' layouts where a family's modules differ from the default, keyed by the text config's
# model_type (`config.get_text_config().model_type`), so that Gemma3ForConditionalGeneration and
# Gemma3ForCausalLM share an entry: each family declares its own (`Family.reference_layouts`)
TRANSFORMERS_BY_MODEL_TYPE: dict[str, Mapping[str, Declared] | Callable[[ArchConfig], Mapping]] = {
    model_type: family.reference_layouts for family in FAMILIES.values() for model_type in family.model_types}


def transformers_layouts(model_type: str, arch: ArchConfig) -> Mapping[str, Declared]:
    """transformers' layouts for this model: the default, and where the family's modules differ."""
    own = TRANSFORMERS_BY_MODEL_TYPE.get(model_type, {})
    return {**TRANSFORMERS, **(own(arch) if callable(own) else own)}


def _latent_sizes(arch: ArchConfig) -> dict[str, int]:
    if arch.attention not in ("latent", "sparse"):
        return {}
    s = arch.attention_settings
    sizes = {"C": s.kv_lora_rank, "QK": s.qk_nope_head_dim + arch.head_dim, "CR": s.kv_lora_rank + arch.head_dim,
             "NV": s.qk_nope_head_dim + s.v_head_dim, "one": 1}
    if s.q_lora_rank is not None:
        sizes["Q"] = s.q_lora_rank
    if arch.attention == "sparse":
        sizes.update(IH=s.index_n_heads, ID=s.index_head_dim)
    return sizes


def _mixture_sizes(arch: ArchConfig, tokens: int) -> dict[str, int]:
    if arch.attention != "head_mixture":
        return {}
    return {"XA": arch.attention_settings.n_experts, "R": tokens * arch.attention_settings.top_k}


def _mixer_points(arch: ArchConfig) -> tuple[dict[str, Layout], dict[str, int]]:
    """A mixer kind's points (`mixer_kinds`), from its declared parts, the same on both sides unless a
    family declares transformers' otherwise: a linear or a norm outputs (B, T, its width), a
    depthwise convolution (B, channels, T). Each part's width is an axis of its own, `mixer.<part>`;
    the mixer's own point (where a parameter of its own, as dt_bias, names it) is its output (B, T, d)."""
    if not arch.layers_mixed_by("mixer"):
        return {}, {}
    layouts: dict[str, Layout] = {"mixer": "B T d"}
    sizes: dict[str, int] = {}
    for name, part in mixer_kind(arch.mixer).parts(arch).items():
        axis = f"mixer.{name}"
        if isinstance(part, LinearPart):
            layouts[axis], sizes[axis] = f"B T {axis}", part.d_out
        elif isinstance(part, NormPart):
            layouts[axis], sizes[axis] = f"B T {axis}", part.dim if isinstance(part.dim, int) else part.dim[-1]
            rows = getattr(arch.mixer_settings, "norm_rows", None)  # several rows per token, normed each, flattened
            if rows:
                layouts[axis], sizes[f"{axis}.rows"] = f"B*T*{axis}.rows {axis}", rows
        elif isinstance(part, ConvPart):
            layouts[axis], sizes[axis] = f"B {axis} T", part.channels
    return layouts, sizes


def _augment_points(arch: ArchConfig) -> tuple[dict[str, Layout], dict[str, int]]:
    """Gemma 3n's points, the same on both sides: with AltUp the embedding and every block's output are the streams
    (AS of them, first) and a block's altup module its scaled active stream, its correction and prediction
    coefficients (AS, AS2 = AS * AS) per token; LAuReL's rank LR; the per-layer embedding's gate PD wide."""
    layouts: dict[str, Layout] = {}
    sizes: dict[str, int] = {}
    if arch.altup is not None:
        layouts.update({"embed": "AS B T d", "output": "AS B T d", "altup": RESIDUAL, "altup.correction": "B T AS",
                        "altup.prediction": "B T AS2", "altup.router": "B T AS", "altup.router_norm": RESIDUAL})
        sizes.update(AS=arch.altup.n_inputs, AS2=arch.altup.n_inputs ** 2)
    if arch.laurel_rank is not None:
        layouts.update({"laurel.left": "B T LR", "laurel.right": RESIDUAL, "laurel.norm": RESIDUAL})
        sizes["LR"] = arch.laurel_rank
    if arch.ple is not None:
        layouts.update({"ple.gate": "B T PD", "ple.proj": RESIDUAL, "ple.norm": RESIDUAL})
        sizes["PD"] = arch.ple.dim
    if arch.shared_blocks is not None:  # Zamba2: each call's linear (its output, compared), its adapters (unobserved)
        layouts["shared.linear"] = RESIDUAL
        for proj in ("q", "k", "v"):
            layouts |= {f"shared.{proj}_adapter.0": "B T AR", f"shared.{proj}_adapter.1": "B T A2"}
        layouts |= {"shared.gate_up_adapter.0": "B T AR", "shared.gate_up_adapter.1": "B T GU"}
        sizes.update(AR=arch.shared_blocks.adapter_rank or 0, A2=2 * arch.d_model, GU=2 * arch.d_ff)
    return layouts, sizes


def unobserved(arch: ArchConfig) -> dict[str, str]:
    """The point kinds of this model that verify cannot compare, and why: declared here, so that a report without
    them is not taken for a broken table (tests/test_verify_localize.py)."""
    out: dict[str, str] = {}
    if arch.altup is not None:
        twice = "runs twice per block (AltUp's predict and correct): no single output (trace.Recorder leaves it out)"
        out |= {"altup": "transformers calls Gemma3nTextAltUp.forward directly (scale_corrected_output), past its "
                         "module's hooks", "altup.router": twice, "altup.router_norm": twice}
    if arch.shared_blocks is not None:  # Zamba2: each call's output is compared at `shared.linear`
        why = ("transformers ties a shared block across its calls parameter by parameter, each call running a module "
               "instance of its own (model.layers.{L}.shared_transformer), and the checkpoint names every call's "
               "adapters under the block's first caller, whose instance the later calls never run: no output to pair")
        names = ("q", "k", "v", "gate_up") if arch.shared_blocks.attn_adapters else \
            ("gate_up",) if arch.shared_blocks.adapter_rank is not None else ()
        out |= {f"shared.{p}_adapter.{i}": why for p in names for i in (0, 1)}
    return out


def _moe_sizes(arch: ArchConfig) -> dict[str, int]:
    moe = arch.moe
    return {} if moe is None else {"X": moe.n_experts, "S": moe.d_shared or 0, "one": 1}


Declared = Layout | Piece | Summed | Returned | Parallel  # what a family may declare for a point of transformers'


class PointLayoutError(ValueError):
    """A value that does not fit its declared layout, or a point kind with none declared."""


def _groups(layout: Layout) -> list[list[str]]:
    return [group.split("*") for group in layout.split()]


def shape_of(layout: Layout, sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(sizes[axis] for axis in group) for group in _groups(layout))


def _segment(value: torch.Tensor, source: Layout, sizes: Mapping[str, int]) -> tuple[torch.Tensor, Layout]:
    """A fused last dimension ("B T [H*D]|KV*D|KV*D"): the bracketed segment's slice and layout."""
    head, _, last = source.rpartition(" ")
    if "|" not in last:
        return value, source
    segments = last.split("|")
    lengths = [shape_of(s.strip("[]"), sizes)[0] for s in segments]
    chosen = next(i for i, s in enumerate(segments) if s.startswith("["))
    if value.shape[-1] != sum(lengths):
        raise PointLayoutError(f"shape {tuple(value.shape)} does not end in {sum(lengths)}, "
                               f"its declared layout {source}")
    return value.narrow(-1, sum(lengths[:chosen]), lengths[chosen]), f"{head} {segments[chosen].strip('[]')}"


def convert(value: torch.Tensor, source: Layout, target: Layout, sizes: Mapping[str, int]) -> torch.Tensor:
    """`value`, laid out as `source`, relaid as `target`: the point's segment of a fused output,
    then unflatten, permute, flatten, each step named by the two declarations."""
    value, source = _segment(value, source, sizes)
    expected = shape_of(source, sizes)
    if tuple(value.shape) != expected:
        raise PointLayoutError(f"shape {tuple(value.shape)} is not {expected}, its declared layout {source}")
    axes = [axis for group in _groups(source) for axis in group]
    wanted = [axis for group in _groups(target) for axis in group]
    if sorted(axes) != sorted(wanted) or len(set(axes)) != len(axes):
        raise PointLayoutError(f"the declared layouts {source} and {target} do not name the same axes once each")
    atoms = value.reshape([sizes[axis] for axis in axes])
    return atoms.permute([axes.index(axis) for axis in wanted]).reshape(shape_of(target, sizes))


def summed(value: torch.Tensor, declared: Summed, sizes: Mapping[str, int]) -> tuple[torch.Tensor, Layout]:
    """The sum over the declared axis, in its order, and the layout without it."""
    expected = shape_of(declared.layout, sizes)
    if tuple(value.shape) != expected:
        raise PointLayoutError(f"shape {tuple(value.shape)} is not {expected}, its declared layout {declared.layout}")
    axes = [axis for group in _groups(declared.layout) for axis in group]
    total = value.reshape([sizes[axis] for axis in axes]).sum(axes.index(declared.axis))
    rest = " ".join("*".join(a for a in group if a != declared.axis) for group in _groups(declared.layout))
    return total.reshape(shape_of(rest, sizes)), rest


def take_piece(value: torch.Tensor, piece: Piece, sizes: Mapping[str, int]) -> tuple[torch.Tensor, Layout]:
    """The piece a point is, and its layout: the fused layout without the piece axis."""
    expected = shape_of(piece.layout, sizes)
    if tuple(value.shape) != expected:
        raise PointLayoutError(f"shape {tuple(value.shape)} is not {expected}, its declared layout {piece.layout}")
    axes = [axis for group in _groups(piece.layout) for axis in group]
    picked = value.reshape([sizes[axis] for axis in axes]).select(axes.index(piece.axis), piece.index)
    rest = " ".join("*".join(a for a in group if a != piece.axis) for group in _groups(piece.layout))
    return picked.reshape(shape_of(rest, sizes)), rest


@dataclass(frozen=True)
class PointLayouts:
    """Both sides' declared layouts for one model and token batch, and the sizes of their axes."""

    ours: Mapping[str, Layout]
    theirs: Mapping[str, Declared]
    sizes: Mapping[str, int]
    model_type: str
    # the layers whose heads, head_dim or FFN width differ from the model's (Gemma 4's global and KV-shared layers):
    # their sizes, from ArchConfig.layer_config
    layer_sizes: Mapping[int, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, arch: ArchConfig, model_type: str, batch: int, seq_len: int) -> PointLayouts:
        ours = {**OURS, **OURS_QK_NORM.get(arch.qk_norm, {}),
                **(OURS_QK_NORM_AFTER_ROPE if arch.qk_norm_after_rope else {}),
                **OURS_BY_ATTENTION.get(arch.attention, {}), **OURS_BY_OUTPUT_GATE.get(arch.attn_output_gate, {})}
        mixer, mixer_sizes = _mixer_points(arch)
        augment, augment_sizes = _augment_points(arch)
        ours = {**ours, **mixer, **augment}
        theirs = {**mixer, **transformers_layouts(model_type, arch), **augment}
        sizes = {**mixer_sizes, **augment_sizes, "B": batch, "T": seq_len, "d": arch.d_model, "E": arch.embed_dim,
                 "F": arch.d_ff, "H": arch.n_heads, "KV": arch.n_kv_heads, "D": arch.head_dim, "DV": arch.value_dim,
                 "QG": 2 * arch.head_dim, "P": 3,
                 **_latent_sizes(arch), **_moe_sizes(arch), **_mixture_sizes(arch, batch * seq_len)}
        layer_sizes = {}
        for i in range(arch.n_layers):  # Gemma 4, MiMo-V2-Flash, Laguna: a layer of its own geometry or FFN width
            layer = arch.layer_config(i)
            own = {"H": layer.n_heads, "KV": layer.n_kv_heads, "D": layer.head_dim, "DV": layer.value_dim,
                   "QG": 2 * layer.head_dim, "F": layer.d_ff}
            if any(sizes[k] != v for k, v in own.items()):
                layer_sizes[i] = {**sizes, **own}
        return cls(ours, theirs, sizes, model_type, layer_sizes)

    def to_ours(self, point: str, value: torch.Tensor) -> torch.Tensor:
        """transformers' value at `point`, in our layout."""
        kind = EXPERT.sub("mlp.expert", sublayer_of(point))  # every expert's point is of one kind
        if kind not in self.theirs:
            raise PointLayoutError(f"{point}: no layout is declared for transformers' {self.model_type} {kind}; "
                              "declare it in lmconvert/verify/layouts.py")
        if kind not in self.ours:
            raise PointLayoutError(f"{point}: no layout is declared for our {kind}; declare it in "
                              "lmconvert/verify/layouts.py")
        sizes = self.layer_sizes.get(layer_of(point), self.sizes)
        try:
            theirs = self.theirs[kind]
            if isinstance(theirs, (Returned, Parallel)):  # the recorder kept the tuple's entry; the mixture's output
                theirs = theirs.layout
            if isinstance(theirs, Piece):
                value, theirs = take_piece(value, theirs, sizes)
            elif isinstance(theirs, Summed):
                value, theirs = summed(value, theirs, sizes)
            return convert(value, theirs, self.ours[kind], sizes)
        except PointLayoutError as exc:
            raise PointLayoutError(f"{point}: transformers' ({self.model_type}) output does not fit: {exc}") from None

    def all_to_ours(self, points: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """(the points in our layout, {point: why it could not be converted})."""
        converted, problems = {}, {}
        for point, value in points.items():
            try:
                converted[point] = self.to_ours(point, value)
            except PointLayoutError as exc:
                problems[point] = str(exc)
        return converted, problems
