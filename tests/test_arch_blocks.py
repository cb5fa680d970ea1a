"""Blocks: norm placement and residual wiring, per-projection biases, and the feed-forward sublayer."""

from __future__ import annotations

import math

import pytest
import torch
from arch_helpers import build, max_diff, perturb, tiny, tokens
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaMLP

from lmconvert.arch import ConfigError, NormConfig
from lmconvert.arch.block import Block
from lmconvert.arch.context import Context
from lmconvert.arch.mlp import MLP
from lmconvert.arch.norms import Norm
from lmconvert.arch.rope import Rotary

T = 16


def _block(seed=0, **overrides) -> Block:
    cfg = tiny(n_layers=1, **overrides)
    rope = cfg.rope_for(0)
    torch.manual_seed(seed)
    block = Block(cfg, 0, Rotary(rope, cfg.head_dim, cfg.max_positions) if rope else None, None)
    perturb(block, seed)
    return block.eval()


def _run(block: Block, h: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(h.shape[1])
    with torch.no_grad():
        return block(h, Context(positions, positions, h.dtype))


def _h(seed=3, scale=2.0):
    return torch.randn(2, T, 32, generator=torch.Generator().manual_seed(seed)) * scale


def _zero(*params):
    with torch.no_grad():
        for p in params:
            if p is not None:
                p.zero_()


def _without_attn(block):
    _zero(block.attn.o.weight, block.attn.o.bias)
    return block


def _without_mlp(block):
    _zero(block.mlp.down.weight, block.mlp.down.bias)
    return block


def _rms(x):
    return x.pow(2).mean(-1).sqrt()


# ----------------------------------------------------------------------------- placement


@pytest.mark.parametrize("placement,count", [("pre", 2), ("post", 2), ("sandwich", 4), ("output", 2),
                                             ("parallel_shared", 1), ("parallel_separate", 2)])
def test_norm_count_per_placement(placement, count):
    final = placement != "post"
    block = _block(norm_placement=placement, final_norm=final)
    assert sum(isinstance(m, Norm) for m in block.modules()) == count
    model = build(tiny(norm_placement=placement, final_norm=final))
    assert sum(isinstance(m, Norm) for m in model.modules()) == 2 * count + final


@pytest.mark.parametrize("placement", ["pre", "sandwich", "output", "parallel_shared", "parallel_separate"])
def test_residual_blocks_are_identity_without_sublayer_outputs(placement):
    block = _without_mlp(_without_attn(_block(norm_placement=placement, o_bias=True, mlp_bias=True)))
    h = _h()
    assert torch.equal(_run(block, h), h)


def test_pre_norm_sublayer_sees_normalised_input():
    """Pre-norm: the attention delta does not depend on the scale of the residual stream."""
    block = _without_mlp(_block(norm_placement="pre", layer_positions=("none",)))
    h = _h()
    torch.testing.assert_close(_run(block, 5 * h) - 5 * h, _run(block, h) - h, rtol=1e-4, atol=1e-5)


def test_output_norm_sublayer_sees_raw_input():
    """OLMo 2: no pre-norm, so the attention delta changes with the input scale; its rows have the
    RMS of the post-norm (weight 1 -> unit RMS)."""
    block = _without_mlp(_block(norm_placement="output", layer_positions=("none",)))
    with torch.no_grad():
        block.attn_post_norm.weight.fill_(1.0)
    h = _h()
    delta = _run(block, h) - h
    torch.testing.assert_close(_rms(delta), torch.ones(2, T), rtol=1e-4, atol=1e-4)
    assert max_diff(_run(block, 5 * h) - 5 * h, delta) > 1e-2


def test_post_norm_output_rows_have_unit_rms():
    block = _block(norm_placement="post", final_norm=False)
    with torch.no_grad():
        block.mlp_norm.weight.fill_(1.0)
    h = _h()
    torch.testing.assert_close(_rms(_run(block, h)), torch.ones(2, T), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(_rms(_run(block, 10 * h)), torch.ones(2, T), rtol=1e-4, atol=1e-4)


def test_post_norm_normalises_after_each_residual_add():
    """With the MLP removed the block is mlp_norm(attn_norm(h + attn(h))) = c * rms(h + attn(h)) for norm
    weights c: doubling both weights doubles the output (a block whose output still contains h would not)."""
    block = _without_mlp(_block(norm_placement="post", final_norm=False))
    h = _h()
    with torch.no_grad():
        block.attn_norm.weight.fill_(1.0)
        block.mlp_norm.weight.fill_(1.0)
    base = _run(block, h)
    with torch.no_grad():
        block.attn_norm.weight.fill_(2.0)
        block.mlp_norm.weight.fill_(2.0)
    torch.testing.assert_close(_run(block, h), 2 * base, rtol=1e-4, atol=1e-4)


def test_post_norm_model_has_no_final_norm_and_unit_rms_last_state():
    model = build(tiny(norm_placement="post", final_norm=False))
    with torch.no_grad():
        model.layers[-1].mlp_norm.weight.fill_(1.0)
        states = model.hidden_states(tokens())
    torch.testing.assert_close(_rms(states[-1]), torch.ones(2, 24), rtol=1e-4, atol=1e-4)
    assert isinstance(model.final_norm, torch.nn.Identity)


def test_sandwich_zero_post_norm_weights_is_identity():
    block = _block(norm_placement="sandwich")
    _zero(block.attn_post_norm.weight, block.mlp_post_norm.weight)
    h = _h()
    assert torch.equal(_run(block, h), h)


def test_sandwich_post_norm_fixes_delta_rms_and_pre_norm_fixes_scale():
    block = _block(norm_placement="sandwich")
    _zero(block.mlp_post_norm.weight)
    with torch.no_grad():
        block.attn_post_norm.weight.fill_(1.0)
    h = _h()
    delta = _run(block, h) - h
    torch.testing.assert_close(_rms(delta), torch.ones(2, T), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(_run(block, 4 * h) - 4 * h, delta, rtol=1e-4, atol=1e-4)


def test_sandwich_with_gemma_offset_zero_weights_is_not_identity():
    """With weight_offset=1 a zero stored weight is a unit scale, so the block is no identity."""
    block = _block(norm_placement="sandwich", norm=NormConfig(weight_offset=1.0))
    _zero(block.attn_post_norm.weight, block.mlp_post_norm.weight)
    h = _h()
    assert max_diff(_run(block, h), h) > 0.1


@pytest.mark.parametrize("placement", ["parallel_shared", "parallel_separate"])
def test_parallel_contributions_add(placement):
    h = _h()
    full = _run(_block(norm_placement=placement), h) - h
    attn_only = _run(_without_mlp(_block(norm_placement=placement)), h) - h
    mlp_only = _run(_without_attn(_block(norm_placement=placement)), h) - h
    torch.testing.assert_close(full, attn_only + mlp_only, rtol=1e-5, atol=1e-5)


def test_sequential_contributions_do_not_add():
    h = _h()
    full = _run(_block(norm_placement="pre"), h) - h
    attn_only = _run(_without_mlp(_block(norm_placement="pre")), h) - h
    mlp_only = _run(_without_attn(_block(norm_placement="pre")), h) - h
    assert max_diff(full, attn_only + mlp_only) > 1e-2


def _paths_after_scaling(placement: str, norm: str) -> tuple[float, float]:
    """How much the attention path and the MLP path of a parallel block change when `norm`'s
    weight is scaled."""
    h = _h()
    attn_path = _without_mlp(_block(norm_placement=placement))
    mlp_path = _without_attn(_block(norm_placement=placement))
    base_attn, base_mlp = _run(attn_path, h), _run(mlp_path, h)
    for b in (attn_path, mlp_path):
        with torch.no_grad():
            getattr(b, norm).weight.mul_(-1.5)
    return max_diff(_run(attn_path, h), base_attn), max_diff(_run(mlp_path, h), base_mlp)


def test_parallel_shared_norm_feeds_both_paths():
    assert isinstance(_block(norm_placement="parallel_shared").mlp_norm, torch.nn.Identity)
    attn_change, mlp_change = _paths_after_scaling("parallel_shared", "attn_norm")
    assert attn_change > 1e-2 and mlp_change > 1e-2


def test_parallel_separate_mlp_norm_only_feeds_mlp():
    attn_change, mlp_change = _paths_after_scaling("parallel_separate", "mlp_norm")
    assert attn_change == 0 and mlp_change > 1e-2


# ----------------------------------------------------------------------------- biases

BIASES = {
    "q_bias": {"layers.0.attn.q.bias", "layers.1.attn.q.bias"},
    "k_bias": {"layers.0.attn.k.bias", "layers.1.attn.k.bias"},
    "v_bias": {"layers.0.attn.v.bias", "layers.1.attn.v.bias"},
    "o_bias": {"layers.0.attn.o.bias", "layers.1.attn.o.bias"},
    "mlp_bias": {f"layers.{i}.mlp.{p}.bias" for i in range(2) for p in ("gate", "up", "down")},
    "lm_head_bias": {"lm_head.bias"},
}


@pytest.mark.parametrize("flag", list(BIASES))
def test_each_bias_adds_exactly_its_parameters_and_matters(flag):
    base = set(build(tiny()).state_dict())
    assert not any(k.endswith(".bias") for k in base)
    model = build(tiny(**{flag: True}))
    assert set(model.state_dict()) - base == BIASES[flag]
    assert base <= set(model.state_dict())
    ids = tokens()
    with torch.no_grad():
        before = model(ids)
        for name in BIASES[flag]:
            model.get_parameter(name).add_(0.5)
        assert max_diff(model(ids), before) > 1e-3


@pytest.mark.parametrize(("base", "overrides", "added"), [
    (dict(tie_embeddings=True), dict(lm_head_bias=True), {"lm_head.bias"}),  # CTRL: the tied head's own bias
    ({}, dict(o_bias=True, o_bias_layers=(1,)), {"layers.1.attn.o.bias"}),  # GPT-NeoX-Japanese: the last layer's
    (dict(head_transform="gelu"), dict(head_transform_bias=True), {"head_transform.dense.bias"}),  # ModernBERT dec.
])
def test_a_bias_of_some_parts_only_adds_those_and_matters(base, overrides, added):
    model = build(tiny(**base, **overrides))
    assert set(model.state_dict()) - set(build(tiny(**base)).state_dict()) == added
    ids = tokens()
    with torch.no_grad():
        before = model(ids)
        for name in added:
            model.get_parameter(name).add_(0.5)
        assert max_diff(model(ids), before) > 1e-3


@pytest.mark.bitexact
def test_a_fused_mlp_is_modernberts_bit_for_bit():
    """ModernBERT decoder's Wi: one [input | gate] output, GeLU on its strided half, in fp32 bit for bit;
    our unfused MLP gives the same values to an ulp, not the same bits."""
    from transformers import ModernBertDecoderConfig
    from transformers.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderMLP

    theirs = ModernBertDecoderMLP(ModernBertDecoderConfig(hidden_size=64, intermediate_size=96, mlp_bias=True))
    perturb(theirs)
    cfg = tiny(d_model=64, d_ff=96, activation="gelu", mlp_bias=True, mlp_fused=True)
    ours = MLP(cfg)
    with torch.no_grad():
        gate, up = theirs.Wi.weight.chunk(2)
        gate_b, up_b = theirs.Wi.bias.chunk(2)
        ours.load_state_dict({"gate.weight": gate, "gate.bias": gate_b, "up.weight": up, "up.bias": up_b,
                              "down.weight": theirs.Wo.weight, "down.bias": theirs.Wo.bias})
        x = torch.randn(2, 20, 64, generator=torch.Generator().manual_seed(0))
        assert torch.equal(ours(x), theirs(x))
        unfused = MLP(tiny(d_model=64, d_ff=96, activation="gelu", mlp_bias=True))
        unfused.load_state_dict(ours.state_dict())
        torch.testing.assert_close(unfused(x), theirs(x), rtol=0, atol=1e-5)


def test_an_unnormed_attention_reads_the_residual_stream():
    """ModernBERT decoder's layer 0: its attention norm is gone, and its attention sees the raw stream."""
    model = build(tiny(unnormed_attn_layers=(0,)))
    assert isinstance(model.layers[0].attn_norm, torch.nn.Identity)
    assert set(build(tiny()).state_dict()) - set(model.state_dict()) == {"layers.0.attn_norm.weight"}
    seen = []
    model.layers[0].attn.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad():
        h = model.embed(tokens())
        model.layers[0](h, Context.build(0, h.shape[1], h.dtype, h.device, torch.arange(h.shape[1]), None))
    assert torch.equal(seen[0], h)


def test_key_bias_is_invisible_without_positions():
    """Softmax shift invariance: a key bias adds q.b to a whole score row. With RoPE it is rotated per
    key position and matters (test above); with no positions it must not change anything."""
    model = build(tiny(k_bias=True, layer_positions=("none", "none")))
    ids = tokens()
    with torch.no_grad():
        before = model(ids)
        model.layers[0].attn.k.bias.add_(2.0)
        torch.testing.assert_close(model(ids), before, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- feed-forward

FORMULAS = {
    "relu": lambda x: torch.clamp(x, min=0),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "relu2": lambda x: torch.clamp(x, min=0) ** 2,
}
HF_NAMES = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu", "relu2": "relu2"}


def _mlp(seed=0, **overrides) -> MLP:
    torch.manual_seed(seed)
    mlp = MLP(tiny(**overrides))
    perturb(mlp, seed)
    return mlp


@pytest.mark.parametrize("activation", list(FORMULAS))
def test_activation_closed_form(activation):
    mlp = _mlp(activation=activation, gated=False, mlp_bias=True)
    x = _h()
    f = FORMULAS[activation]
    expected = f(x @ mlp.up.weight.T + mlp.up.bias) @ mlp.down.weight.T + mlp.down.bias
    torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)
    gated = _mlp(activation=activation, gated=True, mlp_bias=True)
    expected = (f(x @ gated.gate.weight.T + gated.gate.bias) * (x @ gated.up.weight.T + gated.up.bias)
                ) @ gated.down.weight.T + gated.down.bias
    torch.testing.assert_close(gated(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", list(FORMULAS))
def test_gated_mlp_matches_transformers_llama_mlp(activation):
    mlp = _mlp(activation=activation, d_ff=37, mlp_bias=True)
    ref = LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=37, hidden_act=HF_NAMES[activation], mlp_bias=True))
    ref.load_state_dict({f"{n}_proj.{k}": v for n in ("gate", "up", "down")
                         for k, v in getattr(mlp, n).state_dict().items()})
    x = _h()
    torch.testing.assert_close(mlp(x), ref(x), rtol=0, atol=0)
    torch.testing.assert_close(mlp.act(x), ACT2FN[HF_NAMES[activation]](x), rtol=0, atol=0)


def test_activations_differ_from_each_other():
    x = _h()
    outs = {a: _mlp(activation=a)(x) for a in FORMULAS}
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert max_diff(outs[a], outs[b]) > 1e-3, (a, b)


def test_gated_with_up_zeroed_gives_zero():
    mlp = _mlp(gated=True)
    _zero(mlp.up.weight)
    assert torch.equal(mlp(_h()), torch.zeros(2, T, 32))


def test_gated_output_is_linear_in_up():
    mlp = _mlp(gated=True)
    x = _h()
    before = mlp(x)
    with torch.no_grad():
        mlp.up.weight.mul_(3.0)
    torch.testing.assert_close(mlp(x), 3 * before, rtol=1e-5, atol=1e-5)


def test_plain_mlp_has_no_gate_and_is_not_zero_with_gate_semantics():
    mlp = _mlp(gated=False)
    assert mlp.gate is None and set(mlp.state_dict()) == {"up.weight", "down.weight"}
    assert set(_mlp(gated=True).state_dict()) == {"gate.weight", "up.weight", "down.weight"}
    x = _h()
    assert mlp(x).abs().max() > 1e-2
    before = mlp(x)
    with torch.no_grad():
        mlp.up.weight.mul_(3.0)
    assert max_diff(mlp(x), 3 * before) > 1e-2  # act(up x) is not linear in up


def test_odd_d_ff():
    model = build(tiny(d_ff=37))
    assert model.layers[0].mlp.up.weight.shape == (37, 32)
    assert model.layers[0].mlp.down.weight.shape == (32, 37)
    logits = model(tokens())
    assert logits.shape == (2, 24, 64) and torch.isfinite(logits).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_depth_scaled_residual_is_beams_bit_for_bit(dtype: torch.dtype) -> None:
    """ArchConfig.residual_form="depth_scaled": each layer's two adds are transformers' own
    depth_scaled_residual_add (k = 2(layer + 1), then k + 1), bit for bit; the plain form is h + out."""
    from transformers.models.beam.modeling_beam import depth_scaled_residual_add

    cfg = tiny(n_layers=3, norm_placement="sandwich", residual_form="depth_scaled")
    generator = torch.Generator().manual_seed(3)
    h, out = (torch.randn(2, 5, cfg.d_model, generator=generator).to(dtype) for _ in range(2))
    for layer in range(cfg.n_layers):
        block = Block(cfg, layer, None, None).eval()
        for sublayer in (0, 1):
            expected = depth_scaled_residual_add(out, h, 2 * (layer + 1) + sublayer)
            assert torch.equal(block.add(h, out, sublayer), expected)
    assert torch.equal(Block(tiny(n_layers=3), 1, None, None).add(h, out, 1), h + out)


def test_depth_scaled_residual_needs_sequential_plain_adds() -> None:
    for overrides in ({"norm_placement": "parallel_shared"}, {"norm_placement": "post"}, {"residual_scale": 0.5}):
        with pytest.raises(ConfigError, match="residual_form"):
            tiny(residual_form="depth_scaled", **overrides)
