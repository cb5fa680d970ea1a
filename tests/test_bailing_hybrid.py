"""Ling 3 (bailing_hybrid) whole, at a length the family tests' 28 tokens do not reach: 150 tokens, so
the Kimi delta attention layers run the chunked rule over two chunks of 64 and a part (conv width 4),
between them the latent attention layers with RoPE and their per-head output gate; the tiny model of
tests/specs/bailing_hybrid.py, every parameter perturbed. fp32 within 1e-5 of transformers' eager
logits, bf16 bit for bit, fp16 no further from the fp32 run than transformers' own fp16; cached
decoding (a prefill of 70, then 40 tokens one at a time: transformers' recurrent_kimi_delta_attention
path) against transformers' own cached decoding, and in float64 against our full forward; the
unbounded forget gate (kda_safe_gate false, torch's softplus) in fp32 too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_models import build_model, check_cached_decoding, load_reference, save_checkpoint, token_batch
from specs.bailing_hybrid import SPEC

import lmconvert

pytestmark = pytest.mark.slow
IDS = token_batch(seq=150)  # > 2 chunks of 64, > the conv width 4
LONG = dict(SPEC.kwargs, max_position_embeddings=256)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple, Path] = {}

    def get(dtype: torch.dtype = torch.float32, **overrides: object) -> Path:
        key = (dtype, tuple(sorted(overrides.items())))
        if key not in made:
            model = build_model("bailing_hybrid", **{**LONG, **overrides})
            made[key] = save_checkpoint(model, tmp_path_factory.mktemp("bailing"), dtype)
        return made[key]

    return get


def _logits(src: Path, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Ours and transformers' eager logits of `src` run in `dtype`."""
    with torch.no_grad():
        return (lmconvert.load(src, dtype=dtype, attention="eager")(IDS).float(),
                load_reference(src, dtype)(IDS).logits.float())


@pytest.mark.parametrize("safe_gate", [True, False])
def test_fp32_parity_over_chunks(saved: Callable[..., Path], safe_gate: bool) -> None:
    ours, ref = _logits(saved(kda_safe_gate=safe_gate))
    assert float((ours - ref).abs().max()) <= 1e-5


@pytest.mark.bitexact
def test_bf16_is_transformers_bit_for_bit(saved: Callable[..., Path]) -> None:
    ours, ref = _logits(saved(torch.bfloat16), torch.bfloat16)
    assert torch.equal(ours, ref), float((ours - ref).abs().max())


def test_fp16_faithfulness(saved: Callable[..., Path]) -> None:
    """Our fp16 error against the same fp16 weights run in fp32 is at most 1.25 x transformers' own."""
    src = saved(torch.float16)
    exact = _logits(src, torch.float32)[1]
    ours, ref = _logits(src, torch.float16)
    assert float((ours - exact).abs().mean()) <= 1.25 * float((ref - exact).abs().mean())


def test_cached_decoding(saved: Callable[..., Path]) -> None:
    """A prefill of 70 (the chunked rule), then 40 tokens one at a time (the recurrent rule, the conv
    update; the latent layers' cache): within 1e-5 of transformers' cached decoding; in float64 our
    cached decoding as our full forward."""
    check_cached_decoding(saved(), IDS[:, :110], 70, "eager", "eager", 1e-5)
