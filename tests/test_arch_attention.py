"""Attention: GQA/MQA vs MHA, head_dim, score scale, QK norm, soft-cap, sliding windows, local/global
layers and the two backends, with transformers' eager attention as the element-by-element reference."""

from __future__ import annotations

import pytest
import torch
from arch_helpers import additive_mask, build, hf_eager_attention, max_diff, tiny, tokens, variant
from transformers import LlamaConfig
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from lmconvert.arch import ConfigError, RopeConfig
from lmconvert.arch.attention import _eager
from lmconvert.arch.context import Context

BACKENDS = ("sdpa", "eager")


def _logits(model, ids, backend="sdpa"):
    with torch.no_grad():
        return model.set_attention(backend)(ids)


def _hf_layer(attn, x: torch.Tensor, allowed: torch.Tensor, theta: float | None, softcap=None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """One attention layer computed by transformers' ops: llama RoPE tables and rotation, Gemma 2's
    eager attention (scale, soft-cap, additive mask, fp32 softmax), from our projections."""
    cfg = attn.cfg
    B, T, _ = x.shape
    q = attn.q(x)
    k = attn.k(x)
    if cfg.qk_norm == "projection":
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = q.view(B, T, cfg.n_heads, cfg.head_dim)
    k = k.view(B, T, cfg.n_kv_heads, cfg.head_dim)
    if cfg.qk_norm == "head":
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = attn.v(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    if theta is not None:
        rope = LlamaRotaryEmbedding(LlamaConfig(hidden_size=cfg.n_heads * cfg.head_dim, num_attention_heads=cfg.n_heads,
                                                head_dim=cfg.head_dim, rope_parameters={"rope_type": "default",
                                                                                        "rope_theta": theta}))
        cos, sin = rope(x, torch.arange(T)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    mask = additive_mask(allowed) if bias is None else additive_mask(allowed) + bias
    out = hf_eager_attention(q, k, v, mask, cfg.score_scale, softcap)
    return attn.o(out)


def _hf_mask(T: int, window: int | None) -> torch.Tensor:
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    idx = torch.arange(T)
    return fn(0, 0, idx[:, None], idx[None, :])


def _x(T=20, d=32, seed=5):
    return torch.randn(2, T, d, generator=torch.Generator().manual_seed(seed))


def _layer(model, x, backend="sdpa"):
    attn = model.layers[0].attn
    attn.backend = backend
    positions = torch.arange(x.shape[1])
    with torch.no_grad():
        return attn(x, Context(positions, positions, x.dtype))


# ----------------------------------------------------------------------------- reference layer


CASES = {
    "mha": dict(),
    "gqa": dict(n_kv_heads=2, q_bias=True, k_bias=True, v_bias=True, o_bias=True),
    "mqa": dict(n_kv_heads=1),
    "head_dim": dict(d_model=40, n_heads=4, n_kv_heads=2, head_dim=16),
    "scale": dict(attn_scale=0.07),
    "qk_head": dict(qk_norm="head", n_kv_heads=2),
    "qk_projection": dict(qk_norm="projection", n_kv_heads=2),
    "softcap": dict(attn_softcap=2.0, n_kv_heads=2),
    "window": dict(layer_kinds=("local",), sliding_window=5, n_kv_heads=2),
    "window_softcap": dict(layer_kinds=("local",), sliding_window=3, attn_softcap=1.5),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_attention_layer_matches_transformers_ops(case, backend):
    cfg = tiny(n_layers=1, rope=RopeConfig(theta=500.0), **CASES[case])
    model = build(cfg)
    x = _x(d=cfg.d_model)
    with torch.no_grad():
        ref = _hf_layer(model.layers[0].attn, x, _hf_mask(20, cfg.window_for(0)), 500.0, cfg.attn_softcap)
    torch.testing.assert_close(_layer(model, x, backend), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 3, 7, 30])
def test_window_mask_is_transformers_mask(window):
    ctx = Context(torch.arange(24), torch.arange(24), torch.float32)
    allowed = ctx.allowed(window)
    expected = _hf_mask(24, window)
    if window >= 24:
        assert allowed is None or torch.equal(allowed, expected)
        assert torch.equal(expected, _hf_mask(24, None))
    else:
        assert torch.equal(allowed, expected)
        assert int(allowed.sum(-1).max()) == window  # w keys including the query itself
    # with a cache: queries 20..23 over keys 0..23
    ctx = Context(torch.arange(20, 24), torch.arange(24), torch.float32)
    sub = ctx.allowed(window)
    assert torch.equal(sub if sub is not None else torch.ones(4, 24, dtype=torch.bool), expected[20:])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", ["alibi", "relative"])
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_position_bias_is_added_after_the_softcap(position, softcap, backend):
    """Like transformers' float masks, additive position biases join after the cap."""
    cfg = tiny(n_layers=1, layer_positions=(position,), attn_softcap=softcap, n_kv_heads=2)
    model = build(cfg)
    x = _x()
    positions = torch.arange(20)
    attn = model.layers[0].attn
    with torch.no_grad():
        bias = attn._position_bias(Context(positions, positions, torch.float32))
        ref = _hf_layer(attn, x, _hf_mask(20, None), None, softcap, bias=bias)
    torch.testing.assert_close(_layer(model, x, backend), ref, rtol=1e-5, atol=1e-5)
    assert bias.abs().max() > 0.1


# ----------------------------------------------------------------------------- GQA / MQA


def _as_mha(model):
    """An MHA model computing the same function: kv head j serves query heads j*g .. j*g+g-1."""
    cfg = model.cfg
    groups = cfg.n_heads // cfg.n_kv_heads
    mha = build(tiny(**{**_overrides(cfg), "n_kv_heads": cfg.n_heads}))
    state = dict(model.state_dict())
    for name, tensor in model.state_dict().items():
        if ".attn.k." in name or ".attn.v." in name:
            state[name] = tensor.view(cfg.n_kv_heads, cfg.head_dim, *tensor.shape[1:]).repeat_interleave(
                groups, dim=0).reshape(cfg.q_dim, *tensor.shape[1:])
    mha.load_state_dict(state)
    return mha


def _overrides(cfg):
    return {k: getattr(cfg, k) for k in ("d_model", "n_heads", "head_dim", "k_bias", "v_bias", "n_layers")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv", [2, 1])
def test_grouped_query_attention_equals_mha_with_repeated_kv(kv, backend):
    model = build(tiny(n_kv_heads=kv, k_bias=True, v_bias=True))
    assert model.layers[0].attn.k.weight.shape == (kv * 8, 32)
    ids = tokens()
    torch.testing.assert_close(_logits(model, ids, backend), _logits(_as_mha(model), ids, backend),
                               rtol=1e-5, atol=1e-5)


def test_gqa_groups_are_contiguous_not_tiled():
    """Guards the test above: tiling kv heads (h % KV instead of h // (H/KV)) gives another function."""
    model = build(tiny(n_kv_heads=2))
    mha = _as_mha(model)
    state = dict(model.state_dict())
    for name, tensor in model.state_dict().items():
        if ".attn.k." in name or ".attn.v." in name:
            state[name] = tensor.view(2, 8, -1).repeat(2, 1, 1).reshape(32, -1)
    mha.load_state_dict(state)
    ids = tokens()
    assert max_diff(_logits(model, ids), _logits(mha, ids)) > 1e-3


def test_head_dim_independent_of_d_model():
    model = build(tiny(d_model=40, n_heads=4, n_kv_heads=2, head_dim=16))
    attn = model.layers[0].attn
    assert attn.q.weight.shape == (64, 40) and attn.k.weight.shape == (32, 40) and attn.o.weight.shape == (40, 64)
    assert model.layers[0].attn.rotary.dim == 16
    assert _logits(model, tokens()).shape == (2, 24, 64)


# ----------------------------------------------------------------------------- score scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_attn_scale_equals_default_scale_with_rescaled_queries(backend):
    s = 0.05
    model = build(tiny(attn_scale=s, q_bias=True))
    default = variant(model, attn_scale=None)
    with torch.no_grad():
        for layer in default.layers:
            layer.attn.q.weight.mul_(s / 8 ** -0.5)
            layer.attn.q.bias.mul_(s / 8 ** -0.5)
    ids = tokens()
    torch.testing.assert_close(_logits(model, ids, backend), _logits(default, ids, backend), rtol=1e-5, atol=1e-5)
    assert max_diff(_logits(model, ids, backend), _logits(variant(model, attn_scale=None), ids, backend)) > 1e-3


# ----------------------------------------------------------------------------- QK norm


def _scale_q_rows(model, rows, factor):
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.q.weight[rows].mul_(factor)


def test_qk_norm_per_head_is_invariant_to_one_heads_scale():
    model = build(tiny(qk_norm="head", n_kv_heads=2))
    assert model.layers[0].attn.q_norm.weight.shape == (8,) and model.layers[0].attn.k_norm.weight.shape == (8,)
    ids = tokens()
    before = _logits(model, ids)
    _scale_q_rows(model, slice(8, 16), 3.0)
    torch.testing.assert_close(_logits(model, ids), before, rtol=1e-4, atol=1e-4)
    without = build(tiny(qk_norm="none", n_kv_heads=2))
    before = _logits(without, ids)
    _scale_q_rows(without, slice(8, 16), 3.0)
    assert max_diff(_logits(without, ids), before) > 1e-3


def test_qk_norm_over_projection_is_invariant_to_global_scale_only():
    model = build(tiny(qk_norm="projection", n_kv_heads=2))
    assert model.layers[0].attn.q_norm.weight.shape == (32,) and model.layers[0].attn.k_norm.weight.shape == (16,)
    ids = tokens()
    before = _logits(model, ids)
    _scale_q_rows(model, slice(None), 3.0)
    torch.testing.assert_close(_logits(model, ids), before, rtol=1e-4, atol=1e-4)
    _scale_q_rows(model, slice(8, 16), 3.0)
    assert max_diff(_logits(model, ids), before) > 1e-3


def test_qk_norm_weights_matter():
    for kind in ("head", "projection"):
        model = build(tiny(qk_norm=kind))
        ids = tokens()
        before = _logits(model, ids)
        with torch.no_grad():
            model.layers[0].attn.k_norm.weight.mul_(2.0)
        assert max_diff(_logits(model, ids), before) > 1e-3


# ----------------------------------------------------------------------------- soft-cap


def _probabilities(q, k, scale, cap, allowed=None):
    """Attention probabilities from `_eager`, read off through identity values (head_dim == S)."""
    S = k.shape[-2]
    v = torch.eye(S).expand(q.shape[0], k.shape[1], S, S)
    return _eager(q, k, v, scale, cap, None, allowed, 0.0)


def test_softcap_probabilities_are_softmax_of_capped_scores():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 12, 12, generator=g) * 3, torch.randn(1, 2, 12, 12, generator=g) * 3
    allowed = torch.ones(12, 12, dtype=torch.bool).tril()
    p = _probabilities(q, k, 0.5, 4.0, allowed)
    s = (q @ k.transpose(-1, -2)) * 0.5
    expected = torch.softmax((torch.tanh(s / 4.0) * 4.0).masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(p, expected, rtol=1e-6, atol=1e-6)
    assert max_diff(p, torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)) > 1e-2


def test_tiny_softcap_keeps_attention_far_from_one_hot():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 16, 16, generator=g) * 1e3, torch.randn(1, 1, 16, 16, generator=g)
    capped = _probabilities(q, k, 1.0, 0.5)
    ratio = capped.max(-1).values / capped.min(-1).values  # per query row: at most e^(2 cap)
    assert float(ratio.max()) <= float(torch.exp(torch.tensor(1.0))) + 1e-4
    assert float(capped.max()) < 0.15
    assert float(_probabilities(q, k, 1.0, None).max(-1).values.min()) > 0.99  # uncapped: one-hot


def test_softcap_in_model_matters_and_runs_eager_under_sdpa():
    model = build(tiny(attn_softcap=1.0))
    ids = tokens()
    assert max_diff(_logits(model, ids), _logits(variant(model, attn_softcap=None), ids)) > 1e-3
    assert torch.equal(_logits(model, ids, "sdpa"), _logits(model, ids, "eager"))


# ----------------------------------------------------------------------------- sinks


def _gpt_oss_attention(q, k, v, mask, scale, sinks):
    """transformers' gpt-oss eager attention (sinks joining the softmax) on (B, H|KV, T, D) tensors."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], training=False, sinks=sinks)
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=scale)
    return out.transpose(1, 2)  # back to (B, H, T, D), as _eager returns it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.bitexact
def test_sinks_are_gpt_oss_eager_attention_bit_for_bit(dtype, window):
    """attn_sinks: gpt-oss's eager_attention_forward op for op (the sink concatenated, the row max
    subtracted and the softmax taken in the scores' dtype, the sink dropped, then cast), causal and
    windowed, over 4 query heads on 2 KV heads; and the sinks matter."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 12, 8, generator=g).to(dtype) for h in (4, 2, 2))
    sinks = torch.randn(4, generator=g).to(dtype)
    allowed = torch.ones(12, 12, dtype=torch.bool).tril()
    if window is not None:
        allowed &= ~torch.ones(12, 12, dtype=torch.bool).tril(-window)
    ours = _eager(q, k, v, 0.35, None, None, allowed, 0.0, sinks=sinks)
    assert torch.equal(ours, _gpt_oss_attention(q, k, v, additive_mask(allowed, dtype), 0.35, sinks))
    assert max_diff(ours, _eager(q, k, v, 0.35, None, None, allowed, 0.0)) > 1e-2


def test_sinks_in_model_matter_and_run_eager_under_sdpa():
    """A sink only takes weight from the keys: a very negative one is none at all."""
    model = build(tiny(attn_sinks=True))
    ids = tokens()
    assert torch.equal(_logits(model, ids, "sdpa"), _logits(model, ids, "eager"))
    with torch.no_grad():
        for block in model.layers:
            block.attn.sinks.fill_(-1e4)
    plain = build(tiny())  # the same weights but the sinks
    plain.load_state_dict({n: t for n, t in model.state_dict().items() if not n.endswith(".sinks")})
    assert max_diff(_logits(model, ids), _logits(plain, ids, "eager")) < 1e-5
    with torch.no_grad():
        for block in model.layers:
            block.attn.sinks.fill_(2.0)
    assert max_diff(_logits(model, ids), _logits(plain, ids, "eager")) > 1e-3


# ----------------------------------------------------------------------------- sliding window


def _change(ids, position, vocab=64):
    out = ids.clone()
    out[:, position] = (out[:, position] + 7) % vocab
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [1, 4, 6])
def test_sliding_window_counts_the_query_itself(window, backend):
    model = build(tiny(n_layers=1, layer_kinds=("local",), sliding_window=window))
    ids = tokens(seq=20)
    q = 15
    base = _logits(model, ids, backend)[:, q]
    assert torch.equal(_logits(model, _change(ids, q - window), backend)[:, q], base)
    assert max_diff(_logits(model, _change(ids, q - window + 1), backend)[:, q], base) > 1e-4


def test_window_longer_than_sequence_is_global():
    model = build(tiny(layer_kinds=("local", "local"), sliding_window=24))
    ids = tokens(seq=24)
    torch.testing.assert_close(_logits(model, ids), _logits(variant(model, layer_kinds=None), ids),
                               rtol=1e-5, atol=1e-5)
    assert max_diff(_logits(variant(model, sliding_window=23), ids), _logits(model, ids)) > 1e-4


LOCAL = RopeConfig(theta=10000.0)
GLOBAL = RopeConfig(theta=1e6)


def test_local_layer_uses_local_rope():
    """A 1-layer local model with a window >= T is a global model whose `rope` is the local RopeConfig."""
    local = build(tiny(n_layers=1, layer_kinds=("local",), sliding_window=32, rope=GLOBAL, rope_local=LOCAL))
    as_global = variant(local, layer_kinds=None, sliding_window=None, rope=LOCAL, rope_local=None)
    ids = tokens(seq=24)
    torch.testing.assert_close(_logits(local, ids), _logits(as_global, ids), rtol=1e-5, atol=1e-5)
    assert max_diff(_logits(local, ids), _logits(variant(as_global, rope=GLOBAL), ids)) > 1e-4


def test_local_global_pattern():
    model = build(tiny(layer_kinds=("local", "global"), sliding_window=4, rope=GLOBAL, rope_local=LOCAL))
    assert model.layers[0].attn.rotary.cfg == LOCAL and model.layers[0].attn.window == 4
    assert model.layers[1].attn.rotary.cfg == GLOBAL and model.layers[1].attn.window is None
    ids = tokens(seq=20)
    q, far = 15, 15 - 4
    with torch.no_grad():
        first = model.hidden_states(ids, until=1)[-1][:, q]
        assert torch.equal(model.hidden_states(_change(ids, far), until=1)[-1][:, q], first)
    assert max_diff(_logits(model, _change(ids, far))[:, q], _logits(model, ids)[:, q]) > 1e-4  # global layer sees it
    # each RoPE config reaches its own layers
    assert max_diff(_logits(variant(model, rope_local=RopeConfig(theta=50.0)), ids), _logits(model, ids)) > 1e-4
    assert max_diff(_logits(variant(model, rope=RopeConfig(theta=50.0)), ids), _logits(model, ids)) > 1e-4


def test_shared_rotary_tables_per_rope_config():
    model = build(tiny(n_layers=4, layer_kinds=("local", "global", "local", "global"), sliding_window=4,
                       rope=GLOBAL, rope_local=LOCAL))
    rotaries = [layer.attn.rotary for layer in model.layers]
    assert rotaries[0] is rotaries[2] and rotaries[1] is rotaries[3] and rotaries[0] is not rotaries[1]


# ----------------------------------------------------------------------------- backends


BACKEND_CASES = {
    "alibi": dict(layer_positions=("alibi", "alibi")),
    "relative": dict(layer_positions=("relative", "rope")),
    "window": dict(layer_kinds=("local", "global"), sliding_window=5, n_kv_heads=2),
    "mqa": dict(n_kv_heads=1, qk_norm="head"),
}


@pytest.mark.parametrize("case", list(BACKEND_CASES))
def test_backends_agree(case):
    model = build(tiny(**BACKEND_CASES[case]))
    ids = tokens()
    torch.testing.assert_close(_logits(model, ids, "sdpa"), _logits(model, ids, "eager"), rtol=1e-5, atol=1e-5)


def test_unknown_backend_rejected():
    with pytest.raises(ConfigError, match="flash"):
        build(tiny()).set_attention("flash")


@pytest.mark.parametrize("past", [0, 5])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_mask_is_transformers_chunked_causal_mask(past: int, padded: bool) -> None:
    """Llama 4's chunked attention: a query sees the keys of its own chunk of positions, causally,
    the chunks counted from each row's first real token (transformers' chunked_overlay with its left
    padding), after `past` cached tokens as well as in a full forward."""
    from transformers.masking_utils import chunked_causal_mask_function, padding_mask_function

    chunk, T = 4, 11
    mask = torch.ones(2, past + T, dtype=torch.long)
    if padded:
        mask[1, :3] = 0
    left = (mask.cumsum(-1) == 0).sum(-1)
    fn = chunked_causal_mask_function(chunk, left)
    q, k = torch.arange(past, past + T), torch.arange(past + T)
    expected = torch.stack([fn(b, 0, q[:, None], k[None, :]) for b in range(2)])[:, None]
    if padded:
        expected = expected & torch.stack([padding_mask_function(mask.bool())(b, 0, q[:, None], k[None, :])
                                           for b in range(2)])[:, None]
    ctx = Context.build(past, T, torch.float32, torch.device("cpu"), attention_mask=mask if padded else None)
    ours = ctx.allowed(None, chunk)
    assert ours is not None and torch.equal(ours.expand_as(expected), expected)
    assert not ctx.is_plain_causal(None, chunk) and (past or padded or ctx.is_plain_causal(None, past + T))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_l2_qk_norm_is_llama4s_bit_for_bit(dtype: torch.dtype) -> None:
    """ArchConfig.qk_l2_norm: Llama4TextL2Norm (weightless, fp32, cast back) on each rotated head."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm

    from lmconvert.arch.attention import _l2_norm

    x = (torch.randn(2, 4, 9, 16, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    assert torch.equal(_l2_norm(x, 1e-5), Llama4TextL2Norm(1e-5)(x))


def test_llama4_temperature_follows_the_cache_index_not_the_positions() -> None:
    """Llama 4 numbers its NoPE layers' query scale by the token's index in the cache, whatever
    position ids say; Ministral 3's by the position. Both as fp32 (T, 1) scales."""
    positions = torch.tensor([[0, 0, 0, 1, 2, 3]])
    ctx = Context(torch.arange(2, 8), torch.arange(8), torch.float32, positions=positions)
    llama4 = ctx.query_temperature(0.5, 2, "llama4")
    index = torch.arange(2, 8).float()
    assert torch.equal(llama4, (torch.log1p(torch.floor((index + 1.0) / 2)) * 0.5 + 1.0)[:, None])
    assert ctx.query_temperature(0.5, 2).shape == (1, 1, 6, 1)


# ----------------------------------------------------------------------------- the attention output gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layer", [0, 1], ids=["sliding_rope", "global_nope"])
def test_output_gate_is_afmoe_attention_bit_for_bit(dtype: torch.dtype, layer: int) -> None:
    """ArchConfig.attn_output_gate="projection": transformers' own AfmoeAttention (eager), its
    weights ours: per-head QK norms, RoPE on the sliding layer only, then the output times
    sigmoid(gate_proj(x)) in the activation dtype before o_proj. Equal bit for bit in fp32 and bf16;
    and the gate matters."""
    from transformers import AfmoeConfig
    from transformers.models.afmoe.modeling_afmoe import AfmoeAttention, AfmoeRotaryEmbedding

    cfg = tiny(n_layers=2, n_kv_heads=2, qk_norm="head", attn_output_gate="projection", sliding_window=5,
               layer_kinds=("local", "global"), layer_positions=("rope", "none"), rope=RopeConfig(theta=500.0),
               norm={"eps": 1e-5, "dtype_order": "scale_then_cast"})
    model = build(cfg, dtype=dtype)
    ours = model.layers[layer].attn
    hf_cfg = AfmoeConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                         rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    hf_cfg._attn_implementation = "eager"
    ref = AfmoeAttention(hf_cfg, layer).to(dtype).eval()
    names = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "q_norm": "q_norm", "k_norm": "k_norm",
             "gate_proj": "out_gate"}
    ref.load_state_dict({f"{hf}.weight": ours.get_submodule(c).weight for hf, c in names.items()})
    for norm in (ref.q_norm, ref.k_norm):  # transformers keeps these in fp32 (_keep_in_fp32_modules)
        norm.float()
    x = _x(d=32).to(dtype)
    T = x.shape[1]
    positions = torch.arange(T)
    cos, sin = AfmoeRotaryEmbedding(hf_cfg)(x, positions[None])
    mask = additive_mask(_hf_mask(T, cfg.window_for(layer)), dtype)[None, None]
    with torch.no_grad():
        expected, _ = ref(x, (cos, sin), mask)
        got = _layer_at(model, layer, x)
        assert torch.equal(got, expected)
        ref.gate_proj.weight.zero_()  # sigmoid(0) = 1/2: the ungated output, halved
        assert max_diff(ref(x, (cos, sin), mask)[0], got) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layer", [0, 1], ids=["sliding_rope", "global_nope"])
