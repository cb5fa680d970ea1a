"""The checks both delta-rule mixer kinds (gated delta-net, Kimi delta attention) pass against
transformers' own module (`ref`, perturbed) and ours holding its weights (`ours`); holds no tests
itself. Each compares bit for bit, then, in float64, our cached path against our own full forward.
"""

from __future__ import annotations

import torch
from arch_helpers import max_diff

from lmconvert.arch.cache import KVCache
from lmconvert.arch.context import Context


def inputs(dtype: torch.dtype, d: int, seq: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(seed)).to(dtype)


def worst(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def ctx(past: int, n: int, dtype: torch.dtype, mask: torch.Tensor | None = None) -> Context:
    return Context.build(past, n, dtype, torch.device("cpu"), attention_mask=mask)


def check_prefill(ref, ours, x: torch.Tensor) -> None:
    """transformers' chunked path, equal bit for bit, with and without a cache (which keeps the conv window)."""
    dtype, T = x.dtype, x.shape[1]
    with torch.no_grad():
        expected = ref(x)
        assert expected.abs().max() > 0.05  # the layer does something: the comparison is not of zeros
        assert torch.equal(ours(x, ctx(0, T, dtype), None), expected)
        assert torch.equal(ours(x, ctx(0, T, dtype), KVCache(1)), expected)


def check_cached_decoding(ref, ours, hf_cfg, x: torch.Tensor) -> None:
    """x (B, 111, d): a prefill of 70 tokens, a 5-token continuation (the chunked rule from the cached
    state, the conv over the kept window), then 36 tokens one at a time (the recurrent rule, the conv
    update): each step equal bit for bit to transformers' module run with its own cache (DynamicCache
    of a linear_attention layer); the states we keep equal to the ones it keeps (conv in the
    activation dtype, recurrent in fp32); in float64, the steps within 1e-10 of our own uncached
    forward over the whole sequence (chunked throughout)."""
    from transformers import DynamicCache

    dtype = x.dtype
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    pieces = [(0, 70), (70, 75)] + [(t, t + 1) for t in range(75, 111)]
    with torch.no_grad():
        for start, end in pieces:
            expected = ref(x[:, start:end], cache=hf_cache)
            got = ours(x[:, start:end], ctx(start, end - start, dtype), cache)
            assert torch.equal(got, expected), (start, end, max_diff(got, expected))
        layer = hf_cache.layers[0]
        assert torch.equal(cache.states[0]["conv"], layer.conv_states[0])
        assert torch.equal(cache.states[0]["recurrent"], layer.recurrent_states[0])
        assert (cache.states[0]["conv"].dtype, cache.states[0]["recurrent"].dtype) == (dtype, torch.float32)
    exact, x, cache = ours.double(), x.double(), KVCache(1)  # float64: rounding cannot hide a wrong state
    with torch.no_grad():
        steps = [exact(x[:, start:end], ctx(start, end - start, torch.float64), cache) for start, end in pieces]
        assert worst(torch.cat(steps, 1), exact(x, ctx(0, 111, torch.float64), None)) <= 1e-10


def check_left_padding(ref, ours, hf_cfg, x: torch.Tensor) -> None:
    """x (2, 133, d), row 0 left-padded by 9: the padded inputs zeroed before the projections, as
    transformers' apply_mask_to_padding_states with the 2D mask create_recurrent_attention_mask gives
    a multi-token forward (and None for one token); a prefill of 100 and 33 decoding steps equal bit
    for bit; in float64, the padded row's real tokens as the unpadded sequence alone (1e-10)."""
    from transformers import DynamicCache

    dtype, n = x.dtype, 100
    mask = torch.ones(2, n + 33, dtype=torch.long)
    mask[0, :9] = 0
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    with torch.no_grad():
        expected = ref(x[:, :n], cache=hf_cache, attention_mask=mask[:, :n])
        assert torch.equal(ours(x[:, :n], ctx(0, n, dtype, mask[:, :n]), cache), expected)
        for t in range(n, n + 33):
            expected = ref(x[:, t:t + 1], cache=hf_cache)
            assert torch.equal(ours(x[:, t:t + 1], ctx(t, 1, dtype, mask[:, :t + 1]), cache), expected), t
    exact, x, cache = ours.double(), x.double(), KVCache(1)
    with torch.no_grad():
        outputs = [exact(x[:, :n], ctx(0, n, torch.float64, mask[:, :n]), cache)]
        outputs += [exact(x[:, t:t + 1], ctx(t, 1, torch.float64, mask[:, :t + 1]), cache) for t in range(n, n + 33)]
        alone = exact(x[:1, 9:], ctx(0, n + 24, torch.float64), None)
        assert worst(torch.cat(outputs, 1)[:1, 9:], alone) <= 1e-10
        unmasked = exact(x[:1, :n], ctx(0, n, torch.float64), None)
        assert worst(unmasked[:, 9:], alone[:, :n - 9]) > 1e-3  # unmasked, the padding would leak in


def check_state_and_parts(kind, cfg, ref, ours, hf_cfg, d: int) -> None:
    """The kind's state per sequence and layer is the conv window and the recurrent state transformers'
    cache holds for one sequence; its parts are the module's tensors; its card names it."""
    from transformers import DynamicCache

    hf_cache = DynamicCache(config=hf_cfg)
    with torch.no_grad():
        ref(inputs(torch.float32, d, seq=10, batch=1), cache=hf_cache)
    layer = hf_cache.layers[0]
    assert kind.state_elements(cfg) == layer.conv_states[0].numel() + layer.recurrent_states[0].numel()
    shapes = {}
    for name, part in kind.parts(cfg).items():
        shapes |= part.shapes(name)
    assert shapes == {name: tuple(p.shape) for name, p in ours.state_dict().items()}
    assert kind.describe(cfg)
