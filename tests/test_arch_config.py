"""ArchConfig / NormConfig / RopeConfig: validation names field and value, JSON round trip is exact."""

from __future__ import annotations

import json

import pytest
from arch_helpers import TINY, tiny

from lmconvert.arch import ArchConfig, ConfigError, NormConfig, RopeConfig


def _error(**overrides) -> str:
    with pytest.raises(ConfigError) as info:
        tiny(**overrides)
    return str(info.value)


def test_kv_heads_must_divide_heads_and_message_has_both_numbers():
    message = _error(d_model=48, n_heads=6, n_kv_heads=4)
    assert "n_kv_heads" in message and "6" in message and "4" in message


@pytest.mark.parametrize("field,value", [
    ("norm_placement", "middle"), ("qk_norm", "everywhere"), ("activation", "swish"),
    ("absolute_positions", "rotary"), ("attention", "flash"),
])
def test_bad_enum_names_field_and_value(field, value):
    message = _error(**{field: value})
    assert field in message and repr(value) in message


def test_sparse_attention_needs_its_q_lora():
    """The "sparse" kind (DSA) is built now; its indexer reads the q LoRA, which the defaults lack."""
    message = _error(attention="sparse")
    assert "attention_settings.q_lora_rank=None" in message and "indexer" in message


@pytest.mark.parametrize("field,value", [
    ("layer_positions", ("rope",)), ("layer_kinds", ("global", "local", "global")),
])
def test_per_layer_tuple_of_wrong_length(field, value):
    message = _error(**{field: value}, sliding_window=4)
    assert field in message and "n_layers=2" in message


@pytest.mark.parametrize("field,value", [("layer_positions", ("rope", "xpos")), ("layer_kinds", ("global", "tiny"))])
def test_per_layer_bad_entry(field, value):
    message = _error(**{field: value}, sliding_window=4)
    assert field in message and repr(value[1]) in message


@pytest.mark.parametrize("overrides,field", [
    (dict(d_model=0), "d_model"), (dict(n_layers=-1), "n_layers"), (dict(vocab_size=3.5), "vocab_size"),
    (dict(n_heads=True), "n_heads"), (dict(d_model=30, n_heads=4), "head_dim"),
    (dict(layer_kinds=("local", "global")), "sliding_window"), (dict(sliding_window=0), "sliding_window"),
    (dict(attn_softcap=-1.0), "attn_softcap"), (dict(logit_scale=0.0), "logit_scale"),
    (dict(residual_scale=0.0), "residual_scale"), (dict(residual_scale=float("inf")), "residual_scale"),
    (dict(resid_dropout=1.0), "resid_dropout"), (dict(z_loss=-0.1), "z_loss"),
    (dict(position_offset=-2), "position_offset"), (dict(position_offset=1.5), "position_offset"),
    (dict(relative_buckets=1), "relative_buckets"), (dict(relative_buckets=32, relative_max_distance=16),
                                                     "relative_max_distance"),
    (dict(relative_max_distance=0), "relative_max_distance"),
    (dict(norm_placement="post"), "final_norm"),
    (dict(head_dim=6, rope=RopeConfig(fraction=0.5)), "head_dim"),
    (dict(o_bias_layers=(1,)), "o_bias_layers"), (dict(o_bias=True, o_bias_layers=(2,)), "o_bias_layers"),
    (dict(o_bias=True, o_bias_layers=(True,)), "o_bias_layers"),
])
def test_invalid_values_name_the_field(overrides, field):
    assert f"ArchConfig.{field}=" in _error(**overrides)


def test_o_bias_layers_have_one_spelling():
    """Every layer listed is o_bias alone; a layer left out has no o bias in its own config."""
    tiny = dict(vocab_size=8, d_model=16, n_layers=2, n_heads=2, d_ff=8, o_bias=True)
    assert ArchConfig(**tiny, o_bias_layers=[1, 0, 1]) == ArchConfig(**tiny)
    last = ArchConfig(**tiny, o_bias_layers=[1])
    assert last.o_bias_layers == (1,) and last.layer_config(1) is last
    assert not last.layer_config(0).o_bias


@pytest.mark.parametrize("kind,kwargs,field", [
    (NormConfig, dict(kind="batch"), "kind"), (NormConfig, dict(eps=0.0), "eps"),
    (NormConfig, dict(bias=True), "bias"), (NormConfig, dict(weight=False, weight_offset=1.0), "weight_offset"),
    (NormConfig, dict(dtype_order="whatever"), "dtype_order"),
    (RopeConfig, dict(layout="spiral"), "layout"), (RopeConfig, dict(scaling="ntk"), "scaling"),
    (RopeConfig, dict(fraction=1.5), "fraction"), (RopeConfig, dict(fraction=0.0), "fraction"),
    (RopeConfig, dict(scaling="yarn", factor=4.0), "original_max_positions"),
    (RopeConfig, dict(theta=-1.0), "theta"),
])
def test_sub_config_validation(kind, kwargs, field):
    with pytest.raises(ConfigError) as info:
        kind(**kwargs)
    assert f".{field}=" in str(info.value)


def test_defaults_are_normalised():
    cfg = tiny()
    assert cfg.n_kv_heads == cfg.n_heads == 4
    assert cfg.head_dim == 8 and cfg.q_dim == 32 and cfg.kv_dim == 32
    assert cfg.layer_positions == ("rope", "rope") and cfg.layer_kinds == ("global", "global")
    assert cfg.score_scale == 8 ** -0.5
    assert tiny(attn_scale=0.25).score_scale == 0.25


def test_head_dim_independent_of_d_model():
    cfg = tiny(d_model=40, n_heads=3, head_dim=16)  # 40 % 3 != 0 is fine once head_dim is given
    assert cfg.q_dim == 48 and cfg.kv_dim == 48


