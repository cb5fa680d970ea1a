"""Shared helpers for the canonical-decoder tests (`tests/test_arch_*.py`); holds no tests itself.

Every model is built from a fixed seed and then perturbed away from its init, so zero-initialised
biases, zero-centred norm weights and the relative-bias table all carry signal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from lmconvert.arch import ArchConfig, Decoder

TINY: dict[str, Any] = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_positions=64)


def tiny(**overrides: Any) -> ArchConfig:
    return ArchConfig(**{**TINY, **overrides})


def perturb(module: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * scale)


def build(cfg: ArchConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> Decoder:
    torch.manual_seed(seed)
    model = Decoder(cfg)
    perturb(model, seed)
    return model.to(dtype).eval()


def variant(model: Decoder, **changes: Any) -> Decoder:
    """The same weights under a config that differs in `changes` (which must not change the parameters)."""
    other = Decoder(dataclasses.replace(model.cfg, **changes))
    other.load_state_dict(model.state_dict(), strict=True)
    other.set_attention(model.layers[0].attn.backend)
    return other.to(next(model.parameters()).dtype).eval()


def tokens(vocab: int = 64, seq: int = 24, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def hf_eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       scaling: float, softcap: float | None = None) -> torch.Tensor:
    """transformers' eager attention (Gemma 2's, which has the soft-cap) on (B, H|KV, T, D) tensors;
    returns (B, T, H*D) like the input of o_proj."""
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], training=False, head_dim=q.shape[-1])
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=scaling, softcap=softcap)
    return out.reshape(q.shape[0], q.shape[2], -1)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """transformers' eager mask: 0 where allowed, finfo.min elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