def test_head_bias_gate_and_temperature_are_beam_attention_bit_for_bit(dtype: torch.dtype, layer: int) -> None:
    """attn_output_gate="projection_head_bias" and attn_temperature_form="beam": transformers' own BeamAttention
    (eager), its weights ours, at position ids 3000 on: per-head QK norms, RoPE with fp32 tables on the sliding
    layer, the query times exp(0.1 log1p((p + 1) / 2048)) in fp32 on the NoPE one, then the output times
    sigmoid(gate_proj(x) + gate_bias per head). Equal bit for bit in fp32 and bf16; the bias matters."""
    from transformers import BeamConfig
    from transformers.models.beam.modeling_beam import BeamAttention, BeamRotaryEmbedding, compute_attention_scaling

    cfg = tiny(n_layers=2, n_kv_heads=2, qk_norm="head", attn_output_gate="projection_head_bias", sliding_window=5,
               layer_kinds=("local", "global"), layer_positions=("rope", "none"),
               rope=RopeConfig(theta=500.0, fp32_tables=True), attn_temperature=0.1, attn_temperature_floor=2048,
               attn_temperature_form="beam", norm={"eps": 1e-6, "dtype_order": "scale_then_cast"})
    model = build(cfg, dtype=dtype)
    ours = model.layers[layer].attn
    with torch.no_grad():
        ours.out_gate_bias.copy_(torch.tensor([0.5, -1.0, 1.5, -0.25]))
    hf_cfg = BeamConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
                        layer_types=["sliding_attention", "full_attention"], sliding_window=5, rms_norm_eps=1e-6,
                        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                         "full_attention": None})
    hf_cfg._attn_implementation = "eager"
    ref = BeamAttention(hf_cfg, layer).to(dtype).eval()
    names = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "q_norm": "q_norm", "k_norm": "k_norm",
             "gate_proj": "out_gate"}
    ref.load_state_dict({**{f"{hf}.weight": ours.get_submodule(c).weight for hf, c in names.items()},
                         "gate_bias": ours.out_gate_bias})
    x = _x(d=32).to(dtype)
    T = x.shape[1]
    positions = torch.arange(3000, 3000 + T)
    rope = BeamRotaryEmbedding(hf_cfg)(x, positions[None], "sliding_attention") if layer == 0 else None
    scaling = compute_attention_scaling(positions[None]) if layer == 1 else None
    mask = additive_mask(_hf_mask(T, cfg.window_for(layer)), dtype)[None, None]
    ours.backend = "eager"
    with torch.no_grad():
        expected, _ = ref(x, rope, mask, attention_scaling=scaling)
        got = ours(x, Context(torch.arange(T), torch.arange(T), x.dtype, positions))
        assert torch.equal(got, expected)
        ref.gate_bias.zero_()
        assert max_diff(ref(x, rope, mask, attention_scaling=scaling)[0], got) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_head_output_gate_is_lfm3_attention_bit_for_bit(dtype: torch.dtype) -> None:
    """ArchConfig.attn_output_gate="projection_head": transformers' own Lfm3Attention (eager, a sliding
    layer), its weights ours: per-head QK norms, RoPE with fp32 tables, the window, then each head's output
    times sigmoid(g_proj(x)), one gate per head, before o_proj. Equal bit for bit in fp32 and bf16; the gate
    matters."""
    from transformers import Lfm3Config
    from transformers.models.lfm3.modeling_lfm3 import Lfm3Attention, Lfm3RotaryEmbedding

    cfg = tiny(n_layers=1, n_kv_heads=2, qk_norm="head", attn_output_gate="projection_head", sliding_window=5,
               layer_kinds=("local",), rope=RopeConfig(theta=500.0, fp32_tables=True), norm={"eps": 1e-5})
    model = build(cfg, dtype=dtype)
    ours = model.layers[0].attn
    hf_cfg = Lfm3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=1,
                        layer_types=["sliding_attention"], sliding_window=5, norm_eps=1e-5,
                        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0}})
    hf_cfg._attn_implementation = "eager"
    ref = Lfm3Attention(hf_cfg, 0).to(dtype).eval()
    names = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "q_norm": "q_norm", "k_norm": "k_norm",
             "g_proj": "out_gate"}
    ref.load_state_dict({f"{hf}.weight": ours.get_submodule(c).weight for hf, c in names.items()})
    x = _x(d=32).to(dtype)
    T = x.shape[1]
    rope = Lfm3RotaryEmbedding(hf_cfg)(x, torch.arange(T)[None], "sliding_attention")
    mask = additive_mask(_hf_mask(T, cfg.window_for(0)), dtype)[None, None]
    with torch.no_grad():
        expected, _ = ref(x, rope, mask)
        got = _layer_at(model, 0, x)
        assert torch.equal(got, expected)
        ref.g_proj.weight.zero_()  # sigmoid(0) = 1/2 for every head
        assert max_diff(ref(x, rope, mask)[0], got) > 1e-3