def _rich_config() -> ArchConfig:
    return ArchConfig(
        vocab_size=100, d_model=48, n_layers=3, n_heads=6, d_ff=37, n_kv_heads=2, head_dim=12, max_positions=96,
        norm=NormConfig(kind="layer", eps=1e-5, weight=True, bias=True, dtype_order="scale_then_cast"),
        norm_placement="sandwich", final_norm=True, qk_norm="head",
        q_bias=True, k_bias=True, v_bias=False, o_bias=True, mlp_bias=True, lm_head_bias=True,
        activation="gelu_tanh", gated=False, absolute_positions="learned", position_offset=2,
        layer_positions=("rope", "alibi", "relative"),
        rope=RopeConfig(theta=5e5, layout="interleaved", fraction=0.5, scaling="yarn", factor=4.0,
                        original_max_positions=32, beta_fast=16.0, mscale=0.7, mscale_all_dim=0.7, truncate=False),
        rope_local=RopeConfig(theta=1e4, scaling="llama3", factor=8.0, original_max_positions=48, fp32_tables=True),
        relative_buckets=16, relative_max_distance=64,
        layer_kinds=("local", "global", "local"), sliding_window=7, attn_scale=0.3, attn_softcap=50.0,
        tie_embeddings=False, embed_scale=6.9, final_softcap=30.0, logit_scale=0.5,
        embed_dropout=0.1, attn_dropout=0.05, resid_dropout=0.2, z_loss=1e-4,
    )


def test_json_round_trip_is_exact():
    cfg = _rich_config()
    back = ArchConfig.from_json(cfg.to_json())
    assert back == cfg
    assert isinstance(back.norm, NormConfig) and isinstance(back.rope_local, RopeConfig)
    assert back.layer_kinds == ("local", "global", "local")  # a tuple again, not a JSON list
    assert ArchConfig.from_json(back.to_json()).to_json() == cfg.to_json()


def test_json_round_trip_of_defaults():
    cfg = tiny()
    assert ArchConfig.from_json(cfg.to_json()) == cfg
    assert ArchConfig.from_dict(TINY) == cfg  # sub-configs default when absent


def test_json_round_trip_distinguishes_configs():
    cfg = _rich_config()
    data = json.loads(cfg.to_json())
    data["rope_local"]["theta"] = 2e4
    assert ArchConfig.from_dict(data) != cfg


def test_unknown_fields_rejected():
    data = json.loads(tiny().to_json())
    with pytest.raises(ConfigError, match="rope_thetta"):
        ArchConfig.from_dict({**data, "rope_thetta": 1.0})
    data["rope"]["thetta"] = 1.0
    with pytest.raises(ConfigError, match="rope.*thetta"):
        ArchConfig.from_dict(data)
    data = json.loads(tiny().to_json())
    data["norm"]["epsilon"] = 1e-5
    with pytest.raises(ConfigError, match="norm.*epsilon"):
        ArchConfig.from_dict(data)


def test_missing_required_field_is_a_config_error():
    data = dict(TINY)
    del data["d_ff"]
    with pytest.raises(ConfigError, match="d_ff"):
        ArchConfig.from_dict(data)


def test_invalid_value_in_json_is_a_config_error():
    data = json.loads(tiny().to_json())
    data["rope"]["layout"] = "spiral"
    with pytest.raises(ConfigError, match="layout='spiral'"):
        ArchConfig.from_dict(data)
    data = json.loads(tiny().to_json())
    data["norm"] = "rms"
    with pytest.raises(ConfigError, match="norm"):
        ArchConfig.from_dict(data)


def test_rope_and_window_per_layer():
    local = RopeConfig(theta=1e4)
    cfg = tiny(n_layers=3, layer_kinds=("local", "global", "local"), sliding_window=5,
               layer_positions=("rope", "rope", "none"), rope=RopeConfig(theta=1e6), rope_local=local)
    assert cfg.rope_for(0) is local and cfg.rope_for(1) is cfg.rope and cfg.rope_for(2) is None
    assert [cfg.window_for(i) for i in range(3)] == [5, None, 5]
    assert tiny(layer_kinds=("local", "global"), sliding_window=5).rope_for(0) == RopeConfig()


def test_kv_cache_bytes():
    assert tiny(n_kv_heads=2).kv_cache_bytes_per_token() == 2 * 2 * 2 * 8 * 2


def test_qk_norm_bias_has_one_spelling_per_model():
    """Unset, the QK norms follow the block norms' bias; without a QK norm it is False whatever was
    asked, so two configs that compute the same function compare equal (and export compares them)."""
    layer = NormConfig(kind="layer", bias=True)
    assert tiny(norm=layer, qk_norm="head").qk_norm_bias is True
    assert tiny(norm=layer, qk_norm="head", qk_norm_bias=False).qk_norm_bias is False
    unset = tiny(norm=layer)
    assert tiny(norm=layer, qk_norm="none", qk_norm_bias=True) == unset == tiny(norm=layer, qk_norm_bias=False)
    assert tiny(qk_norm="head").qk_norm_bias is False  # RMSNorm blocks: no bias
    cfg = tiny(norm=layer, qk_norm="head", qk_norm_weight="per_head", qk_norm_bias=False)
    assert ArchConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("overrides,fragment", [
    (dict(qk_norm="head", qk_norm_bias=True), "an RMSNorm has no bias"),
    (dict(qk_norm="head", qk_norm_bias="no"), "must be true, false or null"),
])
def test_qk_norm_bias_refusals_name_field_and_value(overrides, fragment):
    message = _error(**overrides)
    assert "qk_norm_bias" in message and repr(overrides["qk_norm_bias"]) in message and fragment in message
