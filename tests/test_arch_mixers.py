"""A token-mixer kind is declared in one place (arch/mixer_kinds.py): a toy kind registered here,
and nowhere else, is picked up by config validation, the per-layer schedule (attention, the mixer
or nothing; an FFN or none), the torch-free tensor inventory, the Decoder's blocks, the cache (its
state, and a length no longer read from layer 0's keys), generation, the architecture card and its
state sizes, the streamed decoder, tensor parallelism's refusal and verify's points and layouts;
unregistered, it is unknown again."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from arch_helpers import build, max_diff, tiny, tokens
from safetensors.torch import load_file, save_file
from test_arch_kinds import registered
from torch import nn

from lmconvert.arch import ArchConfig, ConfigError, Decoder
from lmconvert.arch.build import attach
from lmconvert.arch.context import Context
from lmconvert.arch.describe import variants
from lmconvert.arch.mixer_kinds import KINDS, MixerKind, mixer_kind, register
from lmconvert.arch.parts import ConvPart, LinearPart, NormPart, Part
from lmconvert.arch.shapes import norm_slots, parameter_shapes
from lmconvert.runtime.streamed import StreamedDecoder
from lmconvert.runtime.tensor_parallel import refusals
from lmconvert.verify.layouts import PointLayouts
from lmconvert.verify.trace import our_trace, point_modules


# ----------------------------------------------------------------------------- the toy kind
@dataclass(frozen=True)
class DecaySettings:
    """The toy's own field: how much of the running state each step keeps."""

    decay: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)) or not 0 <= self.decay < 1:
            raise ConfigError(f"ArchConfig.mixer_settings.decay={self.decay!r}: must be in [0, 1)")


def _decay_parts(cfg: ArchConfig) -> dict[str, Part]:
    return {"inp": LinearPart(cfg.d_model, cfg.d_model), "conv": ConvPart(cfg.d_model, 2, True),
            "norm": NormPart(cfg.d_model, cfg.norm), "out": LinearPart(cfg.d_model, cfg.d_model, True)}


