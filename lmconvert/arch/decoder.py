"""The canonical decoder: embeddings, blocks, final norm, LM head, loss and decoding (greedy by
default; the caller may pass another next-token chooser, e.g. runtime/sampling.py's)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice

import torch
import torch.nn.functional as F
from torch import nn

from .activations import ACTIVATIONS
from .altup import StreamsIn, StreamsOut
from .attention import BACKENDS
from .block import Block
from .cache import KVCache
from .config import ArchConfig
from .context import Context, mask_positions
from .errors import ConfigError
from .moe import SUMS, Experts, balance_loss
from .norms import Norm
from .ple import PerLayerInputs
from .positions import POSITION_TABLES, RelativeBias
from .rope import Rotary
from .shared_blocks import SharedBlock

# the next tokens (B, 1) from the ids so far (B, T) and the last position's logits (B, vocab)
Chooser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TiedHead(nn.Module):
    """The LM head of tied embeddings that keeps a bias of its own (CTRL's `lm_head`, ModernBERT
    decoder's `decoder`: an nn.Linear whose weight transformers ties to the embedding, whose bias it
    does not): `F.linear(h, embedding, bias)`, nn.Linear's own op. Only the bias is its parameter
    (`lm_head.bias`); the embedding is held as a plain reference, so state_dict lists it once."""

    def __init__(self, embed: nn.Embedding, vocab_size: int) -> None:
        super().__init__()
        object.__setattr__(self, "embed", embed)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.embed.weight, self.bias)


class HeadTransform(nn.Module):
    """BERT's LM-head prediction transform (ModernBERT decoder's `lm_head`, before its `decoder`
    projection): `norm(act(dense(h)))` on the final hidden state, the norm being the block norms'."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.head_transform_bias)
        self.act = ACTIVATIONS[cfg.head_transform]
        self.norm = Norm(cfg.d_model, cfg.norm)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # N(0, 1) as nn.Embedding's own init, but as a factory call: on the meta device (how loaders
        # build a Decoder) normal_ takes a slow first-call decomposition path, randn does not
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim, _weight=torch.randn(cfg.vocab_size, cfg.embed_dim))
        # OPT-350m: embeddings (and the tied head) narrower than the model, bias-free linears between
        self.project_in = nn.Linear(cfg.embed_dim, cfg.d_model, bias=False) if cfg.projects_embeddings else None
        self.pos_embed = (nn.Embedding(cfg.max_positions + cfg.position_offset, cfg.d_model)
                          if cfg.absolute_positions == "learned" else None)
        self.embed_norm = Norm(cfg.d_model, cfg.norm) if cfg.embed_norm else None  # BLOOM
        self.rel_bias = (RelativeBias(cfg.relative_buckets, cfg.relative_max_distance, cfg.n_heads)
                         if "relative" in cfg.layer_positions else None)
        # Gemma 3n: the per-layer embeddings (Gemma 4's too) and AltUp's streams in, before the blocks
        self.ple = PerLayerInputs(cfg) if cfg.ple is not None else None
        self.altup_in = StreamsIn(cfg) if cfg.altup is not None else None
        # Zamba2: the shared transformer blocks, held once; the layers that call them reach them by reference
        self.shared_blocks = nn.ModuleList(SharedBlock(cfg) for _ in range(cfg.shared_blocks.n_blocks)) \
            if cfg.shared_blocks is not None else None
        rotaries: dict[tuple[int, int], Rotary] = {}  # one table per RopeConfig and head_dim, shared by its layers
        self.layers = nn.ModuleList()
        for i in range(cfg.n_layers):
            rope = cfg.rope_for(i)
            rotary = None
            if rope is not None:
                head_dim = cfg.layer_config(i).head_dim  # Gemma 4: the global layers' own
                if (id(rope), head_dim) not in rotaries:
                    rotaries[id(rope), head_dim] = Rotary(rope, head_dim, cfg.max_positions)
                rotary = rotaries[id(rope), head_dim]
            self.layers.append(Block(cfg, i, rotary, self.rel_bias, self.shared_blocks))
        self.altup_out = StreamsOut(cfg) if cfg.altup is not None else None  # the streams merged, before the norm
        self.final_norm = Norm(cfg.d_model, cfg.norm) if cfg.final_norm else nn.Identity()
        self.head_transform = HeadTransform(cfg) if cfg.head_transform is not None else None
        self.project_out = nn.Linear(cfg.d_model, cfg.embed_dim, bias=False) if cfg.projects_embeddings else None
        self.lm_head = nn.Linear(cfg.embed_dim, cfg.head_vocab, bias=cfg.lm_head_bias) if not cfg.tie_embeddings \
            else TiedHead(self.embed, cfg.vocab_size) if cfg.lm_head_bias else None
        self.drop = nn.Dropout(cfg.embed_dropout)

    def set_attention(self, backend: str) -> Decoder:
        """Run attention through "sdpa" (fast) or "eager" (transformers' eager order)."""
        if backend not in BACKENDS:
            raise ConfigError(f"attention backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        for block in self.layers:
            for attn in (block.attn, block.shared.attn if block.shared is not None else None):
                if attn is not None:
                    attn.backend = backend
        return self

    def set_experts(self, implementation: str) -> Decoder:
        """Sum a mixture of experts' outputs as transformers' "grouped_mm" (its default) or "eager"
        experts do (arch/moe.py): the two round differently in bf16 and fp16."""
        if implementation not in SUMS:
            raise ConfigError(f"experts implementation {implementation!r}: choose one of {', '.join(SUMS)}")
        for module in self.modules():
            if isinstance(module, Experts):
                module.implementation = implementation
        return self

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers)

    def embed_tokens(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        h = self.embed(ids)
        if cfg.embed_scale is not None:  # Gemma rounds sqrt(d) to the weight dtype first; XGLM does not
            scale = torch.tensor(cfg.embed_scale, dtype=torch.float32).to(h.dtype) if not cfg.embed_scale_unrounded \
                else cfg.embed_scale
            h = h * scale
        if self.project_in is not None:
            h = self.project_in(h)
        index = positions + cfg.position_offset  # OPT and XGLM start their tables at 2
        if self.pos_embed is not None:
            h = h + self.pos_embed(index)
        elif cfg.absolute_positions in POSITION_TABLES:
            h = h + POSITION_TABLES[cfg.absolute_positions](index, cfg.d_model, h.dtype)
        if self.embed_norm is not None:
            h = self.embed_norm(h)
        return self.drop(h)

    def states(self, ids: torch.Tensor, cache: KVCache | None = None, attention_mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Hidden state after the embedding and after each block (transformers' layout, without
        the final norm), one at a time. A forward pass holds only the current one, so the
        allocator hands each block the memory the one before freed: holding all of them made
        SmolLM2-shaped prefill take fresh pages from the kernel for every block.

        `attention_mask` (B, cached + T), 1 on tokens and 0 on (left) padding, hides the padding
        keys; `positions` (B, T) numbers each row's tokens. Without them, positions count from the
        sequence start as transformers' forward does (OPT's from the mask: `positions_from_mask`);
        `generate` passes positions numbered from each row's first token, as transformers' does.
        Padding query rows attend to nothing: their outputs mean nothing, as in transformers."""
        past = cache.length if cache is not None else 0
        B, T = ids.shape
        if attention_mask is not None and tuple(attention_mask.shape) != (B, past + T):
            raise ValueError(f"attention_mask has shape {list(attention_mask.shape)}; it covers the cached tokens "
                             f"and the new ones: pass one of shape [{B}, {past + T}]")
        if positions is not None and positions.shape[-1] != T:
            raise ValueError(f"positions has shape {list(positions.shape)}; pass one position per new token: "
                             f"[{B}, {T}] or [{T}]")
        if positions is None:
            positions = self.default_positions(ids, past, attention_mask)
        if cache is not None:
            cache.advance(T)
        h, ctx = self.start(ids, past, positions, attention_mask)
        yield h
        for block in self.layers:
            h = block(h, ctx, cache)
            yield h

    def start(self, ids: torch.Tensor, past: int, positions: torch.Tensor,
              attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Context]:
        """What the first block reads, and the context every block shares: the embedding (Gemma 3n: AltUp's
        streams of it), with the per-layer embeddings' inputs in the context where the model has them."""
        h = self.embed_tokens(ids, positions)
        ctx = Context.build(past, ids.shape[1], h.dtype, ids.device, positions, attention_mask)
        if self.ple is not None:
            ctx.per_layer = self.ple(ids, h)
        if self.shared_blocks is not None:  # Zamba2: a copy of the embeddings, read by every shared block's call
            ctx.embeddings = torch.clone(h)
        if self.altup_in is not None:
            h = self.altup_in(h)
        return h, ctx

    def default_positions(self, ids: torch.Tensor, past: int,
                          attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The positions transformers' forward gives T new tokens after `past` cached ones when it is
        passed none: from the sequence start (T,), or for `positions_from_mask` (OPT) each row's
        count of real tokens so far minus one, -1 on padding (B, T)."""
        if attention_mask is not None and self.cfg.positions_from_mask:
            mask = attention_mask.long()
            return (mask.cumsum(-1) * mask - 1)[:, past:]
        return torch.arange(past, past + ids.shape[1], device=ids.device)

    def hidden_states(self, ids: torch.Tensor, cache: KVCache | None = None,
                      until: int | None = None, attention_mask: torch.Tensor | None = None,
                      positions: torch.Tensor | None = None) -> list[torch.Tensor]:
        """All of `states`; `until` stops after that many blocks."""
        states = self.states(ids, cache, attention_mask, positions)
        return list(islice(states, None if until is None else until + 1))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if self.altup_out is not None:  # Gemma 3n: the streams to one state
            h = self.altup_out(h)
        h = self.final_norm(h)
        if cfg.residual_fp32:  # the final norm's fp32 output, cast to the head's dtype
            h = h.to(self.embed.weight.dtype)
        if self.head_transform is not None:
            h = self.head_transform(h)
        if self.project_out is not None:
            h = self.project_out(h)
        if cfg.head_divisor != 1.0:  # MiniCPM3: `hidden_states / logits_scaling`, a Python float
            h = h / cfg.head_divisor
        logits = self.lm_head(h) if self.lm_head is not None else F.linear(h, self.embed.weight)
        if cfg.logit_scale != 1.0:
            logits = logits * cfg.logit_scale
        if cfg.final_softcap is not None:  # Beam: on fp32 copies, the logits left fp32
            logits = torch.tanh((logits.float() if cfg.softcap_fp32 else logits) / cfg.final_softcap) \
                * cfg.final_softcap
        return logits

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, vocab) for token ids (B, T); with labels, also the mean next-token loss.
        `attention_mask` and `positions` as in `states` (left padding)."""
        # each state dropped as the next is made
        (last,) = deque(self.states(ids, cache, attention_mask, positions), maxlen=1)
        logits = self.logits(last)
        if labels is None:
            return logits
        return logits, self.loss(logits, labels)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of position t predicting labels[t+1] (-100 ignored), plus z-loss
        alpha * logsumexp^2 that keeps the softmax normaliser near 1 (PaLM), plus a mixture of experts'
        load-balancing loss times `moe.aux_loss` (off by default) over the forward pass just run."""
        logits = logits[:, :-1].float().flatten(0, 1)
        target = labels[:, 1:].flatten()
        keep = target != -100
        loss = F.cross_entropy(logits, target, ignore_index=-100)
        if self.cfg.z_loss:
            z = torch.logsumexp(logits[keep], dim=-1)
            loss = loss + self.cfg.z_loss * (z ** 2).mean()
        if self.cfg.moe is not None and self.cfg.moe.aux_loss:  # the experts' load balance (moe.py)
            loss = loss + self.cfg.moe.aux_loss * balance_loss(self, self.cfg.moe)
        return loss

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, attention_mask: torch.Tensor | None = None,
                 choose: Chooser | None = None, on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Decoding with the KV cache; returns prompt and continuation. As transformers'
        generate: a row that has emitted any of the EOS ids is finished and continues with the
        pad id (the first EOS id when there is none) until every row is finished. With an
        `attention_mask` (B, T) of left-padded rows, each row is numbered from its first token
        (`cumsum(mask) - 1`, padding 0) and the mask grows by a 1 per generated token.

        `choose(ids so far (B, T), last logits (B, vocab))` gives the next tokens (B, 1): greedy
        argmax unless given (sampling lives in runtime/sampling.py: the decoder knows no RNG).
        `on_token(tokens (B, 1))` sees each step's tokens as they are chosen (streaming)."""
        eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or ()),
                           dtype=torch.long, device=ids.device)
        pad = pad_token_id if pad_token_id is not None else (int(eos[0]) if len(eos) else None)
        finished = torch.zeros(ids.shape[0], 1, dtype=torch.bool, device=ids.device)
        cache = self.new_cache()
        mask = positions = None
        if attention_mask is not None:
            mask = attention_mask.to(device=ids.device, dtype=torch.long)
            positions = mask_positions(mask)
        logits = self(ids, cache=cache, attention_mask=mask, positions=positions)
        out = ids
        for _ in range(max_new_tokens):
            token = logits[:, -1].argmax(-1, keepdim=True) if choose is None else choose(out, logits[:, -1])
            if pad is not None:
                token = token.masked_fill(finished, pad)
            out = torch.cat((out, token), dim=1)
            if on_token is not None:
                on_token(token)
            finished |= torch.isin(token, eos)
            if bool(finished.all()) or out.shape[1] - ids.shape[1] == max_new_tokens:
                break
            if mask is not None:
                mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
                positions = positions[:, -1:] + 1
            logits = self(token, cache=cache, attention_mask=mask, positions=positions)
        return out
