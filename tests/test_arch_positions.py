"""Position schemes: sinusoidal, learned (with offset), RoPE (layouts, partial, every scaling type
against transformers), T5 relative buckets, ALiBi, NoPE and per-layer mixes."""

from __future__ import annotations

import math

import pytest
import torch
from arch_helpers import additive_mask, build, hf_eager_attention, max_diff, tiny, tokens, variant
from transformers import GPTNeoXConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.cohere2.modeling_cohere2 import apply_rotary_pos_emb as cohere2_apply_rotary
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply_rotary
from transformers.models.t5.modeling_t5 import T5Attention

from lmconvert.arch import RopeConfig
from lmconvert.arch.context import Context
from lmconvert.arch.positions import alibi_bias, alibi_slopes, relative_buckets, sinusoidal
from lmconvert.arch.rope import SCALINGS, Rotary, _dynamic, apply_rotary

# ----------------------------------------------------------------------------- sinusoidal


def test_sinusoidal_values_are_sin_even_cos_odd():
    d = 32
    positions = torch.arange(0, 50)
    table = sinusoidal(positions, d, torch.float32)
    p = positions.double()[:, None]
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(table[:, 0::2].double(), torch.sin(p * inv), rtol=0, atol=1e-5)
    torch.testing.assert_close(table[:, 1::2].double(), torch.cos(p * inv), rtol=0, atol=1e-5)


def test_sinusoidal_dot_product_depends_only_on_offset():
    table = sinusoidal(torch.arange(0, 64), 32, torch.float32).double()
    gram = table @ table.T
    for delta in (0, 1, 5, 17):
        diagonal = torch.diagonal(gram, offset=delta)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=1e-4)
    assert abs(gram[0, 1] - gram[0, 5]) > 1e-2


def test_decoder_adds_sinusoidal_table():
    model = build(tiny(absolute_positions="sinusoidal", layer_positions=("none", "none")))
    ids = tokens()
    positions = torch.arange(3, 3 + ids.shape[1])
    with torch.no_grad():
        h = model.embed_tokens(ids, positions) - model.embed(ids)
    torch.testing.assert_close(h, sinusoidal(positions, 32, torch.float32).expand_as(h), rtol=0, atol=1e-6)
    assert not any("pos" in k for k in model.state_dict())


# ----------------------------------------------------------------------------- learned


@pytest.mark.parametrize("offset", [0, 2])
def test_learned_positions_read_row_p_plus_offset(offset):
    model = build(tiny(absolute_positions="learned", position_offset=offset, max_positions=40))
    assert model.pos_embed.weight.shape == (40 + offset, 32)
    ids = tokens(seq=12)
    positions = torch.arange(5, 17)
    with torch.no_grad():
        h = model.embed_tokens(ids, positions) - model.embed(ids)
    torch.testing.assert_close(h, model.pos_embed.weight[positions + offset].expand_as(h), rtol=0, atol=1e-6)
    if offset:  # rows below the offset are never read
        with torch.no_grad():
            before = model(ids)
            model.pos_embed.weight[:offset].add_(5.0)
            assert torch.equal(model(ids), before)
            model.pos_embed.weight[offset].add_(1.0)
            assert max_diff(model(ids), before) > 1e-3


# ----------------------------------------------------------------------------- RoPE


