"""Self-attention: one implementation for MHA/GQA/MQA, every position scheme, QK norm,
soft-capping and sliding windows. Variants are config values read here, never copies.

Two backends mirror transformers' two attention implementations op for op, so each agrees with
its counterpart bit for bit in fp32: "eager" scores (q @ k^T) * scale, soft-caps, adds the mask
and takes the softmax in fp32 (with attention sinks, gpt-oss's softmax over the scores and the
sink); "sdpa" calls `scaled_dot_product_attention` (faster; the default, as in transformers). The
backend is a runtime choice, not part of the architecture; soft-capped layers always run eager,
since SDPA cannot cap, and so do layers whose q.k is computed in fp32 (GPT-Neo), since SDPA cannot
upcast inside, and layers with sinks (gpt-oss), which SDPA cannot add.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from .build import attach
from .cache import KVCache
from .config import ArchConfig
from .context import Context
from .norms import Norm
from .parts import Part
from .positions import ALIBI_KINDS, RelativeBias, alibi_bias
from .rope import Rotary, apply_rotary


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`baddbmm(bias, q, k^T, alpha=scale)`: the scale (and BLOOM's bias) inside the product, rounded
    once; without a bias GPT-2's `_upcast_and_reordered_attn` (beta 0). Not the same bits as
    q @ k^T then * scale."""
    B, H, T, D = q.shape
    S = k.shape[2]
    if bias is None:
        start, beta = torch.empty(B * H, T, S, dtype=q.dtype, device=q.device), 0
    else:
        start, beta = bias.to(q.dtype).expand(B, H, T, S).reshape(B * H, T, S), 1
    return torch.baddbmm(start, q.reshape(B * H, T, D), k.transpose(-1, -2).reshape(B * H, D, S),
                         beta=beta, alpha=scale).view(B, H, T, S)


def _each(f: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor | None) -> torch.Tensor | None:
    """f(t), or None for a tensor a layer does not have (a KV-shared layer's own k and v)."""
    return None if t is None else f(t)


