"""One transformer block. Norm placement is a config value: each placement fills the four norm
slots it uses (the rest are identities) and picks one of three residual wirings."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .altup import AltUp
from .attention_kinds import attention_kind
from .cache import KVCache
from .config import PARALLEL_MIXING, ArchConfig
from .context import Context
from .mixer_kinds import mixer_kind
from .mlp import SeparateBias
from .moe import ffn
from .norms import Norm
from .ple import PerLayerGate
from .positions import RelativeBias
from .rope import Rotary
from .shapes import SLOTS, norm_slots  # a layer's norm slots (torch-free, so shapes owns them)
from .shared_blocks import SharedCall


def _sequential(b: Block, h: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """Each sublayer in turn; a hybrid's layer may lack one (`attend` or `b.mlp` None: only here,
    ArchConfig refuses the other wirings for such layers)."""
    if b.residual_after_norm:  # BLOOM: the residual is the normed input
        x = b.attn_norm(h)
        h = x + b.scaled(attend(x))
        x = b.mlp_norm(h)
        return x + b.scaled(b.mlp(x))
    if b.residual_fp32:  # each norm reads the stream in its weight's dtype (Mamba2Block), the sums are fp32
        if attend is not None:
            h = h.float() + b.scaled(attend(b.attn_norm(h.to(b.attn_norm.weight.dtype))))
        if b.mlp is not None:
            h = h.float() + b.scaled(b.mlp(b.mlp_norm(h.to(b.mlp_norm.weight.dtype))))
        return h
    if attend is not None:
        x = b.attn_norm(h)
        h = b.add(h, b.attn_post_norm(attend(x)), 0)
        if b.laurel is not None:  # Gemma 3n: LAuReL's branch of the normed input joins, the sum over sqrt(2)
            h = (h + b.laurel(x)) / math.sqrt(2)
    if b.mlp is not None:
        h = b.add(h, b.mlp_post_norm(b.feed(h)), 1)
    return h


def _post(b: Block, h: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    h = b.attn_norm(h + b.scaled(attend(h)))
    return b.mlp_norm(h + b.scaled(b.mlp(h)))


def _parallel(b: Block, h: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    x = b.attn_norm(h)
    y = x if isinstance(b.mlp_norm, nn.Identity) else b.mlp_norm(h)
    return PARALLEL_SUMS[b.parallel_sum](h, b.scaled(attend(x)), b.scaled(b.mlp(y)))


# ArchConfig.parallel_sum -> the sum, in the order the family's reference adds (bf16 rounds each add)
PARALLEL_SUMS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "h+attn+mlp": lambda h, attn, mlp: h + attn + mlp,
    "mlp+attn+h": lambda h, attn, mlp: mlp + attn + h,  # GPT-NeoX, Falcon
    "attn+mlp+h": lambda h, attn, mlp: attn + mlp + h,  # GPT-J, Phi
}


WIRING = {"pre": _sequential, "sandwich": _sequential, "output": _sequential, "post": _post,
          "parallel_shared": _parallel, "parallel_separate": _parallel}


class Conv1D(nn.Linear):
    """GPT-2's Conv1D: `addmm(bias, x2d, W)` with W laid out [in, out] in memory. The weight keeps
    nn.Linear's name and [out, in] shape (the canonical tensor), held as the transposed view of an
    [in, out] tensor once built or loaded. Over the canonical [out, in] layout, oneDNN's bf16 GEMM on
    AVX2 CPUs (and fp16 GEMMs) picks another kernel, whose sums round otherwise; a weight set from
    outside (streamed, tensor-parallel loads) is copied to that layout at each call instead."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.t().contiguous()  # [in, out]: a view once held so, else a copy
        x2d = x.reshape(-1, x.shape[-1])
        out = torch.mm(x2d, w) if self.bias is None else torch.addmm(self.bias, x2d, w)
        return out.view(*x.shape[:-1], w.shape[1])

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - nn.Module's hook
        super()._load_from_state_dict(*args, **kwargs)
        hold_in_out(self)