def _rotate(cfg: RopeConfig, x: torch.Tensor, positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    rotary = Rotary(cfg, head_dim, 64)
    cos, sin = rotary.tables(positions, x.dtype)
    return apply_rotary(x, cos, sin, cfg.layout)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_scores_depend_only_on_relative_offset(layout, fraction):
    cfg = RopeConfig(theta=100.0, layout=layout, fraction=fraction)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(m, n):
        return (_rotate(cfg, q, torch.tensor([m]), 16) * _rotate(cfg, k, torch.tensor([n]), 16)).sum().item()

    for delta in (0, 3, 11):
        assert score(delta, 0) == pytest.approx(score(20 + delta, 20), abs=1e-4)
        assert score(delta, 0) == pytest.approx(score(40 + delta, 40), abs=1e-4)
    assert abs(score(3, 0) - score(5, 0)) > 1e-2
    # rotation preserves norms
    rotated = _rotate(cfg, q, torch.tensor([9]), 16)
    torch.testing.assert_close(rotated.norm(), q.norm())


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_partial_rope_leaves_the_other_dims_alone(layout):
    cfg = RopeConfig(layout=layout, fraction=0.25)
    x = torch.randn(2, 3, 10, 32, generator=torch.Generator().manual_seed(1))
    y = _rotate(cfg, x, torch.arange(10), 32)
    assert torch.equal(y[..., 8:], x[..., 8:])
    assert max_diff(y[..., :8], x[..., :8]) > 1e-2
    # the rotated part is a full rotation of an 8-dim head
    torch.testing.assert_close(y[..., :8], _rotate(RopeConfig(layout=layout), x[..., :8], torch.arange(10), 8))


def test_rope_layouts_differ():
    x = torch.randn(1, 1, 6, 16, generator=torch.Generator().manual_seed(1))
    half = _rotate(RopeConfig(layout="half"), x, torch.arange(6), 16)
    pairs = _rotate(RopeConfig(layout="interleaved"), x, torch.arange(6), 16)
    assert max_diff(half, pairs) > 1e-2


def _hf_config(rope: RopeConfig, head_dim: int = 16, max_positions: int = 64) -> LlamaConfig:
    params = {"rope_type": "default" if rope.scaling == "none" else rope.scaling, "rope_theta": rope.theta,
              "partial_rotary_factor": rope.fraction}
    if rope.scaling != "none":
        params["factor"] = rope.factor
    if rope.scaling in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = rope.original_max_positions
    if rope.scaling == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor)
    if rope.scaling == "yarn":
        params.update(beta_fast=rope.beta_fast, beta_slow=rope.beta_slow, truncate=rope.truncate)
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(rope, key) is not None:
                params[key] = getattr(rope, key)
    return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=max_positions, rope_parameters=params)


ROPES = {
    "none": RopeConfig(theta=10000.0),
    "none_500k": RopeConfig(theta=5e5),
    "linear": RopeConfig(scaling="linear", factor=4.0),
    "dynamic": RopeConfig(scaling="dynamic", factor=2.0),
    "yarn": RopeConfig(scaling="yarn", factor=4.0, original_max_positions=16),
    "yarn_betas": RopeConfig(theta=5e5, scaling="yarn", factor=8.0, original_max_positions=32, beta_fast=16.0,
                             beta_slow=2.0),
    # correction range (-0.99, 2.02): floor/ceil would give (0, 3)
    "yarn_untruncated": RopeConfig(scaling="yarn", factor=8.0, original_max_positions=64, truncate=False),
    # correction range (1.6, 15.6) -> (1, 16), clamped to dim - 1 = 15
    "yarn_clamped": RopeConfig(theta=100.0, scaling="yarn", factor=4.0, original_max_positions=512, beta_slow=0.01),
    "yarn_mscale": RopeConfig(scaling="yarn", factor=40.0, original_max_positions=16, mscale=0.707,
                              mscale_all_dim=0.707),
    "yarn_mscale_uneven": RopeConfig(scaling="yarn", factor=4.0, original_max_positions=16, mscale=1.0,
                                     mscale_all_dim=0.5),
    "yarn_attention_factor": RopeConfig(scaling="yarn", factor=4.0, original_max_positions=16, attention_factor=1.3),
    "llama3": RopeConfig(theta=5e5, scaling="llama3", factor=8.0, original_max_positions=32),
    "llama3_custom": RopeConfig(scaling="llama3", factor=4.0, original_max_positions=24, low_freq_factor=2.0,
                                high_freq_factor=8.0),
    "partial_linear": RopeConfig(scaling="linear", factor=2.0, fraction=0.5),
    "partial_yarn": RopeConfig(scaling="yarn", factor=4.0, original_max_positions=16, fraction=0.5),
    "partial_llama3": RopeConfig(scaling="llama3", factor=8.0, original_max_positions=32, fraction=0.5),
}


