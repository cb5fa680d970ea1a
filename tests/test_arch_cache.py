"""KV cache: prefill + one token at a time (and chunked prefill) equals the full forward for every
position scheme and attention variant; greedy `generate` equals a cache-free argmax loop."""

from __future__ import annotations

import pytest
import torch
from arch_helpers import build, max_diff, tiny, tokens

from lmconvert.arch import NormConfig, RopeConfig

CONFIGS = {
    "llama": dict(n_kv_heads=2),
    "window": dict(layer_kinds=("local", "local"), sliding_window=5, n_kv_heads=2),
    "local_global": dict(layer_kinds=("local", "global"), sliding_window=4, rope=RopeConfig(theta=1e6),
                         rope_local=RopeConfig(theta=1e4), norm_placement="sandwich",
                         norm=NormConfig(weight_offset=1.0, dtype_order="scale_then_cast")),
    "softcap": dict(attn_softcap=2.0, final_softcap=3.0, layer_kinds=("local", "global"), sliding_window=6),
    "alibi": dict(layer_positions=("alibi", "alibi"), norm=NormConfig(kind="layer", bias=True)),
    "alibi_window": dict(layer_positions=("alibi", "alibi"), layer_kinds=("local", "local"), sliding_window=7),
    "relative": dict(layer_positions=("relative", "relative"), relative_buckets=8, relative_max_distance=16),
    "learned": dict(absolute_positions="learned", position_offset=2, layer_positions=("none", "none"),
                    norm_placement="post", final_norm=False, activation="gelu", gated=False),
    "sinusoidal": dict(absolute_positions="sinusoidal", layer_positions=("none", "none"),
                       norm_placement="parallel_shared", norm=NormConfig(kind="layer")),
    "nope": dict(layer_positions=("none", "rope"), norm_placement="parallel_separate"),
    "dynamic_within_max": dict(rope=RopeConfig(scaling="dynamic", factor=2.0), max_positions=64),
    "yarn": dict(rope=RopeConfig(scaling="yarn", factor=4.0, original_max_positions=8), max_positions=32),
    "partial_interleaved": dict(rope=RopeConfig(layout="interleaved", fraction=0.5), head_dim=16),
    "qk_norms": dict(qk_norm="head", n_kv_heads=1, q_bias=True, k_bias=True, v_bias=True, o_bias=True,
                     mlp_bias=True, lm_head_bias=True),
    "qk_projection": dict(qk_norm="projection", norm_placement="output", rope=RopeConfig(fp32_tables=True)),
    "tied_scaled": dict(tie_embeddings=True, embed_scale=5.0, logit_scale=0.3, attn_scale=0.2),
}


def _incremental(model, ids, chunks):
    """Feed `ids` in chunks of the given sizes, then one token at a time."""
    cache = model.new_cache()
    out, start = [], 0
    with torch.no_grad():
        for size in chunks:
            out.append(model(ids[:, start:start + size], cache=cache))
            start += size
        for t in range(start, ids.shape[1]):
            out.append(model(ids[:, t:t + 1], cache=cache))
    assert cache.length == ids.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_equals_full_forward(name, backend):
    model = build(tiny(**CONFIGS[name])).set_attention(backend)
    ids = tokens(seq=18)
    with torch.no_grad():
        full = model(ids)
    for chunks in ((8,), (1, 6)):
        diff = max_diff(_incremental(model, ids, chunks), full)
        assert diff <= 1e-5, (chunks, diff)


def test_cache_holds_keys_after_rope_per_layer():
    model = build(tiny(n_kv_heads=2))
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(seq=7), cache=cache)
    assert cache.length == 7
    assert all(k.shape == (2, 2, 7, 8) for k in cache.keys) and all(v.shape == (2, 2, 7, 8) for v in cache.values)
    assert model.cfg.kv_cache_bytes_per_token(4) * 7 * 2 == sum(t.numel() * 4 for t in cache.keys + cache.values)


def test_cache_must_not_be_ignored():
    """Guards the equality test: decoding the last token without its cache gives other logits."""
    model = build(tiny())
    ids = tokens(seq=12)
    with torch.no_grad():
        full = model(ids)
        alone = model(ids[:, -1:])
    assert max_diff(alone[:, 0], full[:, -1]) > 1e-3


def _argmax_loop(model, ids, steps):
    out = ids
    with torch.no_grad():
        for _ in range(steps):
            out = torch.cat((out, model(out)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return out


@pytest.mark.parametrize("name", ["llama", "window", "softcap", "alibi", "learned"])
def test_generate_equals_argmax_loop_without_cache(name):
    model = build(tiny(**CONFIGS[name]))
    ids = tokens(seq=6)
    out = model.generate(ids, max_new_tokens=12)
    assert out.shape == (2, 18) and torch.equal(out[:, :6], ids)
    assert torch.equal(out, _argmax_loop(model, ids, 12))


def test_generate_stops_at_eos():
    model = build(tiny())
    ids = tokens(seq=6, batch=1)
    free = model.generate(ids, max_new_tokens=10)
    eos = int(free[0, 9])  # the 4th generated token
    first = int((free[0, 6:] == eos).nonzero()[0])  # it may also appear earlier
    stopped = model.generate(ids, max_new_tokens=10, eos_token_id=eos)
    assert torch.equal(stopped, free[:, :6 + first + 1])
    assert torch.equal(model.generate(ids, max_new_tokens=0), ids)
