"""A mixture of attention heads (MoA), the "head_mixture" kind: transformers' JetMoeAttention op for op.

Every token's router (`moe.Router`, the same top-k router as a mixture of experts: its top-k
logits softmaxed in fp32, the weights cast to the activation dtype) picks `top_k` of `n_experts`
attention experts. Each expert is a pair of projections: its `q` makes `n_kv_heads` query heads from
the token, its `o` takes those heads' output back to d_model. The keys and values are shared, one
`k` and one `v` for every expert, so the cache holds `n_kv_heads` heads as plain GQA would. A token's
`top_k` chosen experts give it `top_k * n_kv_heads` query heads (`n_heads`), slot by slot (head
`s * n_kv_heads + h` is slot s's head h), each reading kv head `h` (the keys tiled `top_k` times,
transformers' `repeat`, not GQA's interleave). The output of each slot's heads goes through its
expert's `o`, weighted by its router weight; the slots are summed, then the one `bias` added.

As JetMoE computes it: the (token, slot) rows sorted by expert (`sort` of the flattened choice),
each expert one matmul over its rows (`ParallelLinears`, whose output, in that sorted order, is the
point verify compares with transformers' `input_linear` / `output_linear`), the queries put back in
token order by `index_add` into zeros, the weighted outputs summed per token by one `index_add` in
the sorted order (so each token's slots are added in increasing expert order, in the activation dtype).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import _eager, _sdpa
from .build import attach
from .cache import KVCache
from .config import ArchConfig, MoeConfig
from .context import Context
from .moe import Router
from .parts import Part
from .positions import RelativeBias
from .rope import Rotary, apply_rotary


class ParallelLinears(nn.ModuleList):
    """One bias-free linear per expert (`{e}.weight`), run on rows sorted by expert: the first
    `counts[0]` rows through expert 0, the next `counts[1]` through expert 1, and so on, in that
    order (JetMoE's `JetMoeParallelExperts`). One point for verify (`one_point`)."""

    one_point = True

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:  # type: ignore[override]
        return torch.cat([linear(x) for linear, x in zip(self, rows.split(counts, dim=0), strict=True)], dim=0)


def router_config(cfg: ArchConfig) -> MoeConfig:
    """The router's own MoeConfig: JetMoE's top-k gating, the mixture of experts' `topk_softmax`."""
    s = cfg.attention_settings
    return MoeConfig(n_experts=s.n_experts, top_k=s.top_k, d_expert=cfg.head_dim, router="topk_softmax",
                     norm_topk=False)


class HeadMixture(nn.Module):
    """The "head_mixture" kind: the parts `attention_kinds` declares for it (`bias`, `router`,
    `q.{e}`, `k`, `v`, `o.{e}`), in that order."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int, rotary: Rotary | None,
                 relative: RelativeBias | None) -> None:
        super().__init__()
        self.layer, self.cfg = layer, cfg
        n = cfg.attention_settings.n_experts
        self.bias = None
        for name in parts:  # in declaration order, which is state_dict order
            if name == "router":
                self.router = Router(cfg, router_config(cfg))
            elif name in ("q.0", "o.0"):
                setattr(self, name[0], ParallelLinears(nn.Linear(parts[f"{name[0]}.{e}"].d_in,
                                                                 parts[f"{name[0]}.{e}"].d_out, bias=False)
                                                       for e in range(n)))
            elif "." not in name:
                attach(self, {name: parts[name]})
        self.rotary = rotary
        self.router_logits: torch.Tensor | None = None
        self.scale = cfg.score_scale_for(layer)
        self.backend = "sdpa"

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        cfg = self.cfg
        B, T, d = x.shape
        k_slots, n = cfg.attention_settings.top_k, cfg.attention_settings.n_experts
        h = x.reshape(-1, d)
        logits, weights, chosen = self.router(h)  # (B*T, top_k) each, weights in the activation dtype
        self.router_logits = logits if cfg.moe is not None and cfg.moe.aux_loss else None  # moe.balance_loss
        _, order = chosen.flatten().sort(0)  # the (token, slot) rows sorted by expert
        tokens = order.div(k_slots, rounding_mode="trunc")
        gates = weights.flatten()[order]
        counts = torch.bincount(chosen.flatten(), minlength=n).tolist()
        q = self.q(h[tokens], counts)
        q = torch.zeros((B * T * k_slots, q.shape[-1]), dtype=q.dtype, device=q.device).index_add(0, order, q)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, top_k * KV, T, D), slot-major
        k = self.k(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        if self.rotary is not None:
            cos, sin = ctx.rotary(self.rotary)
            rope = self.rotary.cfg
            q = apply_rotary(q, cos, sin, rope.layout, rope.fp32_rotation, rope.complex_product, rope.reverse)
            k = apply_rotary(k, cos, sin, rope.layout, rope.fp32_rotation, rope.complex_product, rope.reverse)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, KV, S, D): the shared heads, once
        k, v = k.repeat(1, k_slots, 1, 1), v.repeat(1, k_slots, 1, 1)  # head s * KV + h reads kv head h
        allowed = ctx.allowed(None)
        dropout = cfg.attn_dropout if self.training else 0.0
        if self.backend == "eager":
            out = _eager(q, k, v, self.scale, None, None, allowed, dropout)
        else:
            out = _sdpa(q, k, v, self.scale, None, allowed, ctx.is_plain_causal(None), dropout)
        out = out.transpose(1, 2).reshape(B * T * k_slots, cfg.kv_dim)  # each (token, slot)'s heads
        out = self.o(out[order], counts) * gates[:, None]
        out = torch.zeros((B * T, d), dtype=out.dtype, device=out.device).index_add(0, tokens, out).view(B, T, d)
        return out if self.bias is None else out + self.bias
