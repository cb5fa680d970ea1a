"""Zamba2's shared blocks beyond the family harness (tests/specs/zamba2.py's model: two blocks, each called by two
of the four hybrid layers): the KV cache the card counts is the one transformers keeps (one attention slot per
call: the calls share weights, not keys), and a file that still holds the tied copies save_pretrained drops is refused,
naming one: transformers runs such a copy untied where it differs from the first caller's (shown here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_specs import IDS, SPECS
from hf_models import build_model, edited_weights, save_checkpoint
from transformers import AutoModelForCausalLM

import lmconvert
from lmconvert.formats.errors import InputError
from lmconvert.verify.run import verify

SPEC = SPECS["zamba2"]


@pytest.mark.slow  # builds, saves and runs both models: over 1.5 s
def test_the_card_counts_the_cache_transformers_keeps(tmp_path: Path) -> None:
    model = build_model("zamba2", **SPEC.kwargs)
    src = save_checkpoint(model, tmp_path / "hf")
    ours = lmconvert.load(src)
    cache = ours.new_cache()
    with torch.no_grad():
        theirs = model(IDS, use_cache=True).past_key_values
        ours(IDS, cache=cache)
    tokens = IDS.numel()
    kept = sum(layer.keys.numel() + layer.values.numel() for layer in theirs.layers if hasattr(layer, "keys")) // tokens
    held = sum(k.numel() + v.numel() for k, v in zip(cache.keys, cache.values, strict=True) if k is not None) // tokens
    assert ours.cfg.kv_cache_bytes_per_token(1) == kept == held == 4 * 2 * 4 * 32  # 4 calls, K and V, 4 x 32


@pytest.mark.slow  # over 1.5 s
def test_a_file_holding_tied_copies_is_refused_by_name(tmp_path: Path) -> None:
    model = build_model("zamba2", **SPEC.kwargs)
    src = save_checkpoint(model, tmp_path / "hf")
    first = {3: 1, 4: 2}  # layers 3 and 4 call the blocks layers 1 and 2 hold

    def add_copies(tensors: dict[str, torch.Tensor]) -> None:
        for layer, source in first.items():
            prefix = f"model.layers.{source}.shared_transformer."
            for name in [n for n in tensors if n.startswith(prefix)]:
                tensors[name.replace(prefix, f"model.layers.{layer}.shared_transformer.")] = tensors[name] + 1.0

    copied = edited_weights(src, tmp_path / "copies", add_copies)
    with torch.no_grad():  # transformers runs the differing copies untied: not the model that was saved
        assert not torch.equal(AutoModelForCausalLM.from_pretrained(copied)(IDS).logits, model(IDS).logits)
    with pytest.raises(InputError, match=r"model\.layers\.[34]\.shared_transformer\..*a copy of shared block "
                                         r"[01] under a later hybrid layer .*remove them from the file"):
        lmconvert.load(copied)



@pytest.mark.slow  # over 1.5 s
def test_verify_max_memory_is_refused_by_name(tmp_path: Path) -> None:
    """transformers' reference loaded under accelerate's offload hooks decodes otherwise than without them
    (verify.expected.record's greedy steps ~1e-4 apart in fp32 on this model, its prefill logits equal): no
    offloaded reference can judge a Zamba2, so --max-memory is refused naming why."""
    src = save_checkpoint(build_model("zamba2", **SPEC.kwargs), tmp_path / "hf")
    with pytest.raises(InputError, match="--max-memory: zamba2: transformers' Zamba2 decodes otherwise"):
        verify(src, seq_len=20, generate=6, max_memory=100_000_000)