def hold_in_out(module: nn.Linear) -> None:
    """The weight, same shape and values, laid out [in, out] in memory (a copy only if it is not yet)."""
    w = module.weight
    if not w.t().is_contiguous():
        module.weight = nn.Parameter(w.detach().t().contiguous().t(), requires_grad=w.requires_grad)


# ArchConfig flags -> the forward a block's linears take instead of nn.Linear's (the same parameters)
LINEAR_FORWARDS = (("bias_separate", SeparateBias), ("conv1d_linears", Conv1D))


class Laurel(nn.Module):
    """Gemma3nTextLaurelBlock (`layers.{i}.laurel`): x + norm(right(left(x))), a low-rank residual branch."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.left = nn.Linear(cfg.d_model, cfg.laurel_rank, bias=False)
        self.right = nn.Linear(cfg.laurel_rank, cfg.d_model, bias=False)
        self.norm = Norm(cfg.d_model, cfg.norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.right(self.left(x)))


class Block(nn.Module):
    def __init__(self, cfg: ArchConfig, layer: int, rotary: Rotary | None, relative: RelativeBias | None,
                 shared_blocks: nn.ModuleList | None = None) -> None:
        super().__init__()
        slots = norm_slots(cfg, layer)
        for slot in SLOTS:
            setattr(self, slot, Norm(cfg.d_model, cfg.norm) if slot in slots else nn.Identity())
        # what mixes the tokens (`layer_mixers`): attention as `attn`, a mixer kind's module as `mixer`, or nothing;
        # the one a layer lacks is None, so `layers.{i}.attn.*` and `layers.{i}.mixer.*` name the tensors
        # ("attention+mixer": both, side by side, their outputs summed: `mixing`)
        mixing = cfg.layer_mixers[layer]
        self.attn = attention_kind(cfg.attention).build(cfg, layer, rotary, relative) \
            if mixing in ("attention", PARALLEL_MIXING) else None
        self.mixer = mixer_kind(cfg.mixer).build(cfg, layer) if mixing in ("mixer", PARALLEL_MIXING) else None
        self.attn_in, self.attn_out = cfg.attn_in_multiplier, cfg.attn_out_multiplier  # muP (Falcon-H1)
        self.mixer_out = cfg.mixer_out_multiplier
        # dense, or a mixture of experts (moe.py), of this layer's own width; None on a layer without an FFN
        self.mlp = ffn(cfg.layer_config(layer), layer) if cfg.layer_ffns[layer] == "ffn" else None
        self.drop = nn.Dropout(cfg.resid_dropout)
        self.residual_scale = cfg.residual_scale
        # ArchConfig.residual_form "depth_scaled": this layer's two adds' (sublayer, residual) multipliers
        self.depth_scales = None if cfg.residual_form == "plain" else \
            tuple((1.0 / math.sqrt(k), math.sqrt((k - 1) / k)) for k in (2 * (layer + 1), 2 * (layer + 1) + 1))
        self.parallel_sum, self.residual_after_norm = cfg.parallel_sum, cfg.residual_after_norm
        self.residual_fp32 = cfg.residual_fp32
        self.wiring = WIRING[cfg.norm_placement]
        for flag, linear in LINEAR_FORWARDS:  # the same parameters, another forward (one flag at most)
            if getattr(cfg, flag):
                for module in self.modules():
                    if type(module) is nn.Linear:
                        module.__class__ = linear
                        if linear is Conv1D:
                            hold_in_out(module)
        # -- Gemma 4: the block's output times a learned scalar (Gemma4TextDecoderLayer's layer_scalar)
        self.scalar = nn.Parameter(torch.ones(1)) if cfg.layer_scalar else None
        # -- Gemma 3n: AltUp's predict/correct around the block, LAuReL beside attention, the per-layer embedding
        self.layer = layer
        self.altup = AltUp(cfg) if cfg.altup is not None else None
        self.laurel = Laurel(cfg) if cfg.laurel_rank is not None else None
        self.ple = PerLayerGate(cfg) if cfg.ple is not None else None
        # -- Zamba2: this layer's call of its shared block (arch/shared_blocks.py), None on the others
        shared = cfg.shared_blocks
        self.shared = SharedCall(cfg, layer, shared_blocks[shared.block_of(layer)], rotary) \
            if shared is not None and layer in shared.layers else None

    def feed(self, h: torch.Tensor) -> torch.Tensor:
        """The FFN on the normed stream; a mixture beside the dense MLP (moe.BesideDense: Gemma 4's) routes the
        stream itself, so it is passed too."""
        x = self.mlp_norm(h)
        return self.mlp(x, h) if getattr(self.mlp, "reads_stream", False) else self.mlp(x)

    def scaled(self, out: torch.Tensor) -> torch.Tensor:
        """A sublayer's output as it joins the residual: dropped out, then multiplied by a Python
        float as Granite does (`hidden * residual_multiplier`), skipped at 1 so others stay exact."""
        out = self.drop(out)
        return out if self.residual_scale == 1.0 else out * self.residual_scale

    def add(self, h: torch.Tensor, out: torch.Tensor, sublayer: int) -> torch.Tensor:
        """A sequential sublayer's output (`sublayer` 0: the mixer, 1: the FFN) added to the residual h:
        `h + scaled(out)`, or ArchConfig.residual_form "depth_scaled" as Beam's depth_scaled_residual_add."""
        if self.depth_scales is None:
            return h + self.scaled(out)
        out_scale, h_scale = self.depth_scales[sublayer]
        return self.drop(out) * out_scale + h * h_scale

    def mixing(self, ctx: Context, cache: KVCache | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What mixes this layer's tokens, as one function of the normed input: attention, the mixer, both side by
        side (`mixer(x) + attn(x)`, Falcon-H1's order), or None. Each module's input and output times its muP
        multipliers (Python floats in the activation dtype, as the reference's decoder layer multiplies them),
        outside the modules, so their own outputs (verify's points) are the reference modules' own."""
        def attend(x: torch.Tensor) -> torch.Tensor:
            out = self.attn(x if self.attn_in == 1.0 else x * self.attn_in, ctx, cache)
            return out if self.attn_out == 1.0 else out * self.attn_out

        def mix(x: torch.Tensor) -> torch.Tensor:
            out = self.mixer(x, ctx, cache)
            return out if self.mixer_out == 1.0 else out * self.mixer_out

        if self.attn is not None and self.mixer is not None:
            return lambda x: mix(x) + attend(x)
        return attend if self.attn is not None else mix if self.mixer is not None else None

    def per_layer_input(self, ctx: Context, h: torch.Tensor) -> torch.Tensor:
        """This layer's per-layer-embedding input (B, T, dim), on the block's device (a pipeline places blocks apart
        from the embeddings that made it)."""
        return ctx.per_layer[:, :, self.layer, :].to(h.device)

    def forward(self, h: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        attend = self.mixing(ctx, cache)
        if self.altup is not None:  # Gemma 3n: h is the streams (n_inputs, B, T, d_model)
            predictions = self.altup.predict(h)
            corrected = self.altup.correct(predictions, self.wiring(self, predictions[self.altup.active], attend))
            if self.ple is not None:
                corrected[1:] += self.ple(self.altup.scaled(corrected), self.per_layer_input(ctx, h))
            return corrected
        if self.shared is not None:  # Zamba2: the shared block joins the input the norm reads, not the residual
            return self.add(h, attend(self.attn_norm(h + self.shared(h, ctx, cache))), 0)
        h = self.wiring(self, h, attend)
        if self.ple is not None:  # Gemma 4's per-layer embedding, added to the residual
            h = h + self.ple(h, self.per_layer_input(ctx, h))
        return h if self.scalar is None else h * self.scalar  # Gemma 4
