"""An attention kind is declared in one place: a toy kind registered here, and nowhere else, is
picked up by config validation, the torch-free tensor inventory, the Decoder's module, the
architecture card and the KV-cache size; unregistered, it is unknown again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from arch_helpers import build, max_diff, tiny, tokens
from torch import nn

from lmconvert.arch import ArchConfig, ConfigError, Decoder
from lmconvert.arch.attention_kinds import KINDS, AttentionKind, attention_kind, register
from lmconvert.arch.build import attach
from lmconvert.arch.describe import variants
from lmconvert.arch.kinds import Kinds
from lmconvert.arch.parts import LinearPart, Part
from lmconvert.arch.shapes import parameter_shapes


# ----------------------------------------------------------------------------- the toy kind
@dataclass(frozen=True)
class GainSettings:
    """The toy's own field: a factor on the score scale."""

    gain: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.gain, bool) or not isinstance(self.gain, (int, float)) or not self.gain > 0:
            raise ConfigError(f"ArchConfig.attention_settings.gain={self.gain!r}: must be positive")


def _fused_parts(cfg: ArchConfig) -> dict[str, Part]:
    return {"qkv": LinearPart(cfg.d_model, 3 * cfg.q_dim), "o": LinearPart(cfg.q_dim, cfg.d_model)}


def _fused_check(cfg: ArchConfig) -> None:
    if cfg.n_kv_heads != cfg.n_heads or set(cfg.layer_positions) != {"none"}:
        raise ConfigError(f"ArchConfig.n_kv_heads={cfg.n_kv_heads}: attention='fused' is MHA without "
                          f"positions (n_kv_heads=n_heads, layer_positions 'none')")


class FusedAttention(nn.Module):
    """Causal MHA through one fused qkv projection, scores scaled by `gain` times the usual scale."""

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int, rotary: object, relative: object) -> None:
        super().__init__()
        self.cfg = cfg
        attach(self, parts)
        self.backend = "sdpa"

    def forward(self, x: torch.Tensor, ctx, cache=None) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, cfg.n_heads, cfg.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        scale = cfg.score_scale * cfg.attention_settings.gain
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.allowed(None), scale=scale)
        return self.o(out.transpose(1, 2).reshape(B, T, cfg.q_dim))


FUSED = AttentionKind(
    name="fused",
    module=f"{__name__}:FusedAttention",
    parts=_fused_parts,
    describe=lambda cfg: [f"attention: fused qkv, {cfg.n_heads} heads, gain {cfg.attention_settings.gain:g}"],
    cache_elements=lambda cfg: 3 * cfg.q_dim,
    settings=GainSettings,
    check=_fused_check,
)
NO_POSITIONS = dict(layer_positions=("none", "none"))


@contextmanager
def registered(kind: Any, kinds: Kinds = KINDS) -> Iterator[Any]:  # noqa: ANN401 - any registry's kind
    """`kind` in `kinds` (the attention kinds unless said) for the block's duration."""
    kinds.register(kind)
    try:
        yield kind
    finally:
        kinds.unregister(kind.name)


@pytest.fixture
def fused() -> Iterator[AttentionKind]:
    with registered(FUSED) as kind:
        yield kind


# ----------------------------------------------------------------------------- config validation
def test_settings_default_and_round_trip_through_json(fused):
    assert tiny(attention="fused", **NO_POSITIONS).attention_settings == GainSettings()
    cfg = tiny(attention="fused", attention_settings={"gain": 2.0}, **NO_POSITIONS)
    assert cfg.attention_settings == GainSettings(gain=2.0)
    assert cfg.to_dict()["attention_settings"] == {"gain": 2.0}
    assert ArchConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("overrides,needle", [
    (dict(attention_settings={"gain": -1.0}, **NO_POSITIONS), "gain=-1.0"),  # the settings' own check
    (dict(attention_settings={"bias": True}, **NO_POSITIONS), "attention_settings: unknown field(s) bias"),
    (dict(attention_settings=3, **NO_POSITIONS), "attention_settings=3"),
    (dict(n_kv_heads=2, **NO_POSITIONS), "n_kv_heads=2"),  # the kind's check over other fields
    (dict(), "attention='fused' is MHA without positions"),
])
def test_invalid_settings_name_what_is_wrong(fused, overrides, needle):
    with pytest.raises(ConfigError) as info:
        tiny(attention="fused", **overrides)
    assert needle in str(info.value)


def test_a_kind_without_settings_takes_none_and_writes_none(fused):
    with pytest.raises(ConfigError, match="attention_settings.*'standard' has no settings"):
        tiny(attention_settings=GainSettings())
    assert "attention_settings" not in tiny().to_dict()  # lmconvert.json of standard models is unchanged


def test_a_name_is_registered_once(fused):
    with pytest.raises(ValueError, match="'fused' is already registered"):
        register(FUSED)


# ----------------------------------------------------------------------------- inventory and module
def test_inventory_and_module_come_from_the_declaration(fused):
    cfg = tiny(attention="fused", **NO_POSITIONS)
    with torch.device("meta"):
        model = Decoder(cfg)
    assert isinstance(model.layers[1].attn, FusedAttention)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = parameter_shapes(cfg)
    assert list(got.items()) == list(expected.items())
    assert got["layers.1.attn.qkv.weight"] == (3 * cfg.q_dim, cfg.d_model)
    assert not any(".attn.q." in name for name in got)


def test_the_module_computes_with_its_settings(fused):
    """The fused kind with gain g equals the standard kind with q, k, v split out of qkv and the
    score scale multiplied by g: the Decoder runs the registered module with the config's settings."""
    cfg = tiny(attention="fused", attention_settings={"gain": 2.0}, **NO_POSITIONS)
    toy = build(cfg)
    standard = Decoder(tiny(attn_scale=2.0 * cfg.head_dim ** -0.5, **NO_POSITIONS))
    weights = {}
    for name, tensor in toy.state_dict().items():
        if ".attn.qkv." in name:
            for part, piece in zip("qkv", tensor.chunk(3), strict=True):
                weights[name.replace(".qkv.", f".{part}.")] = piece
        else:
            weights[name] = tensor
    standard.load_state_dict(weights, strict=True)
    ids = tokens()
    with torch.no_grad():
        assert max_diff(toy(ids), standard.eval()(ids)) < 1e-5


# ----------------------------------------------------------------------------- card and cache
def test_card_and_cache_size_come_from_the_declaration(fused):
    cfg = tiny(attention="fused", attention_settings={"gain": 2.0}, **NO_POSITIONS)
    lines = variants(cfg)
    assert lines[2] == "attention: fused qkv, 4 heads, gain 2"
    assert not any(line.startswith("QK norm") or "MHA" in line for line in lines)
    assert cfg.kv_cache_bytes_per_token(4) == cfg.n_layers * 3 * cfg.q_dim * 4


# ----------------------------------------------------------------------------- gone when unregistered
def test_an_unregistered_kind_is_unknown_again():
    with registered(FUSED):
        tiny(attention="fused", **NO_POSITIONS)
    with pytest.raises(ConfigError, match="ArchConfig.attention='fused': must be one of standard"):
        tiny(attention="fused", **NO_POSITIONS)
    with pytest.raises(ConfigError, match="'fused'"):
        attention_kind("fused")
