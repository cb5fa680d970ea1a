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
from arch_helpers import max_diff, perturb

from lmconvert.arch import ArchConfig
from lmconvert.arch.cache import KVCache
from lmconvert.arch.context import Context
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


def _x(dtype: torch.dtype, seq: int = T, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, seq, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _worst(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _ctx(past: int, n: int, dtype: torch.dtype, mask: torch.Tensor | None = None) -> Context:
    return Context.build(past, n, dtype, torch.device("cpu"), attention_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_prefill_is_transformers_bit_for_bit(family: str, neg_eigval: bool, dtype: torch.dtype) -> None:
    """A prefill of 150 tokens (conv width 4, chunks of 64): transformers' chunked path, equal bit
    for bit in fp32, bf16 and fp16; with and without a cache (which keeps the conv window)."""
    ref, ours, hf_cfg = _pair(family, neg_eigval, dtype)
    x = _x(dtype)
    with torch.no_grad():
        expected = ref(x)
        assert torch.equal(ours(x, _ctx(0, T, dtype), None), expected)
        assert torch.equal(ours(x, _ctx(0, T, dtype), KVCache(1)), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_cached_decoding_is_transformers_step_by_step(family: str, neg_eigval: bool, dtype: torch.dtype) -> None:
    """A prefill of 70 tokens, a 5-token continuation (the chunked rule from the cached state, the
    conv over the kept window), then 36 tokens one at a time (the recurrent rule, the conv update):
    each step equal bit for bit to transformers' module run with its own cache (DynamicCache of a
    linear_attention layer); the states we keep equal to the ones it keeps; and, in fp32, the
    steps within 1e-5 of our own uncached forward over the whole sequence (chunked throughout)."""
    from transformers import DynamicCache

    ref, ours, hf_cfg = _pair(family, neg_eigval, dtype)
    x = _x(dtype, seq=111)
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    pieces = [(0, 70), (70, 75)] + [(t, t + 1) for t in range(75, 111)]
    steps = []
    with torch.no_grad():
        for start, end in pieces:
            expected = ref(x[:, start:end], cache=hf_cache)
            got = ours(x[:, start:end], _ctx(start, end - start, dtype), cache)
            assert torch.equal(got, expected), (start, end, max_diff(got, expected))
            steps.append(got)
        layer = hf_cache.layers[0]
        assert torch.equal(cache.states[0]["conv"], layer.conv_states[0])
        assert torch.equal(cache.states[0]["recurrent"], layer.recurrent_states[0])
        assert (cache.states[0]["conv"].dtype, cache.states[0]["recurrent"].dtype) == (dtype, torch.float32)
    exact, x, cache = ours.double(), x.double(), KVCache(1)  # float64: rounding cannot hide a wrong state
    with torch.no_grad():
        steps = [exact(x[:, start:end], _ctx(start, end - start, torch.float64), cache) for start, end in pieces]
        assert _worst(torch.cat(steps, 1), exact(x, _ctx(0, 111, torch.float64), None)) <= 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_left_padding_is_transformers(family: str, neg_eigval: bool, dtype: torch.dtype) -> None:
    """Left padding (row 0 padded by 9): the padded inputs zeroed before the projections, as
    transformers' apply_mask_to_padding_states with the 2D mask create_recurrent_attention_mask
    gives a multi-token forward (and None for one token); prefill and 33 decoding steps equal bit
    for bit; in float64, the padded row's real tokens as the unpadded sequence alone (1e-10)."""
    from transformers import DynamicCache

    ref, ours, hf_cfg = _pair(family, neg_eigval, dtype)
    n = 100
    x = _x(dtype, seq=n + 33)
    mask = torch.ones(2, n + 33, dtype=torch.long)
    mask[0, :9] = 0
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    with torch.no_grad():
        expected = ref(x[:, :n], cache=hf_cache, attention_mask=mask[:, :n])
        got = ours(x[:, :n], _ctx(0, n, dtype, mask[:, :n]), cache)
        assert torch.equal(got, expected)
        outputs = [got]
        for t in range(n, n + 33):
            expected = ref(x[:, t:t + 1], cache=hf_cache)
            got = ours(x[:, t:t + 1], _ctx(t, 1, dtype, mask[:, :t + 1]), cache)
            assert torch.equal(got, expected), t
            outputs.append(got)
    exact, x, cache = ours.double(), x.double(), KVCache(1)
    with torch.no_grad():
        outputs = [exact(x[:, :n], _ctx(0, n, torch.float64, mask[:, :n]), cache)]
        outputs += [exact(x[:, t:t + 1], _ctx(t, 1, torch.float64, mask[:, :t + 1]), cache) for t in range(n, n + 33)]
        alone = exact(x[:1, 9:], _ctx(0, n + 24, torch.float64), None)
        assert _worst(torch.cat(outputs, 1)[:1, 9:], alone) <= 1e-10
        unmasked = exact(x[:1, :n], _ctx(0, n, torch.float64), None)
        assert _worst(unmasked[:, 9:], alone[:, :n - 9]) > 1e-3  # unmasked, the padding would leak in


@pytest.mark.parametrize(("family", "neg_eigval"), CASES)
def test_state_elements_is_what_transformers_keeps(family: str, neg_eigval: bool) -> None:
    """The kind's state per sequence and layer: the conv window and the recurrent state transformers'
    cache holds for one sequence; the parts are the module's tensors."""
    from transformers import DynamicCache

    ref, ours, hf_cfg = _pair(family, neg_eigval, torch.float32)
    hf_cache = DynamicCache(config=hf_cfg)
    with torch.no_grad():
        ref(_x(torch.float32, seq=10, batch=1), cache=hf_cache)
    layer = hf_cache.layers[0]
    kind = mixer_kind("gated_deltanet")
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, mixer="gated_deltanet",
                     mixer_settings=dict(key_heads=HK, value_heads=HV, key_head_dim=DK, value_head_dim=DV))
    assert kind.state_elements(cfg) == layer.conv_states[0].numel() + layer.recurrent_states[0].numel()
    shapes = {}
    for name, part in kind.parts(cfg).items():
        shapes |= part.shapes(name)
    assert shapes == {name: tuple(p.shape) for name, p in ours.state_dict().items()}
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
