"""The gated delta-net mixer kind (`mixer="gated_deltanet"`, arch/gated_deltanet.py) against
transformers' own modules: Qwen3NextGatedDeltaNet (fused, per-key-head interleaved in_proj_qkvz /
in_proj_ba), Qwen3_5GatedDeltaNet (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and
OlmoHybridGatedDeltaNet (q/k/v/g/a/b projections, the gated norm's eps fixed at 1e-5,
allow_neg_eigval both ways), their weights perturbed and carried into our one layout by the
transforms below (the HF -> canonical layout of each family), bit for bit in fp32, bf16 and fp16:
prefill longer than the conv width and two chunks, cached decoding token by token against
transformers' module with its own cache (and, in float64, against our full forward), left padding
as transformers applies it.
"""

from __future__ import annotations

import pytest
import torch
from arch_helpers import perturb
from delta_rule_checks import check_cached_decoding, check_left_padding, check_prefill, check_state_and_parts, inputs

from lmconvert.arch import ArchConfig
from lmconvert.arch.errors import ConfigError
from lmconvert.arch.mixer_kinds import mixer_kind

D, HK, HV, DK, DV, KERNEL = 32, 2, 4, 8, 16, 4  # two value heads per key head
T = 150  # > the conv width, two chunks of 64 and a part


def _hf_config(family: str, neg_eigval: bool = False):
    common = dict(hidden_size=D, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                  rms_norm_eps=1e-6, linear_num_key_heads=HK, linear_num_value_heads=HV, linear_key_head_dim=DK,
                  linear_value_head_dim=DV, linear_conv_kernel_dim=KERNEL, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64)
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig
        return Qwen3NextConfig(**common)
    if family == "qwen3_5":
        from transformers import Qwen3_5TextConfig
        return Qwen3_5TextConfig(**common)
    from transformers import OlmoHybridConfig
    return OlmoHybridConfig(**common, linear_allow_neg_eigval=neg_eigval)


def _hf_module(family: str, cfg):
    if family == "qwen3_next":
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
        return Qwen3NextGatedDeltaNet(cfg, 0)
    if family == "qwen3_5":
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
        return Qwen3_5GatedDeltaNet(cfg, 0)
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet
    return OlmoHybridGatedDeltaNet(cfg, 0)


# Our layout is Qwen3.5's. Each family's tensors in three steps: renamed one to one (".weight" kept),
# fused ones cut into the pieces q, k, v, z, b, a, and the pieces joined into ours (export: the
# reverse). A fused tensor is (name, groups, pieces, rows of each piece per group): its rows are
# `groups` runs, each [piece 0 | piece 1 | ...]. Qwen3-Next interleaves per key head (in_proj_qkvz:
# q (Dk), k (Dk), v (r Dv), z (r Dv); in_proj_ba: b (r), a (r); r = value_heads / key_heads).
RENAMES = {
    "qwen3_next": {},
    "qwen3_5": {},
    "olmo_hybrid": {"q_proj": "q", "k_proj": "k", "v_proj": "v", "g_proj": "z", "b_proj": "b", "a_proj": "a",
                    "o_norm": "norm", "o_proj": "out_proj"},
}
OURS = [("in_proj_qkv", 1, "qkv", [HK * DK, HK * DK, HV * DV]), ("in_proj_z", 1, "z", [HV * DV]),
        ("in_proj_b", 1, "b", [HV]), ("in_proj_a", 1, "a", [HV])]