def _sink_softmax(w: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """gpt-oss's eager_attention_forward: each head's sink logit joins every row as one more column,
    the row's max is subtracted (in the scores' dtype, rounded there), the softmax is taken in that
    dtype, and the sink's column is dropped. Without sinks (MiMo-V2-Flash's full layers) the same
    softmax over the scores alone."""
    if sinks is None:
        return F.softmax(w - w.max(dim=-1, keepdim=True).values, dim=-1, dtype=w.dtype)
    B, _, T, _ = w.shape
    combined = torch.cat([w, sinks.reshape(1, -1, 1, 1).expand(B, -1, T, -1)], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return F.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]


def _softmax_dtype(w: torch.Tensor) -> torch.dtype:
    """fp32, as transformers upcasts; float64 scores stay float64, so that a float64 model (the tests' exact
    reference for cached decoding) rounds nowhere that depends on how many keys a row has."""
    return torch.promote_types(w.dtype, torch.float32)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' repeat_kv: each KV head `groups` times, as expand + reshape. With one KV head that is a
    view whose head stride is 0, and q @ k^T over it rounds otherwise than over a copy (Gemma 4's global layers)."""
    if groups == 1:  # a contiguous copy, as before: GPT-2's fp16 q @ k^T rounds as transformers' over it
        return x.repeat_interleave(1, dim=1)
    B, KV, S, D = x.shape
    return x[:, :, None].expand(B, KV, groups, S, D).reshape(B, KV * groups, S, D)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None,
           bias: torch.Tensor | None, allowed: torch.Tensor | None, dropout: float,
           scores_fp32: bool = False, bias_add: str = "rounded", scale_in_product: bool = False,
           sinks: torch.Tensor | None = None, sink_scale: bool = False, sink_softmax: bool = False) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)  # (B, H, S, D)
    if scores_fp32:  # GPT-J, GPT-Neo, GPT-2's reorder_and_upcast_attn: q @ k^T up to the softmax in fp32
        wide = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(wide), k.to(wide)
    dtype = v.dtype
    if bias is not None and bias_add == "matmul":
        w, bias = _scores(q, k, scale, bias), None
    elif bias is not None and bias_add == "falcon":  # through the mask only, divided by sqrt(head_dim) there
        bias = bias.to(dtype) / math.sqrt(q.shape[-1])
        w = torch.matmul(q, k.transpose(-1, -2)) * scale
    elif scale_in_product:
        w = _scores(q, k, scale)
    else:
        w = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, T, S)
    if softcap is not None:
        w = torch.tanh(w / softcap) * softcap
    if bias is not None:  # "fp32" (and Falcon's): the bias promotes the scores, as MPT's fp32 table does
        w = w + (bias if bias_add == "fp32" else bias.to(w.dtype))
    if allowed is not None:  # the activation dtype's min, as transformers' masks: fp32's would overflow to -inf
        # once Falcon's logits are rounded to bf16, and a padding query that sees no key would turn to NaN
        w = w + torch.zeros_like(allowed, dtype=w.dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    # in fp32, cast back: GPT-2's and XGLM's softmax in the scores' own bf16 computes in fp32 inside
    # the kernel and rounds once, the same numbers. With sinks (gpt-oss), their softmax
    if sinks is not None and sink_scale:  # GraniteSWA's form of the same sinks: the plain softmax's output scaled
        # by sigmoid(logsumexp(scores) - sink), the logsumexp in the scores' dtype, the sigmoid in fp32
        gate = (torch.logsumexp(w, dim=-1) - sinks.reshape(1, -1, 1)).to(torch.float32).sigmoid()
        p = F.dropout(F.softmax(w, dim=-1, dtype=_softmax_dtype(w)).to(dtype), p=dropout, training=dropout > 0)
        return torch.matmul(p, v) * gate.unsqueeze(-1).to(dtype)
    shifted = sinks is not None or sink_softmax  # sink_softmax: a layer without a sink of a model with sinks
    p = (_sink_softmax(w, sinks) if shifted else F.softmax(w, dim=-1, dtype=_softmax_dtype(w))).to(dtype)
    p = F.dropout(p, p=dropout, training=dropout > 0)
    return torch.matmul(p, v)


def _l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama4TextL2Norm (Llama4TextWeightlessRMSNorm): x * rsqrt(mean(x^2) + eps) in fp32, cast back."""
    y = x.float()
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, bias: torch.Tensor | None,
          allowed: torch.Tensor | None, causal: bool, dropout: float, bias_add: str = "rounded") -> torch.Tensor:
    mask = allowed
    if bias is not None:
        mask = bias.to(q.dtype)
        if bias_add == "falcon":  # only the mask's copy, divided by sqrt(head_dim)
            mask = mask / math.sqrt(q.shape[-1])
        if allowed is not None:
            mask = mask.masked_fill(~allowed, float("-inf"))
        causal = False
    elif causal:
        mask = None
    B, H, T, D = q.shape
    groups = H // k.shape[1]
    # transformers' sdpa_attention_forward: SDPA's own GQA where there is no mask (and head dims <= 256);
    # else one query token's heads packed as the rows of its KV heads, or the KV heads repeated
    if groups == 1 or mask is None and k.shape[-1] == v.shape[-1] <= 256:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                              scale=scale, enable_gqa=groups > 1)
    if T == 1:
        if mask is not None and mask.dim() == 4 and mask.shape[1] > 1:
            mask = mask.reshape(mask.shape[0], H // groups, groups, mask.shape[-1])
        out = F.scaled_dot_product_attention(q.reshape(B, H // groups, groups, D), k, v, attn_mask=mask,
                                             dropout_p=dropout, is_causal=False, scale=scale)
        return out.reshape(out.shape[0], H, T, v.shape[-1])
    return F.scaled_dot_product_attention(q, _repeat_kv(k, groups), _repeat_kv(v, groups), attn_mask=mask,
                                          dropout_p=dropout, is_causal=causal, scale=scale)


class Attention(nn.Module):
    """The "standard" kind: q, k, v, o and the optional QK norms, as `attention_kinds` declares them."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int, rotary: Rotary | None,
                 relative: RelativeBias | None) -> None:
        super().__init__()
        self.layer, self.cfg = layer, cfg
        # replaced by `attach` where the config has them
        self.q_norm = self.k_norm = self.sub_norm = self.sinks = self.out_gate = self.out_gate_bias = None
        self.k = self.v = None  # Gemma 4: a KV-shared layer has neither, a K = V layer no v
        attach(self, parts)
        # Gemma 4: the weightless V norm (no parameters), and where a KV-shared layer's K/V come from
        self.v_norm = Norm(cfg.head_dim, replace(cfg.norm, weight=False, weight_offset=0.0)) if cfg.v_norm else None
        self.kv_source = cfg.kv_source(layer)
        self.kv_shared = cfg.kv_shared_layers and layer in [cfg.kv_source(i) for i in range(cfg.n_layers)]
        if cfg.sinks_fp32 and self.sinks is not None:  # the loaders keep these fp32 in any dtype
            self.fp32_parameters = ("sinks",)
        self.rotary = rotary
        self.position = cfg.layer_positions[layer]
        # The shared table is registered once, as the Decoder's `rel_bias`. Registered here as well,
        # state_dict would list the same tensor again under every relative layer (and a parameter
        # count over it would count it once per layer), so it is held as a plain reference.
        object.__setattr__(self, "relative", relative if self.position == "relative" else None)
        self.window = cfg.window_for(layer)
        self.chunk = cfg.chunk_for(layer)
        self.scale = cfg.score_scale_for(layer)
        self.backend = "sdpa"

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        # Gemma 4's KV-shared layer: its own query, through every step below; K/V taken whole (cached ones
        # too) from an earlier layer, so k and v stay None until then
        reusing = self.kv_source is not None
        q = self.q(x)  # (B, T, H*D)
        k = None if reusing else self.k(x)  # (B, T, KV*D)
        if cfg.key_multiplier != 1.0 and k is not None:  # Falcon-H1's muP: k as it comes out of its projection
            k = k * cfg.key_multiplier
        v = None if reusing else self.v(x) if self.v is not None else k  # K = V: k's projection, before its norm
        gate = self.out_gate(x) if self.out_gate is not None else None  # AFMoE: (B, T, H*D)
        if self.out_gate_bias is not None:  # Beam: one bias per head, over its D elements
            gate = (gate.view(B, T, cfg.n_heads, cfg.head_dim) + self.out_gate_bias[:, None]).view(B, T, cfg.q_dim)
        if cfg.attn_output_gate == "q_heads":  # Qwen3-Next: (B, T, H*2D), each head's [query | gate]
            q, gate = torch.chunk(q.view(B, T, cfg.n_heads, 2 * cfg.head_dim), 2, dim=-1)
            gate = gate.reshape(B, T, cfg.q_dim)
        if cfg.clip_qkv is not None:  # OLMo's clamp_, on the projections as they come out
            q, k, v = (_each(lambda t: t.clamp(-cfg.clip_qkv, cfg.clip_qkv), t) for t in (q, k, v))
        scale = self.scale
        if cfg.scale_query:  # OPT, XGLM: q_proj(x) * scaling, then unscaled scores
            q, scale = q * scale, 1.0
        if cfg.qk_norm == "projection":
            q, k = self.q_norm(q), _each(self.k_norm, k)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim)
        k = _each(lambda t: t.view(B, T, cfg.n_kv_heads, cfg.head_dim), k)
        v = _each(lambda t: t.view(B, T, cfg.n_kv_heads, cfg.value_dim), v)
        if cfg.attn_value_scale != 1.0:  # MiMo-V2-Flash: v times a Python float, after its projection
            v = _each(lambda t: t * cfg.attn_value_scale, v)
        if cfg.qk_norm == "head" and not cfg.qk_norm_after_rope:
            q, k = self.q_norm(q), _each(self.k_norm, k)
        if self.v_norm is not None:
            v = _each(self.v_norm, v)
        q, k, v = q.transpose(1, 2), _each(lambda t: t.transpose(1, 2), k), _each(lambda t: t.transpose(1, 2), v)
        if self.rotary is not None:
            cos, sin = ctx.rotary(self.rotary)
            rope = self.rotary.cfg
            q, k = (_each(lambda t: apply_rotary(t, cos, sin, rope.layout, rope.fp32_rotation, rope.complex_product,
                                                 rope.reverse), t) for t in (q, k))
        if cfg.qk_norm_after_rope:  # HunYuan, nanochat: each rotated head normalised, before the cache
            q, k = self.q_norm(q), _each(self.k_norm, k)
        if cfg.qk_l2_norm and self.rotary is not None:  # Llama 4: weightless, on rotary layers only
            q, k = _l2_norm(q, cfg.norm.eps), _each(lambda t: _l2_norm(t, cfg.norm.eps), k)
        if cfg.attn_temperature is not None:  # the query scaled by its position, after RoPE
            form = cfg.attn_temperature_form
            temperature = ctx.query_temperature(cfg.attn_temperature, cfg.attn_temperature_floor, form)
            if form == "ministral3":  # every layer, the scale rounded to q's dtype first
                q = q * temperature.to(q.dtype)
            elif self.position == "none":  # Llama 4, Beam: the layers without positions, multiplied in fp32
                q = (q * temperature).to(q.dtype)
        if reusing:
            k, v = (t.to(q.device) for t in ctx.shared_kv[self.kv_source])  # its source may sit on another device
        else:
            if cache is not None:
                k, v = cache.update(self.layer, k, v)  # (B, KV, S, D)
            if self.kv_shared:  # for the KV-shared layers after it
                ctx.shared_kv[self.layer] = k, v
        return self._attend(q, k, v, gate, scale, ctx)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None, scale: float,
                ctx: Context) -> torch.Tensor:
        cfg = self.cfg
        B, _, T, _ = q.shape
        bias = self._position_bias(ctx)
        allowed = ctx.allowed(self.window, self.chunk)
        if self.window is not None and bias is None and len(ctx.k_pos) > len(ctx.q_pos) and allowed is not None:
            # after a prefill, the keys transformers' sliding-window cache still holds: the window's last
            # window - 1 and the new ones. The others are masked out anyway; over fewer keys the sums round as its
            keep = min(len(ctx.k_pos), self.window - 1 + T)
            k, v, allowed = k[..., -keep:, :], v[..., -keep:, :], allowed[..., -keep:]
        dropout = cfg.attn_dropout if self.training else 0.0
        add = ALIBI_KINDS[cfg.alibi].add if self.position == "alibi" else "rounded"  # how the bias joins
        if cfg.attn_softcap is not None or cfg.scores_fp32 or cfg.scale_in_product or cfg.attn_sinks \
                or self.backend == "eager":
            out = _eager(q, k, v, scale, cfg.attn_softcap, bias, allowed, dropout, cfg.scores_fp32, add,
                         cfg.scale_in_product, self.sinks, cfg.sink_form == "scale", cfg.attn_sinks)
        else:
            out = _sdpa(q, k, v, scale, bias, allowed, ctx.is_plain_causal(self.window, self.chunk), dropout, add)
        out = out.transpose(1, 2).reshape(B, T, cfg.o_dim)  # (B, T, H*Dv)
        if gate is not None:
            out = self._gated(out, gate)
        if self.sub_norm is not None:  # BitNet's attn_sub_norm, before the output projection
            out = self.sub_norm(out)
        return self.o(out)

    def _gated(self, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_output(self.cfg, out, gate, self.cfg.value_dim)

    def _position_bias(self, ctx: Context) -> torch.Tensor | None:
        if self.position == "alibi":
            return alibi_bias(self.cfg.n_heads, ctx.q_pos, ctx.k_pos, self.cfg.alibi, ctx.key_numbers())
        if self.relative is not None:
            return self.relative(ctx.q_pos, ctx.k_pos)
        return None


def gated_output(cfg: ArchConfig, out: torch.Tensor, gate: torch.Tensor, value_dim: int) -> torch.Tensor:
    """The output (B, T, H*V) times its gate's activation (`cfg.attn_gate_activation`): sigmoid in the
    activation dtype, or (Laguna) softplus, (Ling 3) sigmoid, of an fp32 copy cast back; elementwise, or
    (`projection_head`: Laguna's, LFM3's, Ling 3's latent attention) one gate per head over its V elements.
    One place for the standard and the latent kinds."""
    act = cfg.attn_gate_activation
    factor = torch.sigmoid(gate) if act == "sigmoid" else \
        (F.softplus if act == "softplus_fp32" else torch.sigmoid)(gate.float()).to(out.dtype)
    if cfg.attn_output_gate != "projection_head":
        return out * factor
    B, T, _ = out.shape
    return (out.view(B, T, cfg.n_heads, value_dim) * factor.unsqueeze(-1)).view(B, T, cfg.n_heads * value_dim)


BACKENDS = ("sdpa", "eager")