class DecayMixer(nn.Module):
    """s_t = decay * s_{t-1} + inp(x)_t, carried in `cache.states[layer]["s"]`; out(norm(s)). The
    convolution is held (its tensors are listed) and scales s by its last tap."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__()
        attach(self, parts)
        self.layer, self.decay = layer, cfg.mixer_settings.decay

    def forward(self, x: torch.Tensor, ctx, cache=None) -> torch.Tensor:
        h = self.inp(x)
        s = cache.states[self.layer].get("s") if cache is not None else None
        s = torch.zeros_like(h[:, 0]) if s is None else s
        out = []
        for t in range(h.shape[1]):
            s = self.decay * s + h[:, t]
            out.append(s)
        if cache is not None:
            cache.states[self.layer]["s"] = s
        y = torch.stack(out, 1) * self.conv.weight[:, 0, -1]
        return self.out(self.norm(y))


DECAY = MixerKind(
    name="decay",
    module=f"{__name__}:DecayMixer",
    parts=_decay_parts,
    describe=lambda cfg: [f"decay mixer: s = {cfg.mixer_settings.decay:g} s + inp(x)"],
    state_elements=lambda cfg: cfg.d_model,
    settings=DecaySettings,
)
HYBRID = dict(mixer="decay", layer_mixers=("mixer", "attention", "mixer"), n_layers=3)


@pytest.fixture
def decay() -> Iterator[MixerKind]:
    with registered(DECAY, KINDS) as kind:
        yield kind


def manual_mixer(block: nn.Module, x: torch.Tensor, decay: float) -> torch.Tensor:
    m = block.mixer
    h, s, out = m.inp(x), torch.zeros_like(x[:, 0]), []
    for t in range(x.shape[1]):
        s = decay * s + h[:, t]
        out.append(s)
    return m.out(m.norm(torch.stack(out, 1) * m.conv.weight[:, 0, -1]))


# ----------------------------------------------------------------------------- config validation
def test_settings_default_and_round_trip_through_json(decay):
    cfg = tiny(**HYBRID)
    assert cfg.mixer_settings == DecaySettings() and cfg.layer_ffns == ("ffn",) * 3
    cfg = tiny(mixer="decay", mixer_settings={"decay": 0.25}, n_layers=3, layer_mixers=("mixer", "none", "attention"),
               layer_ffns=("none", "ffn", "ffn"))
    assert cfg.to_dict()["mixer_settings"] == {"decay": 0.25}
    assert ArchConfig.from_json(cfg.to_json()) == cfg
    everywhere = tiny(mixer="decay")  # a mixer set: every layer is one unless the schedule says otherwise
    assert everywhere.layer_mixers == ("mixer", "mixer") and "layer_mixers" not in everywhere.to_dict()
    attending = tiny(mixer="decay", layer_mixers=("attention", "attention"))
    assert ArchConfig.from_json(attending.to_json()) == attending


@pytest.mark.parametrize("overrides,needle", [
    (dict(mixer="decay", mixer_settings={"decay": 1.5}), "decay=1.5"),
    (dict(mixer="decay", mixer_settings={"rate": 1}), "mixer_settings: unknown field(s) rate"),
    (dict(layer_mixers=("mixer", "attention")), "names 'mixer' layers; set mixer"),
    (dict(mixer_settings={"decay": 0.1}), "has no mixer to set; set mixer"),
    (dict(mixer="decay", layer_mixers=("none", "mixer"), layer_ffns=("none", "ffn")), "neither a mixer nor an FFN"),
    (dict(mixer="decay", layer_mixers=("mixer",)), "needs one entry per layer"),
    (dict(mixer="decay", layer_ffns=("none", "ffn"), norm_placement="post"), "needs sequential sublayers"),
    (dict(mixer="decay", layer_mixers=("none", "mixer"), norm_placement="parallel_shared"),
     "needs sequential sublayers"),
    (dict(mixer="scan"), "ArchConfig.mixer='scan': must be one of"),
    (dict(layer_mixers=("attention+mixer", "attention")), "names 'mixer' layers; set mixer"),
    (dict(attn_in_multiplier=0.0), "ArchConfig.attn_in_multiplier=0.0: must be a positive"),
    (dict(mlp_gate_multiplier=0.9, gated=False), "needs gated=True"),
    (dict(mlp_down_multiplier=0.5, moe=dict(n_experts=4, top_k=2, d_expert=16)), "a mixture of experts needs both"),
])
def test_invalid_schedules_and_settings_name_what_is_wrong(decay, overrides, needle):
    with pytest.raises(ConfigError) as info:
        tiny(**overrides)
    assert needle in str(info.value)


def test_a_name_is_registered_once(decay):
    with pytest.raises(ValueError, match="'decay' is already registered"):
        register(DECAY)


# ----------------------------------------------------------------------------- inventory and module
SCHEDULES = {
    "hybrid": HYBRID,
    "single_sublayers": dict(mixer="decay", n_layers=4, layer_mixers=("mixer", "none", "attention", "mixer"),
                             layer_ffns=("none", "ffn", "none", "ffn")),  # Nemotron-H's one-sublayer blocks
    "sandwich": dict(HYBRID, norm_placement="sandwich", layer_ffns=("ffn", "none", "ffn")),
    "moe": dict(HYBRID, moe=dict(n_experts=4, top_k=2, d_expert=16, dense_layers=(0,))),
    "attention_without_ffn": dict(layer_ffns=("ffn", "none")),
    # Falcon-H1's parallel hybrid: attention and the mixer side by side on one normed input, with muP multipliers
    "parallel": dict(mixer="decay", n_layers=3, layer_mixers=("attention+mixer", "mixer", "attention+mixer"),
                     attn_in_multiplier=1.3, attn_out_multiplier=0.85, mixer_out_multiplier=0.45),
}
HAS_ATTENTION, HAS_MIXER = ("attention", "attention+mixer"), ("mixer", "attention+mixer")


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_inventory_norm_slots_and_module_follow_the_schedule(decay, name):
    cfg = tiny(**SCHEDULES[name])
    with torch.device("meta"):
        model = Decoder(cfg)
    expected = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    got = parameter_shapes(cfg)
    assert list(got.items()) == list(expected.items())
    for i, (mixing, ffn) in enumerate(zip(cfg.layer_mixers, cfg.layer_ffns, strict=True)):
        block = model.layers[i]
        assert isinstance(block.mixer, DecayMixer) == (mixing in HAS_MIXER)
        assert (block.attn is not None) == (mixing in HAS_ATTENTION) and (block.mlp is not None) == (ffn == "ffn")
        assert (f"layers.{i}.mixer.conv.weight" in got) == (mixing in HAS_MIXER)
        assert (f"layers.{i}.attn.q.weight" in got) == (mixing in HAS_ATTENTION)
        assert not any(n.startswith(f"layers.{i}.attn_") for n in got) or mixing != "none"
        assert not any(n.startswith(f"layers.{i}.mlp") for n in got) or ffn == "ffn"
        slots = norm_slots(cfg, i)
        assert all(isinstance(getattr(block, s), nn.Identity) != (s in slots) for s in slots)
    if cfg.mixer:
        assert got["layers.0.mixer.conv.weight"] == (cfg.d_model, 1, 2)
        assert got["layers.0.mixer.conv.bias"] == (cfg.d_model,)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_block_computes_what_its_schedule_says(decay, name):
    """Block by block, against the sublayers written out by hand: the mixer's formula, attention,
    the FFN, each only where the schedule has it, each behind its norms; a parallel layer sums the mixer's output
    and attention's, each times its multipliers (attention's input too)."""
    cfg = tiny(**SCHEDULES[name])
    model = build(cfg)
    ids = tokens()
    with torch.no_grad():
        states = model.hidden_states(ids)
        for i, block in enumerate(model.layers):
            h = states[i]
            mixing = cfg.layer_mixers[i]
            if mixing != "none":
                x = block.attn_norm(h)
                mixed = 0.0
                if mixing in HAS_MIXER:
                    mixed = manual_mixer(block, x, cfg.mixer_settings.decay) * cfg.mixer_out_multiplier
                if mixing in HAS_ATTENTION:
                    ctx = Context.build(0, ids.shape[1], x.dtype, x.device)
                    mixed = mixed + block.attn(x * cfg.attn_in_multiplier, ctx, None) * cfg.attn_out_multiplier
                h = h + block.attn_post_norm(mixed)
            if cfg.layer_ffns[i] == "ffn":
                h = h + block.mlp_post_norm(block.mlp(block.mlp_norm(h)))
            assert max_diff(h, states[i + 1]) == 0.0, i


# ----------------------------------------------------------------------------- cache and generation
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_cached_decoding_carries_the_state(decay, name):
    """A prefill, a chunk, then one token at a time equals the full forward; the cache counts the
    tokens though layer 0 keeps no keys, and holds the mixer's state, not a growing K and V."""
    model = build(tiny(**SCHEDULES[name]))
    ids = tokens(seq=20)
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        out = [model(ids[:, :5], cache=cache), model(ids[:, 5:9], cache=cache)]
        out += [model(ids[:, t:t + 1], cache=cache) for t in range(9, 20)]
    assert max_diff(torch.cat(out, 1), full) <= 1e-5
    assert cache.length == 20
    cfg = model.cfg
    for i, mixing in enumerate(cfg.layer_mixers):
        assert (cache.keys[i] is not None) == (mixing in HAS_ATTENTION)
        assert set(cache.states[i]) == ({"s"} if mixing in HAS_MIXER else set())
    state = sum(t.numel() for s in cache.states for t in s.values()) * 4 // ids.shape[0]
    keys = sum(t.numel() for t in cache.keys + cache.values if t is not None) * 4 // ids.shape[0]
    assert state == cfg.state_bytes_per_sequence(4) and keys == 20 * cfg.kv_cache_bytes_per_token(4)
    assert cfg.cache_bytes(20, 4) == state + keys