FUSED = {
    "qwen3_next": [("in_proj_qkvz", HK, "qkvz", [DK, DK, HV // HK * DV, HV // HK * DV]),
                   ("in_proj_ba", HK, "ba", [HV // HK, HV // HK])],
    "qwen3_5": OURS,
    "olmo_hybrid": [],
}


def _split(tensors: dict[str, torch.Tensor], fused: list) -> dict[str, torch.Tensor]:
    for name, groups, pieces, rows in fused:
        cut = tensors.pop(f"{name}.weight").view(groups, -1, D).split(rows, 1)
        tensors |= {f"{n}.weight": w.reshape(-1, D) for n, w in zip(pieces, cut, strict=True)}
    return tensors


def _join(tensors: dict[str, torch.Tensor], fused: list) -> dict[str, torch.Tensor]:
    for name, groups, pieces, _ in fused:
        tensors[f"{name}.weight"] = torch.cat([tensors.pop(f"{n}.weight").view(groups, -1, D) for n in pieces], 1
                                              ).reshape(-1, D)
    return tensors


def _rename(tensors: dict[str, torch.Tensor], names: dict[str, str]) -> dict[str, torch.Tensor]:
    def one(name: str) -> str:
        module, _, kind = name.rpartition(".")
        return f"{names[module]}.{kind}" if module in names else name
    return {one(name): w for name, w in tensors.items()}


def to_ours(family: str, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _join(_split(_rename(hf, RENAMES[family]), FUSED[family]), OURS)


def to_hf(family: str, ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _rename(_join(_split(ours, OURS), FUSED[family]), {o: h for h, o in RENAMES[family].items()})


CASES = [("qwen3_next", False), ("qwen3_5", False), ("olmo_hybrid", False), ("olmo_hybrid", True)]


def _pair(family: str, neg_eigval: bool, dtype: torch.dtype):
    """transformers' module, perturbed, and ours holding its weights."""
    hf_cfg = _hf_config(family, neg_eigval)
    torch.manual_seed(0)
    ref = _hf_module(family, hf_cfg)
    perturb(ref, seed=3)
    ref = ref.to(dtype).eval()
    settings = dict(key_heads=HK, value_heads=HV, key_head_dim=DK, value_head_dim=DV, conv_kernel=KERNEL,
                    norm_eps=1e-5 if family == "olmo_hybrid" else hf_cfg.rms_norm_eps, neg_eigval=neg_eigval)
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, max_positions=512,
                     mixer="gated_deltanet", mixer_settings=settings)
    ours = mixer_kind("gated_deltanet").build(cfg, 0).to(dtype).eval()
    ours.load_state_dict(to_ours(family, dict(ref.state_dict())), strict=True)
    return ref, ours, hf_cfg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_prefill_is_transformers_bit_for_bit(family: str, neg_eigval: bool, dtype: torch.dtype) -> None:
    """A prefill of 150 tokens (conv width 4, chunks of 64): transformers' chunked path, equal bit
    for bit in fp32, bf16 and fp16; with and without a cache (which keeps the conv window)."""
    ref, ours, _ = _pair(family, neg_eigval, dtype)
    check_prefill(ref, ours, inputs(dtype, D, T))


@pytest.mark.slow  # 41 steps in three dtypes per family: make test runs them
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_cached_decoding_is_transformers_step_by_step(family: str, neg_eigval: bool, dtype: torch.dtype) -> None:
    """A prefill of 70 tokens, a 5-token continuation, then 36 tokens one at a time, each equal bit
    for bit to transformers' module with its own cache, the states too; in float64 as our full
    forward (`delta_rule_checks.check_cached_decoding`)."""
    ref, ours, hf_cfg = _pair(family, neg_eigval, dtype)
    check_cached_decoding(ref, ours, hf_cfg, inputs(dtype, D, 111))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_left_padding_is_transformers(family: str, neg_eigval: bool, dtype: torch.dtype) -> None:
    """Left padding (row 0 padded by 9): prefill and 33 decoding steps equal bit for bit; in float64,
    the padded row's real tokens as the unpadded sequence alone (`delta_rule_checks.check_left_padding`)."""
    ref, ours, hf_cfg = _pair(family, neg_eigval, dtype)
    check_left_padding(ref, ours, hf_cfg, inputs(dtype, D, 133))


@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_state_elements_is_what_transformers_keeps(family: str, neg_eigval: bool) -> None:
    """The kind's state per sequence and layer: the conv window and the recurrent state transformers'
    cache holds for one sequence; the parts are the module's tensors."""
    ref, ours, hf_cfg = _pair(family, neg_eigval, torch.float32)
    kind = mixer_kind("gated_deltanet")
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, mixer="gated_deltanet",
                     mixer_settings=dict(key_heads=HK, value_heads=HV, key_head_dim=DK, value_head_dim=DV))
    check_state_and_parts(kind, cfg, ref, ours, hf_cfg, D)
    assert any("gated delta-net" in line for line in kind.describe(cfg))


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "olmo_hybrid"])
def test_layouts_round_trip(family: str) -> None:
    """Each family's layout to ours and back: every tensor as it was (the import and export transforms)."""
    ref, ours, _ = _pair(family, False, torch.float32)
    back = to_hf(family, dict(ours.state_dict()))
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(w, back[name]) for name, w in ref.state_dict().items())


@pytest.mark.parametrize(("settings", "message"), [
    (dict(key_heads=3, value_heads=4, key_head_dim=8, value_head_dim=8), "value_heads=4: must be a multiple"),
    (dict(key_heads=2, value_heads=4, key_head_dim=0, value_head_dim=8), "key_head_dim=0: must be a positive"),
    (dict(key_heads=2, value_heads=4, key_head_dim=8, value_head_dim=8, conv_kernel=True), "conv_kernel=True"),
    (dict(key_heads=2, value_heads=4, key_head_dim=8, value_head_dim=8, norm_eps=0), "norm_eps=0"),
    (dict(key_heads=2, value_heads=4, key_head_dim=8, value_head_dim=8, neg_eigval=1), "neg_eigval=1: must be true"),
    (dict(key_heads=2, value_heads=4, activation="gelu"), "activation='gelu': must be one of silu"),
    (dict(key_heads=2, value_heads=4, head_dim=8), "unknown field.*head_dim"),
])
def test_bad_settings_are_refused_by_name(settings: dict | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, mixer="gated_deltanet",
                   mixer_settings=settings)
