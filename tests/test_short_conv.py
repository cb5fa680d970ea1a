"""LFM2's gated short convolution (`mixer="short_conv"`) against transformers' torch path on each
of its three paths: a forward without a cache, a cached forward of several tokens (a prefill shorter
than the kernel, left-padded with zeros to it; a chunk after a prefill, the state before it), and a
single cached token (`causal_conv1d_update`); in fp32 and bit for bit in bf16, with left padding
(zeroed before in_proj) and through generate. The family tests (tests/specs/lfm2.py) run the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_specs import SPECS
from hf_models import build_model, save_checkpoint, save_tiny_tokenizer, token_batch

import lmconvert

SPEC = SPECS["lfm2"]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(build_model("lfm2", **SPEC.kwargs), tmp_path_factory.mktemp("lfm2"))


def reference(src: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=dtype, attn_implementation="eager").eval()


@torch.no_grad()
def chunked(step, ids: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:  # noqa: ANN001
    """Logits fed in chunks of `sizes`, then one token at a time."""
    out, start = [], 0
    for size in sizes:
        out.append(step(ids[:, start:start + size]))
        start += size
    out += [step(ids[:, t:t + 1]) for t in range(start, ids.shape[1])]
    return torch.cat(out, 1)


def transformers_steps(model: torch.nn.Module):  # noqa: ANN201
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    return lambda chunk: model(chunk, cache=cache, use_cache=True).logits


# prefill shorter than the kernel (4), one token, a chunk after the state, a prefill longer than it
@pytest.mark.parametrize("sizes", [(2,), (1,), (2, 5), (6, 3)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_cached_path_is_transformers(src: Path, sizes: tuple[int, ...], dtype: torch.dtype) -> None:
    ids = token_batch(seq=16)
    ours = lmconvert.load(src, dtype=dtype, attention="eager")
    cache = ours.new_cache()
    got = chunked(lambda chunk: ours(chunk, cache=cache), ids, sizes)
    want = chunked(transformers_steps(reference(src, dtype)), ids, sizes)
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        assert float((got - want).abs().max()) <= 1e-5
    assert cache.length == 16 and cache.states[0]["conv"].shape == (2, 64, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_left_padding_is_zeroed_before_the_convolution(src: Path, dtype: torch.dtype) -> None:
    """transformers multiplies the padding tokens' inputs by 0 (apply_mask_to_padding_states), so the
    convolution's window over a row's first tokens sees zeros there; our padding does the same."""
    ids = token_batch(seq=12)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    ours = lmconvert.load(src, dtype=dtype, attention="eager")
    with torch.no_grad():
        got = ours(ids, attention_mask=mask)
        want = reference(src, dtype)(ids, attention_mask=mask).logits
        unmasked = ours(ids)
    real = mask.bool()
    assert float((got[real] - want[real]).abs().max()) <= (0 if dtype == torch.bfloat16 else 1e-5)
    assert float((got[0, 5:] - unmasked[0, 5:]).abs().max()) > 1e-3  # the padding mattered


def test_generate_with_left_padding_is_transformers(src: Path) -> None:
    ids = token_batch(seq=10)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ours = lmconvert.load(src, attention="eager")
    theirs = reference(src, torch.float32)
    with torch.no_grad():
        got = ours.generate(ids, 12, attention_mask=mask, pad_token_id=0)
        want = theirs.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               eos_token_id=None)
    assert torch.equal(got, want)


def test_state_and_card(src: Path) -> None:
    arch = lmconvert.load(src).cfg
    assert arch.mixer == "short_conv" and arch.layer_mixers == ("mixer", "attention", "mixer", "mixer")
    assert arch.state_bytes_per_sequence(4) == 3 * 4 * 64 * 4  # three conv layers' last 4 inputs, fp32
    assert arch.kv_cache_bytes_per_token(4) == 1 * 2 * 2 * 16 * 4  # one attention layer's k and v


def test_transformers_reads_our_gguf(tmp_path: Path) -> None:
    """transformers' GGUF loader reads lfm2 (the schedule from the per-layer KV-head counts, the conv kernel
    unsqueezed back): our f32 GGUF gives its logits, and ours, within fp32's bar; llama.cpp itself runs the
    same model in tests/test_llamacpp.py."""
    from test_formats_gguf import transformers_gguf

    from lmconvert.convert import convert, to_canonical

    vocab = save_tiny_tokenizer(tmp_path / "hf")  # transformers' GGUF loader reads lfm2's tokens
    model = build_model("lfm2", **{**SPEC.kwargs, **SPEC.gguf}, vocab_size=vocab)
    save_checkpoint(model, tmp_path / "hf")
    to_canonical(tmp_path / "hf", tmp_path / "canonical")
    out = tmp_path / "m.gguf"
    convert(tmp_path / "canonical", out, "gguf", quant="f32", gguf_pre="gpt-2")
    ids = token_batch(vocab=vocab, seq=24)
    with torch.no_grad():
        theirs = transformers_gguf(out)(ids).logits
        assert float((theirs - lmconvert.load(out)(ids)).abs().max()) <= 1e-5
        assert float((theirs - model(ids).logits).abs().max()) <= 1e-5


@pytest.mark.slow  # over 1.1 s each on 2 cores
@pytest.mark.parametrize("name", ["lfm2", "lfm2_moe", "lfm3"])
def test_forty_decoding_steps(name: str, tmp_path: Path) -> None:
    """A prefill shorter than the kernel, then 40 tokens one at a time: transformers' cached decoding
    element by element in fp32 and bit for bit in bf16, and in float64 our own full forward."""
    from hf_models import cached_logits, incremental

    spec = SPECS[name]
    src = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path)
    ids = token_batch(seq=43)
    for dtype in (torch.float32, torch.bfloat16):
        ours = lmconvert.load(src, dtype=dtype, attention="eager")
        cache = ours.new_cache()
        with torch.no_grad():
            got = incremental(lambda chunk: ours(chunk, cache=cache), ids, 3)  # noqa: B023 - used at once
            want = cached_logits(reference(src, dtype), ids, 3)
        assert torch.equal(got, want) if dtype == torch.bfloat16 else float((got - want).abs().max()) <= 1e-5
    exact = lmconvert.load(src, dtype=torch.float64)
    cache = exact.new_cache()
    with torch.no_grad():
        assert float((incremental(lambda chunk: exact(chunk, cache=cache), ids, 3) - exact(ids)).abs().max()) <= 1e-10