def test_the_state_is_not_ignored(decay):
    """Guards the equality above: decoding the last token without its cache gives other logits."""
    model = build(tiny(mixer="decay"))
    ids = tokens(seq=12)
    with torch.no_grad():
        assert max_diff(model(ids[:, -1:])[:, 0], model(ids)[:, -1]) > 1e-3


def test_generate_decodes_through_the_mixers(decay):
    model = build(tiny(**HYBRID))
    ids = tokens(seq=6)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8)
        for _ in range(8):  # greedy without a cache, one full forward per token
            ids = torch.cat((ids, model(ids)[:, -1].argmax(-1, keepdim=True)), 1)
    assert torch.equal(out, ids)


# ----------------------------------------------------------------------------- card and state sizes
def test_card_names_the_kind_the_schedule_and_the_state(decay):
    cfg = tiny(**SCHEDULES["single_sublayers"])
    lines = variants(cfg)
    assert lines[2].startswith("attention: ") and lines[3] == "decay mixer: s = 0.5 s + inp(x)"
    assert "layer schedule: attention on 1 (2); decay on 2 (0, 3); no mixer on 1 (1); FFN on 2 layers (1, 3)" in lines
    assert "layer pattern: M -F A MF (A attention, M decay, F an FFN after it)" in lines
    assert (f"decoding state: {2 * cfg.kv_dim} entries per token (KV cache, 1 layer of attention) + "
            f"{2 * cfg.d_model} entries per sequence, whatever its length (2 layers of decay)") in lines
    assert cfg.kv_cache_bytes_per_token(2) == 2 * cfg.kv_dim * 2 and cfg.state_bytes_per_sequence(2) == 2 * 32 * 2
    only = variants(tiny(mixer="decay"))
    assert not any(line.startswith("attention:") for line in only)  # no attention layer: no attention lines
    assert variants(tiny()) == [line for line in variants(tiny()) if not line.startswith(("layer ", "decoding"))]
    parallel = tiny(**SCHEDULES["parallel"])
    lines = variants(parallel)
    assert ("layer schedule: decay on 1 (1); attention and decay side by side (outputs summed) on 2 (0, 2); FFN on "
            "all layers") in lines
    assert "layer pattern: AMF MF AMF (A attention, M decay, F an FFN after it)" in lines
    assert "muP multipliers: attention input x 1.3, attention output x 0.85, mixer output x 0.45" in lines
    assert (f"decoding state: {2 * parallel.kv_dim * 2} entries per token (KV cache, 2 layers of attention) + "
            f"{3 * parallel.d_model} entries per sequence, whatever its length (3 layers of decay)") in lines


