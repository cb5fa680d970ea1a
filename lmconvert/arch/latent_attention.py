"""Multi-head latent attention (MLA), the "latent" kind: transformers' DeepseekV3Attention op for op.

Queries come from one projection, or through a low-rank bottleneck (q_a -> RMSNorm -> q_b). Keys
and values come from one joint latent: `kv_a` gives `[c_kv | k_rot]`; `c_kv` is normed and
expanded by `kv_b` into every head's `[k_nope | v]`, and `k_rot`, rotated, is one key head that all
heads share. The KV cache holds `c_kv` (after its norm) and `k_rot`, not the expanded keys and
values: `kv_lora_rank + qk_rope_head_dim` entries per token and layer.

RoPE touches only the rotary part of each query and key. With `rope.layout == "interleaved"` the
rotary input dims come in pairs (x0, x1), (x2, x3), ... and the rotated result is written
de-interleaved ([evens | odds]), as transformers' `apply_rotary_pos_emb_interleave` does (V3), or
in place when `settings.deinterleave` is False (V2's, as a complex product with
`rope.complex_product`); with "half" it is the usual rotate-half. Sizes: B batch, T new tokens,
S all tokens (cached first), H heads, N qk_nope_head_dim, R qk_rope_head_dim (= head_dim), V v_head_dim, C kv_lora_rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import _eager, _sdpa, gated_output
from .attention_kinds import latent_score_scale
from .build import attach
from .cache import KVCache
from .config import ArchConfig
from .context import Context
from .parts import Part
from .positions import RelativeBias
from .rope import Rotary, apply_rotary


def _rotate_deinterleaving(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (x0, x1), ... rotated and written as [x0', x2', ... | x1', x3', ...]. The interleaved
    tables hold each pair's angle twice in a row, so their even positions are the per-pair angles
    transformers takes from the first half of its `cat(f, f)` tables: the same values."""
    cos, sin = cos[..., ::2], sin[..., ::2]  # (T, R/2)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H|1, T, R/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (B, H|1, T, R)