def _layer_at(model, layer: int, x: torch.Tensor) -> torch.Tensor:
    attn = model.layers[layer].attn
    attn.backend = "eager"
    positions = torch.arange(x.shape[1])
    return attn(x, Context(positions, positions, x.dtype))


def test_output_gate_is_the_standard_attentions_only() -> None:
    """A form the decoder lacks, a kind other than the standard, and what Qwen3-Next's split cannot follow."""
    with pytest.raises(ConfigError, match="attn_output_gate"):
        tiny(attn_output_gate="per_head")
    with pytest.raises(ConfigError, match="attn_output_gate='projection': gates the standard"):
        tiny(attn_output_gate="projection", attention="latent", n_kv_heads=4)
    with pytest.raises(ConfigError, match="attn_output_gate='q_heads': splits each head's query"):
        tiny(attn_output_gate="q_heads", qk_norm="projection")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q_heads_output_gate_is_qwen3_next_attention_bit_for_bit(dtype: torch.dtype) -> None:
    """ArchConfig.attn_output_gate="q_heads": transformers' own Qwen3NextAttention (eager), its
    weights ours: q_proj emits each head's [query | gate], the query normed per head ((1 + w) in
    fp32) and rotated, the output times sigmoid(gate) in the activation dtype before o_proj. Equal
    bit for bit in fp32 and bf16; and the gate matters."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    cfg = tiny(n_layers=1, n_kv_heads=2, qk_norm="head", attn_output_gate="q_heads", rope=RopeConfig(theta=500.0),
               norm={"eps": 1e-5, "dtype_order": "scale_then_cast", "weight_offset": 1.0})
    model = build(cfg, dtype=dtype)
    ours = model.layers[0].attn
    hf_cfg = Qwen3NextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             num_hidden_layers=1, layer_types=["full_attention"], rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                              "partial_rotary_factor": 1.0})
    hf_cfg._attn_implementation = "eager"
    ref = Qwen3NextAttention(hf_cfg, 0).to(dtype).eval()
    names = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "q_norm": "q_norm", "k_norm": "k_norm"}
    ref.load_state_dict({f"{hf}.weight": ours.get_submodule(c).weight for hf, c in names.items()})
    x = _x(d=32).to(dtype)
    T = x.shape[1]
    cos, sin = Qwen3NextRotaryEmbedding(hf_cfg)(x, torch.arange(T)[None])
    mask = additive_mask(_hf_mask(T, None), dtype)[None, None]
    with torch.no_grad():
        expected, _ = ref(x, (cos, sin), mask)
        got = _layer_at(model, 0, x)
        assert torch.equal(got, expected)
        ref.q_proj.weight.view(4, 16, 32)[:, 8:].zero_()  # every gate sigmoid(0) = 1/2
        assert max_diff(ref(x, (cos, sin), mask)[0], got) > 1e-3