# ----------------------------------------------------------------------------- round trip, streaming, TP
def test_checkpoint_round_trip_is_bit_exact(decay, tmp_path):
    """The tensors, saved and read back into a Decoder built from the config read back from JSON."""
    model = build(tiny(**SCHEDULES["single_sublayers"]))
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "arch.json").write_text(model.cfg.to_json())
    back = Decoder(ArchConfig.from_json((tmp_path / "arch.json").read_text()))
    back.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    ids = tokens()
    with torch.no_grad():
        assert torch.equal(back.eval()(ids), model(ids))


def test_streamed_decoder_runs_mixer_layers(decay):
    """--max-memory's decoder loads each block's tensors, mixers' included, only while it runs."""
    model = build(tiny(**SCHEDULES["single_sublayers"])).set_attention("eager")  # the streamed decoder's default
    weights = {n: (lambda t=t: t) for n, t in model.state_dict().items()}
    streamed = StreamedDecoder(model.cfg, weights, torch.float32)
    ids = tokens(seq=10)
    cache, ref = streamed.new_cache(), model.new_cache()
    with torch.no_grad():
        assert torch.equal(streamed(ids[:, :6], cache=cache), model(ids[:, :6], cache=ref))
        assert torch.equal(streamed(ids[:, 6:7], cache=cache), model(ids[:, 6:7], cache=ref))
    assert cache.length == 7


def test_tensor_parallel_refuses_mixer_layers_by_name(decay):
    assert refusals(tiny(**HYBRID), 2) == ["the decay mixer layers have no tensor-parallel plan"]
    assert refusals(tiny(mixer="decay", layer_mixers=("attention", "attention")), 2) == []


# ----------------------------------------------------------------------------- verify's points
def test_verify_points_and_layouts_come_from_the_parts(decay):
    """Each mixer part is a point, laid out (B, T, width) for a linear or norm, (B, channels, T) for
    a convolution, on both sides unless a family says otherwise; a convolution's module is none, since
    every mixer runs its weights over the kept window and never calls it (build.py marks it)."""
    cfg = tiny(**HYBRID)
    points = point_modules(cfg)
    assert points["layers.0.mixer.inp"] == "layers.0.mixer.inp.weight"
    assert {"layers.2.mixer.norm", "layers.2.mixer.out"} <= set(points) and "layers.2.mixer.conv" not in points
    layouts = PointLayouts.of(cfg, "toy", 2, 24)
    assert layouts.ours["mixer.inp"] == "B T mixer.inp" and layouts.ours["mixer.conv"] == "B mixer.conv T"
    model = build(cfg)
    trace = our_trace(model, model, tokens())
    for name in ("layers.0.mixer.inp", "layers.0.mixer.norm", "layers.2.mixer.out"):
        assert torch.equal(layouts.to_ours(name, trace.points[name]), trace.points[name])
    with pytest.raises(ValueError, match="is not"):
        layouts.to_ours("layers.0.mixer.inp", trace.points["layers.0.mixer.inp"].transpose(1, 2))


# ----------------------------------------------------------------------------- gone when unregistered
def test_an_unregistered_kind_is_unknown_again():
    with registered(DECAY, KINDS):
        tiny(mixer="decay")
    with pytest.raises(ConfigError, match="ArchConfig.mixer='decay': must be one of"):
        tiny(mixer="decay")
    with pytest.raises(ConfigError, match="'decay'"):
        mixer_kind("decay")


def test_a_stack_without_mixers_is_unchanged():
    """No mixer: every layer attends and has its FFN, lmconvert.json says nothing new, no state."""
    cfg = tiny()
    assert cfg.layer_mixers == ("attention", "attention") and cfg.layer_ffns == ("ffn", "ffn")
    assert not {"mixer", "mixer_settings", "layer_mixers", "layer_ffns"} & set(cfg.to_dict())
    assert cfg.state_bytes_per_sequence() == 0 and dataclasses.replace(cfg).cache_bytes(3, 2) == \
        3 * cfg.kv_cache_bytes_per_token(2)