@pytest.mark.parametrize("name", list(ROPES))
def test_inverse_frequencies_match_transformers(name):
    rope = ROPES[name]
    config = _hf_config(rope)
    if rope.scaling == "none":
        # transformers' default function ignores partial_rotary_factor (llama); compare at full width
        expected, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        expected, scaling = ROPE_INIT_FUNCTIONS[rope.scaling](config, None)
    rotary = Rotary(rope, 16, 64)
    assert rotary.dim == int(16 * rope.fraction)
    assert torch.equal(rotary.inv_freq, expected), (rotary.inv_freq, expected)
    assert rotary.scaling == pytest.approx(scaling, rel=1e-12)


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_partial_default_frequencies_match_gpt_neox(fraction):
    config = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": fraction})
    expected, _ = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config)
    rotary = Rotary(RopeConfig(fraction=fraction), 16, 64)
    assert torch.equal(rotary.inv_freq, expected)
    positions = torch.arange(20)
    cos, sin = rotary.tables(positions, torch.float32)
    ref_cos, ref_sin = GPTNeoXRotaryEmbedding(config)(torch.zeros(1), positions[None])
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])


@pytest.mark.parametrize("name", ["none", "linear", "yarn", "yarn_mscale_uneven", "llama3", "dynamic"])
def test_cos_sin_tables_match_transformers(name):
    """Includes the yarn attention scaling of cos and sin, and positions beyond max_positions."""
    rope = ROPES[name]
    ref = LlamaRotaryEmbedding(_hf_config(rope))
    positions = torch.arange(0, 48)
    cos, sin = Rotary(rope, 16, 64).tables(positions, torch.float32)
    ref_cos, ref_sin = ref(torch.zeros(1, dtype=torch.float32), positions[None])
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])
    bf_cos, _ = Rotary(rope, 16, 64).tables(positions, torch.bfloat16)
    assert bf_cos.dtype == torch.bfloat16 and torch.equal(bf_cos, ref_cos[0].bfloat16())


def test_fp32_tables_stay_fp32():
    cos, sin = Rotary(RopeConfig(fp32_tables=True), 16, 64).tables(torch.arange(8), torch.bfloat16)
    assert cos.dtype == sin.dtype == torch.float32
    x = torch.randn(1, 2, 8, 16).bfloat16()
    out = apply_rotary(x, cos, sin, "half")
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() * cos + torch.cat((-x[..., 8:], x[..., :8]), -1).float() * sin).bfloat16())


@pytest.mark.parametrize("seq_len", [65, 100, 300])
def test_dynamic_frequencies_beyond_max_positions_match_transformers(seq_len):
    rope = ROPES["dynamic"]
    config = _hf_config(rope)
    ours, _ = _dynamic(rope, 16, seq_len, 64)
    theirs, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=torch.tensor(seq_len))
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, SCALINGS["none"](rope, 16, seq_len, 64)[0])
    # and the table for a call that reaches seq_len uses them, as transformers' dynamic update does
    positions = torch.arange(seq_len - 5, seq_len)
    cos, sin = Rotary(rope, 16, 64).tables(positions, torch.float32)
    ref_cos, ref_sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions[None])
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])


def test_dynamic_frequencies_within_max_positions_are_the_base_ones():
    rope = ROPES["dynamic"]
    assert torch.equal(_dynamic(rope, 16, 64, 64)[0], SCALINGS["none"](rope, 16, 64, 64)[0])
    cos, _ = Rotary(rope, 16, 64).tables(torch.arange(64), torch.float32)
    base, _ = Rotary(ROPES["none"], 16, 64).tables(torch.arange(64), torch.float32)
    assert torch.equal(cos, base)


@pytest.mark.parametrize("layout,apply", [("half", llama_apply_rotary), ("interleaved", cohere2_apply_rotary)])
def test_rotation_matches_transformers(layout, apply):
    rope = RopeConfig(layout=layout, theta=500.0)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 12, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g)
    positions = torch.arange(12)
    cos, sin = Rotary(rope, 16, 64).tables(positions, torch.float32)
    ref_q, ref_k = apply(q, k, cos[None], sin[None])
    torch.testing.assert_close(apply_rotary(q, cos, sin, layout), ref_q, rtol=0, atol=0)
    torch.testing.assert_close(apply_rotary(k, cos, sin, layout), ref_k, rtol=0, atol=0)