class LatentAttention(nn.Module):
    """The "latent" kind: the parts `attention_kinds` declares for it (q or q_a/q_a_norm/q_b, kv_a,
    kv_a_norm, kv_b, o)."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int, rotary: Rotary | None,
                 relative: RelativeBias | None) -> None:
        super().__init__()
        self.layer, self.cfg = layer, cfg
        self.settings = cfg.attention_settings
        self.q = self.q_a = self.q_a_norm = self.q_b = None  # the q path the config has replaces these
        self.out_gate = None  # Ling 3's per-head output gate (attn_output_gate="projection_head"), where it has one
        attach(self, parts)
        self.rotary = rotary
        self.scale = latent_score_scale(cfg)
        self.rotation = (("deinterleave" if self.settings.deinterleave else "interleaved")
                         if cfg.rope.layout == "interleaved" else "half")
        self.backend = "sdpa"
        self.absorbed = False  # set by `absorb`: attend in latent space instead of expanding K and V

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        q_nope, q_rot, c_kv, k_rot, _ = self._latent(x, ctx, cache)
        gate = None if self.out_gate is None else self.out_gate(x)  # (B, T, H)
        return self._attend(q_nope, q_rot, c_kv, k_rot, ctx.allowed(None), ctx.is_plain_causal(None), gate)

    def _latent(self, x: torch.Tensor, ctx: Context, cache: KVCache | None) -> tuple[torch.Tensor, ...]:
        """Every head's rotated query parts and the latent of all tokens so far (cached first); also
        the q LoRA's normed residual (None with a plain q projection), which DSA's indexer reads."""
        cfg, s = self.cfg, self.settings
        B, T, _ = x.shape
        H, N, R, C = cfg.n_heads, s.qk_nope_head_dim, cfg.head_dim, s.kv_lora_rank
        q_resid = None if self.q is not None else self.q_a_norm(self.q_a(x))  # (B, T, q_lora_rank)
        q = self.q(x) if q_resid is None else self.q_b(q_resid)  # (B, T, H*(N+R))
        q = q.view(B, T, H, N + R).transpose(1, 2)  # (B, H, T, N+R)
        q_nope, q_rot = torch.split(q, [N, R], dim=-1)  # (B, H, T, N), (B, H, T, R)
        c_kv, k_rot = torch.split(self.kv_a(x), [C, R], dim=-1)  # (B, T, C), (B, T, R)
        c_kv = self.kv_a_norm(c_kv).view(B, 1, T, C)  # one latent "head": (B, 1, T, C)
        k_rot = k_rot.view(B, 1, T, R)  # one rotary key shared by all heads: (B, 1, T, R)
        if self.rotary is not None:  # layer_positions "none" (Kimi Linear's NoPE MLA): k_rot shared unrotated
            q_rot, k_rot = self._rotate(q_rot, k_rot, ctx)
        if cache is not None:
            c_kv, k_rot = cache.update(self.layer, c_kv, k_rot)  # (B, 1, S, C), (B, 1, S, R)
        return q_nope, q_rot, c_kv, k_rot, q_resid

    def _attend(self, q_nope: torch.Tensor, q_rot: torch.Tensor, c_kv: torch.Tensor, k_rot: torch.Tensor,
                allowed: torch.Tensor | None, plain_causal: bool, gate: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over the latent (expanded, or absorbed), keys where `allowed` (bool (T, S) or
        (B, 1, T, S); None: all), each head's output times its gate where there is one (Ling 3's
        g_proj, `attention.gated_output`), then the output projection."""
        B, H, T, _ = q_nope.shape
        V = self.settings.v_head_dim
        dropout = self.cfg.attn_dropout if self.training else 0.0
        if self.absorbed:
            return self._out(self._absorbed(q_nope, q_rot, c_kv, k_rot, allowed, dropout), gate)
        q = torch.cat((q_nope, q_rot), dim=-1)  # (B, H, T, N+R)
        k, v = self._expand(c_kv, k_rot)  # (B, H, S, N+R), (B, H, S, V)
        if self.backend == "eager":
            out = _eager(q, k, v, self.scale, None, None, allowed, dropout)
        else:
            out = _sdpa(q, k, v, self.scale, None, allowed, plain_causal, dropout)
        out = out.transpose(1, 2).reshape(B, T, H * V)  # (B, H, T, V) -> (B, T, H*V)
        return self._out(out, gate)

    def _out(self, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """o of the heads' outputs (B, T, H*V), gated first where there is a gate."""
        return self.o(out if gate is None else gated_output(self.cfg, out, gate, self.settings.v_head_dim))

    def _rotate(self, q_rot: torch.Tensor, k_rot: torch.Tensor, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = ctx.rotary(self.rotary)  # (T, R)
        if self.rotation == "deinterleave":
            return _rotate_deinterleaving(q_rot, cos, sin), _rotate_deinterleaving(k_rot, cos, sin)
        product = self.rotary.cfg.complex_product
        return (apply_rotary(q_rot, cos, sin, self.rotation, complex_product=product),
                apply_rotary(k_rot, cos, sin, self.rotation, complex_product=product))

    def _absorbed(self, q_nope: torch.Tensor, q_rot: torch.Tensor, c_kv: torch.Tensor, k_rot: torch.Tensor,
                  allowed: torch.Tensor | None, dropout: float) -> torch.Tensor:
        """Attention in latent space: kv_b's key part folded into the query, its value part applied
        after the weighted sum, so no per-head key or value is ever made. The same function as the
        expanded path: q_nope . (W_uk c) = (W_uk^T q_nope) . c, and sum_s p_s W_uv c_s = W_uv sum_s p_s c_s."""
        s = self.settings
        B, H, T, N = q_nope.shape
        w = self.kv_b.weight.view(H, N + s.v_head_dim, s.kv_lora_rank)  # (H*(N+V), C) -> (H, N+V, C)
        w_uk, w_uv = torch.split(w, [N, s.v_head_dim], dim=1)  # (H, N, C), (H, V, C)
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # (B, H, T, C)
        scores = (torch.matmul(q_latent, c_kv.transpose(-1, -2))  # (B, H, T, C) @ (B, 1, C, S) -> (B, H, T, S)
                  + torch.matmul(q_rot, k_rot.transpose(-1, -2))) * self.scale  # + (B, H, T, R) @ (B, 1, R, S)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        p = F.dropout(F.softmax(scores, dim=-1, dtype=torch.float32).to(q_nope.dtype), p=dropout,
                      training=dropout > 0)
        out = torch.matmul(p, c_kv)  # (B, H, T, S) @ (B, 1, S, C) -> (B, H, T, C)
        out = torch.einsum("bhtc,hvc->bhtv", out, w_uv)  # (B, H, T, V)
        return out.transpose(1, 2).reshape(B, T, H * s.v_head_dim)  # (B, T, H*V)

    def _expand(self, c_kv: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' `expand_kv`: every head's keys and values from the cached latent."""
        cfg, s = self.cfg, self.settings
        B, _, S, _ = c_kv.shape
        N = s.qk_nope_head_dim
        kv = self.kv_b(c_kv).view(B, S, cfg.n_heads, N + s.v_head_dim)  # (B, 1, S, H*(N+V)) -> (B, S, H, N+V)
        kv = kv.transpose(1, 2)  # (B, H, S, N+V)
        k_nope, v = torch.split(kv, [N, s.v_head_dim], dim=-1)  # (B, H, S, N), (B, H, S, V)
        k_rot = k_rot.expand(-1, cfg.n_heads, -1, -1)  # (B, 1, S, R) -> (B, H, S, R), no copy
        return torch.cat((k_nope, k_rot), dim=-1), v  # (B, H, S, N+R), (B, H, S, V)


def absorb(model: nn.Module, on: bool = True) -> nn.Module:
    """Switch every latent layer of `model` to absorbed decoding (attention in latent space; beyond
    transformers, which expands) or back. The weights are not changed, so it can be switched freely."""
    for module in model.modules():
        if isinstance(module, LatentAttention):
            module.absorbed = on
    return model
