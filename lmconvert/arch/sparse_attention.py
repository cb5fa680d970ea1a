"""DeepSeek Sparse Attention (DSA), the "sparse" kind: transformers' DeepseekV32Attention.

Latent attention (`latent_attention.py`) whose keys are chosen per query by a lightning indexer.
The indexer projects the q LoRA's normed residual into `index_n_heads` query heads and the hidden
state into one key (LayerNorm with weight and bias), rotates the first `head_dim` dims of both in
the half layout (rotate-half, the rotary part first: the opposite end and layout from MLA's),
scores every query against every key as the sum over heads of weight x ReLU(q . k / sqrt(Di)), in
fp32, with per-head weights from `index_weights` (kept in fp32, as transformers keeps
`weights_proj`), and keeps each query's top `index_topk` causal keys; MLA then attends to those
only. Its keys are cached beside the latent, so decoding scores past tokens without recomputing them.

Selection follows transformers op for op, in its layouts, so the scores are the same bits and
`torch.topk` breaks their (frequent, ReLU-made) ties the same way: in a full forward over a row of
all S keys with the future masked, while decoding over the row of the S keys so far. torch.topk does
not break ties alike in the two, so with ties at the cut the cached logits follow transformers'
cached ones, not the full forward's. Hidden keys score -inf (transformers' SDPA path; its eager
path adds the float mask's finfo.min): either way below every visible key, and the parity tests
run both. Sizes: B batch, T new tokens, S all tokens (cached first),
Hi index_n_heads, Di index_head_dim, R head_dim (the rotary dims).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cache import KVCache
from .config import ArchConfig
from .context import Context
from .latent_attention import LatentAttention
from .parts import Part
from .positions import RelativeBias
from .rope import Rotary, apply_rotary


class SparseAttention(LatentAttention):
    """The "sparse" kind: the latent parts plus the indexer's (index_q, index_k, index_k_norm,
    index_weights), as `attention_kinds` declares them."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int, rotary: Rotary | None,
                 relative: RelativeBias | None) -> None:
        super().__init__(cfg, parts, layer, rotary, relative)
        self.index_weights.fp32_parameters = ("weight",)  # `_keep_in_fp32_modules`: loaders keep it fp32

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None = None) -> torch.Tensor:
        q_nope, q_rot, c_kv, k_rot, q_resid = self._latent(x, ctx, cache)
        allowed = ctx.allowed(None)  # (T, S) or (B, 1, T, S); None: every key
        chosen = self.select(x, q_resid, ctx, cache, allowed)  # (B, 1, T, S)
        # transformers hands its attention the mask, never is_causal
        return self._attend(q_nope, q_rot, c_kv, k_rot, chosen if allowed is None else allowed & chosen, False)

    @torch.no_grad()
    def select(self, x: torch.Tensor, q_resid: torch.Tensor, ctx: Context, cache: KVCache | None,
               allowed: torch.Tensor | None) -> torch.Tensor:
        """The keys each query keeps: bool (B, 1, T, S), True on its top `index_topk` scores among
        the keys it may see (all of them when it may see fewer)."""
        index = self.index_scores(x, q_resid, ctx, cache, allowed)  # (B, T, S)
        top = index.topk(min(self.settings.index_topk, index.shape[-1]), dim=-1).indices  # (B, T, k)
        chosen = torch.zeros_like(index, dtype=torch.bool).scatter(-1, top, True)  # (B, T, S)
        return chosen.unsqueeze(1)  # (B, 1, T, S), one mask for every head

    def index_scores(self, x: torch.Tensor, q_resid: torch.Tensor, ctx: Context, cache: KVCache | None,
                     allowed: torch.Tensor | None) -> torch.Tensor:
        """Every query's score of every key (B, T, S), fp32; -inf where it may not look."""
        s = self.settings
        B, T, _ = x.shape
        Hi, Di = s.index_n_heads, s.index_head_dim
        q = self.index_q(q_resid).view(B, T, Hi, Di)  # (B, T, Hi*Di) -> (B, T, Hi, Di)
        k = self.index_k_norm(self.index_k(x)).view(B, T, 1, Di)  # one key head: (B, T, 1, Di)
        cos, sin = self._half_tables(ctx)  # (T, 1, R) or (B, T, 1, R): broadcast over the heads
        q = apply_rotary(q, cos, sin, "half")  # [rotated R | passed Di-R]: (B, T, Hi, Di)
        k = apply_rotary(k, cos, sin, "half").view(B, T, Di)  # (B, T, 1, Di) -> (B, T, Di)
        if cache is not None:
            k = cache.update_index(self.layer, k)  # (B, S, Di)
        # (B, T, Hi, Di) @ (B, 1, Di, S) -> (B, T, Hi, S), in fp32 whatever the model's dtype
        scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * Di ** -0.5)
        weights = self.index_weights(x.to(self.index_weights.weight.dtype)).float() * Hi ** -0.5  # (B, T, Hi)
        index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # (B, T, 1, Hi) @ (B, T, Hi, S) -> (B, T, S)
        if allowed is not None:  # (T, S) or (B, 1, T, S) -> broadcast as (B, T, S)
            index = index.masked_fill(~(allowed if allowed.dim() == 2 else allowed[:, 0]), float("-inf"))
        return index

    def _half_tables(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer's rotate-half tables from the layer's interleaved ones, which hold each
        pair's angle twice in a row: its even positions are the per-pair values, written twice
        end to end ([f | f], as transformers' tables are), the same bits."""
        cos, sin = ctx.rotary(self.rotary)  # (T, R) or (B, 1, T, R)
        cos, sin = (torch.cat((t[..., ::2], t[..., ::2]), dim=-1) for t in (cos, sin))
        if cos.dim() == 2:
            return cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, R)
        return cos.transpose(1, 2), sin.transpose(1, 2)  # (B, 1, T, R) -> (B, T, 1, R)