# ----------------------------------------------------------------------------- T5 relative buckets


@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (16, 64), (8, 20), (32, 40), (8, 5)])
def test_relative_buckets_match_t5(buckets, max_distance):
    q = torch.arange(0, 300)[:, None]
    k = torch.arange(0, 300)[None, :]
    ours = relative_buckets(q - k, buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(k - q, bidirectional=False, num_buckets=buckets,
                                                   max_distance=max_distance)
    causal = k <= q
    assert torch.equal(ours[causal], theirs[causal])
    assert int(ours.max()) == buckets - 1 and int(ours.min()) == 0


def test_relative_bias_is_one_shared_table_and_translation_invariant():
    model = build(tiny(layer_positions=("relative", "relative"), relative_buckets=8, relative_max_distance=16))
    assert [k for k in model.state_dict() if "rel" in k] == ["rel_bias.weight"]
    assert model.layers[0].attn.relative is model.layers[1].attn.relative is model.rel_bias
    q, k = torch.arange(10, 20), torch.arange(0, 20)
    torch.testing.assert_close(model.rel_bias(q, k), model.rel_bias(q + 50, k + 50), rtol=0, atol=0)
    bias = model.rel_bias(q, k)
    assert bias.shape == (4, 10, 20)
    assert torch.equal(bias[:, 3, 13], model.rel_bias.weight[0])  # distance 0 -> bucket 0
    assert torch.equal(bias[:, 3, 10], model.rel_bias.weight[3])  # distance 3 -> bucket 3 (exact range)
    model.to(torch.bfloat16)  # the layers hold the very table the Decoder owns
    assert model.layers[0].attn.relative.weight.dtype == torch.bfloat16


def test_relative_bias_changes_the_output():
    model = build(tiny(layer_positions=("relative", "none")))
    ids = tokens()
    with torch.no_grad():
        before = model(ids)
        model.rel_bias.weight[1].add_(1.0)
        assert max_diff(model(ids), before) > 1e-3


# ----------------------------------------------------------------------------- ALiBi


@pytest.mark.parametrize("n_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 40])
def test_alibi_slopes_match_bloom(n_heads):
    alibi = build_alibi_tensor(torch.ones(1, 2), n_heads, torch.float32)  # (H, 1, 2): slope * key position
    assert torch.equal(alibi_slopes(n_heads), alibi[:, 0, 1])


def test_alibi_bias_is_minus_slope_times_distance():
    slopes = alibi_slopes(8)
    q, k = torch.arange(4, 10), torch.arange(10)
    bias = alibi_bias(8, q, k)
    expected = slopes[:, None, None] * (k[None, None, :] - q[None, :, None]).float()
    assert torch.equal(bias, expected)
    assert (bias[:, :, :4] < 0).all() and slopes[0] == 0.5 and slopes[-1] == 2 ** -8
    torch.testing.assert_close(alibi_bias(8, q + 100, k + 100), bias, rtol=0, atol=0)


def test_alibi_attention_matches_bloom_formulation():
    """Bloom adds slope * key_position (no query term): the same softmax, by shift invariance."""
    model = build(tiny(n_layers=1, n_heads=6, d_model=48, layer_positions=("alibi",)))
    attn = model.layers[0].attn
    x = torch.randn(2, 20, 48, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(20)
    with torch.no_grad():
        ours = attn(x, Context(positions, positions, torch.float32))
        q = attn.q(x).view(2, 20, 6, 8).transpose(1, 2)
        k = attn.k(x).view(2, 20, 6, 8).transpose(1, 2)
        v = attn.v(x).view(2, 20, 6, 8).transpose(1, 2)
        bloom = build_alibi_tensor(torch.ones(2, 20), 6, torch.float32).view(2, 6, 1, 20)
        mask = bloom + additive_mask(torch.ones(20, 20, dtype=torch.bool).tril())
        ref = attn.o(hf_eager_attention(q, k, v, mask, 8 ** -0.5))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_alibi_attention_is_translation_invariant():
    model = build(tiny(n_layers=1, layer_positions=("alibi",)))
    attn = model.layers[0].attn
    x = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = attn(x, Context(torch.arange(12), torch.arange(12), torch.float32))
        b = attn(x, Context(torch.arange(12) + 1000, torch.arange(12) + 1000, torch.float32))
        nope = variant(model, layer_positions=("none",)).layers[0].attn
        c = nope(x, Context(torch.arange(12), torch.arange(12), torch.float32))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert max_diff(a, c) > 1e-3  # the bias does something


# ----------------------------------------------------------------------------- NoPE and per-layer mixes


def _last_after_permuting_prefix(model, until=None):
    ids = tokens(seq=16, batch=1)
    perm = torch.cat((torch.randperm(15, generator=torch.Generator().manual_seed(4)), torch.tensor([15])))
    with torch.no_grad():
        a = model.hidden_states(ids, until=until)[-1][:, -1]
        b = model.hidden_states(ids[:, perm], until=until)[-1][:, -1]
    return max_diff(a, b)


def test_nope_last_position_is_permutation_invariant():
    assert _last_after_permuting_prefix(build(tiny(n_layers=1, layer_positions=("none",)))) < 1e-5
    assert _last_after_permuting_prefix(build(tiny(n_layers=1))) > 1e-3  # RoPE
    assert _last_after_permuting_prefix(build(tiny(n_layers=1, layer_positions=("alibi",)))) > 1e-3
    assert _last_after_permuting_prefix(build(tiny(n_layers=1, layer_positions=("relative",)))) > 1e-3


@pytest.mark.parametrize("absolute", ["learned", "sinusoidal"])
def test_absolute_positions_break_permutation_invariance(absolute):
    model = build(tiny(n_layers=1, layer_positions=("none",), absolute_positions=absolute))
    assert _last_after_permuting_prefix(model) > 1e-3


def test_per_layer_positions():
    model = build(tiny(layer_positions=("rope", "none")))
    assert model.layers[0].attn.rotary is not None and model.layers[1].attn.rotary is None
    assert _last_after_permuting_prefix(model, until=1) > 1e-3

    model = build(tiny(layer_positions=("none", "rope")))
    assert model.layers[0].attn.rotary is None and model.layers[1].attn.rotary is not None
    assert _last_after_permuting_prefix(model, until=1) < 1e-5
    assert _last_after_permuting_prefix(model) > 1e-3

    model = build(tiny(n_layers=3, layer_positions=("alibi", "relative", "rope")))
    assert [layer.attn.position for layer in model.layers] == ["alibi", "relative", "rope"]
    assert model.layers[1].attn.relative is model.rel_bias and model.layers[0].attn.relative is None
    with torch.no_grad():
        assert math.isfinite(float(model(tokens()).sum()))


# ----------------------------------------------------------------------------- attention temperature


@pytest.mark.parametrize("past", [0, 37])
def test_query_temperature_is_ministral3s_bit_for_bit(past):
    """Ministral 3's `get_llama_4_attn_scale` of the absolute positions, the cached tokens counted (past),
    per row where the positions are (B, T): the same fp32 numbers, shaped to broadcast over heads."""
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    ctx = Context.build(past, 20, torch.float32, torch.device("cpu"))
    theirs = get_llama_4_attn_scale(torch.arange(past, past + 20)[None], 0.1, 8)  # (1, 1, T, 1)
    assert theirs.dtype == torch.float32
    assert torch.equal(ctx.query_temperature(0.1, 8), theirs[0, 0])
    rows = torch.stack([torch.arange(past, past + 20), torch.arange(past + 5, past + 25)])
    ctx = Context.build(past, 20, torch.float32, torch.device("cpu"), positions=rows)
    assert torch.equal(ctx.query_temperature(0.1, 8), get_llama_4_attn_scale(rows, 0.1, 8))
