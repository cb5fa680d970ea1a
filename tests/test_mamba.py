"""The state-space mixers (arch/mamba2.py, arch/mamba.py) against transformers' own torch modules,
element by element on perturbed weights: prefill longer than the conv width and several chunks (and
not a multiple of the chunk size), 34 cached one-token steps with transformers' DynamicCache, left
padding, fp32 and bf16. Families whose mixer is Mamba2's line for line (bamba, nemotron_h,
granitemoehybrid, zamba2) are its settings; Falcon-H1's mixer and FalconMamba's and Jamba's differ
and are built from their own classes here, as is Zamba's multi-head Mamba (its own kind, mamba_heads).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache
from transformers.masking_utils import create_recurrent_attention_mask
from transformers.models.bamba.configuration_bamba import BambaConfig
from transformers.models.bamba.modeling_bamba import BambaMixer
from transformers.models.falcon_h1.configuration_falcon_h1 import FalconH1Config
from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector
from transformers.models.falcon_mamba.configuration_falcon_mamba import FalconMambaConfig
from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer
from transformers.models.granitemoehybrid.configuration_granitemoehybrid import GraniteMoeHybridConfig
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer
from transformers.models.jamba.configuration_jamba import JambaConfig
from transformers.models.jamba.modeling_jamba import JambaMambaMixer
from transformers.models.mamba.configuration_mamba import MambaConfig
from transformers.models.mamba.modeling_mamba import MambaMixer
from transformers.models.mamba2.configuration_mamba2 import Mamba2Config
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
from transformers.models.nemotron_h.configuration_nemotron_h import NemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer
from transformers.models.zamba.configuration_zamba import ZambaConfig
from transformers.models.zamba.modeling_zamba import ZambaMambaMixer
from transformers.models.zamba2.configuration_zamba2 import Zamba2Config
from transformers.models.zamba2.modeling_zamba2 import Zamba2MambaMixer

from lmconvert.arch.cache import KVCache
from lmconvert.arch.config import ArchConfig
from lmconvert.arch.context import Context
from lmconvert.arch.errors import ConfigError
from lmconvert.arch.mixer_kinds import mixer_kind
from lmconvert.arch.parts import part_shapes

D_MODEL, PREFILL, STEPS = 32, 37, 34  # chunk 8: 4 full chunks and 5 more; conv width 4


def _mamba2(**extra):
    settings = dict(n_heads=8, head_dim=8, d_state=16, n_groups=2, conv_kernel=4, chunk_size=8, in_bias=True,
                    out_bias=True, norm_eps=1e-5, time_step_min=0.05, time_step_max=2.0)
    hf = Mamba2Config(hidden_size=D_MODEL, num_heads=8, head_dim=8, expand=2, state_size=16, n_groups=2,
                      conv_kernel=4, chunk_size=8, use_bias=True, use_conv_bias=True, num_hidden_layers=1,
                      layer_norm_epsilon=1e-5, time_step_limit=(0.05, 2.0), vocab_size=64)
    return hf, Mamba2Mixer, settings | extra


def _mamba2_line_for_line(family: str):
    """Families whose mixer is Mamba2Mixer's own forward under other config names."""
    settings = dict(n_heads=8, head_dim=8, d_state=16, n_groups=2, conv_kernel=4, chunk_size=8, in_bias=True,
                    out_bias=True, norm_eps=1e-5)
    common = dict(hidden_size=D_MODEL, num_hidden_layers=1, vocab_size=64, num_attention_heads=4,
                  num_key_value_heads=2)
    mamba = dict(mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                 mamba_chunk_size=8, mamba_proj_bias=True, mamba_conv_bias=True, rms_norm_eps=1e-5,
                 time_step_limit=(0.05, 2.0))
    if family == "bamba":
        return BambaConfig(**common, **mamba), BambaMixer, settings | dict(time_step_min=0.05, time_step_max=2.0)
    if family == "granitemoehybrid":
        return (GraniteMoeHybridConfig(**common, **mamba), GraniteMoeHybridMambaLayer,
                settings | dict(time_step_min=0.05, time_step_max=2.0))
    if family == "nemotron_h":
        hf = NemotronHConfig(hidden_size=D_MODEL, layers_block_type=["linear_attention"], vocab_size=64,
                             num_attention_heads=4, num_key_value_heads=2, ssm_state_size=16, mamba_num_heads=8,
                             mamba_head_dim=8, n_groups=2, conv_kernel=4, chunk_size=8, use_bias=True,
                             use_conv_bias=True, layer_norm_epsilon=1e-5, time_step_limit=(0.05, 2.0))
        return hf, NemotronHMamba2Mixer, settings | dict(time_step_min=0.05, time_step_max=2.0)
    # Zamba2: a conv bias always, RMSNorm eps 1e-5 whatever the config says, dt at least time_step_min
    hf = Zamba2Config(**common, layers_block_type=["mamba"], mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                      mamba_ngroups=2, n_mamba_heads=8, chunk_size=8, add_bias_linear=True, time_step_min=0.2,
                      use_conv_bias=False, rms_norm_eps=1e-6)
    return hf, Zamba2MambaMixer, settings | dict(time_step_min=0.2)


def _falcon_h1(rms_norm: bool, before_gate: bool):
    hf = FalconH1Config(hidden_size=D_MODEL, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8, mamba_d_state=16,
                        mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8, mamba_proj_bias=True,
                        projectors_bias=False, mamba_conv_bias=True, mamba_rms_norm=rms_norm,
                        mamba_norm_before_gate=before_gate, rms_norm_eps=1e-5, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                        ssm_multipliers=[0.7, 1.3, 0.45, 1.9, 0.35], ssm_in_multiplier=1.7)
    settings = dict(n_heads=6, head_dim=8, d_state=16, n_groups=2, conv_kernel=4, chunk_size=8, in_bias=True,
                    out_bias=False, norm="falcon_h1" if rms_norm else "none", norm_before_gate=before_gate and rms_norm,
                    norm_eps=1e-5, in_multiplier=1.7, zxbcdt_multipliers=(0.7, 1.3, 0.45, 1.9, 0.35))
    return hf, FalconH1Mixer, settings


def _mamba(kind: str):
    common = dict(hidden_size=D_MODEL, state_size=16, conv_kernel=4, use_bias=True, use_conv_bias=True,
                  num_hidden_layers=1, vocab_size=64, time_step_rank=6, intermediate_size=48)
    settings = dict(d_inner=48, d_state=16, dt_rank=6, conv_kernel=4, conv_bias=True, proj_bias=True)
    if kind == "mamba":
        return MambaConfig(**common), MambaMixer, settings
    if kind == "falcon_mamba":
        return (FalconMambaConfig(**common, mixer_rms_eps=1e-5), FalconMambaMixer,
                settings | dict(bc_dt_norm="weightless", bc_dt_norm_eps=1e-5))
    hf = JambaConfig(hidden_size=D_MODEL, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=6,
                     mamba_conv_bias=True, mamba_proj_bias=True, num_hidden_layers=1, vocab_size=64,
                     rms_norm_eps=1e-5, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=1,
                     expert_layer_offset=0, num_attention_heads=4, num_key_value_heads=2)  # layer 0: Mamba
    return hf, JambaMambaMixer, settings | dict(d_inner=64, bc_dt_norm="weighted", bc_dt_norm_eps=1e-5)


def _zamba():
    """Zamba's multi-head Mamba: 2 heads of 32 channels, each its own x_proj, dt_proj, A_log and D."""
    hf = ZambaConfig(hidden_size=D_MODEL, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=6,
                     n_mamba_heads=2, mamba_conv_bias=True, mamba_proj_bias=True, num_hidden_layers=1, vocab_size=64,
                     num_attention_heads=4, num_key_value_heads=2, layers_block_type=["mamba"])
    return hf, ZambaMambaMixer, dict(n_heads=2, d_inner=64, d_state=16, dt_rank=6, conv_kernel=4, conv_bias=True,
                                     proj_bias=True)


CASES = {
    "mamba2": lambda: _mamba2(),
    "bamba": lambda: _mamba2_line_for_line("bamba"),
    "granitemoehybrid": lambda: _mamba2_line_for_line("granitemoehybrid"),
    "nemotron_h": lambda: _mamba2_line_for_line("nemotron_h"),
    "zamba2": lambda: _mamba2_line_for_line("zamba2"),
    "falcon_h1_gate_first": lambda: _falcon_h1(True, False),
    "falcon_h1_norm_first": lambda: _falcon_h1(True, True),
    "falcon_h1_no_norm": lambda: _falcon_h1(False, True),
    "mamba": lambda: _mamba("mamba"),
    "falcon_mamba": lambda: _mamba("falcon_mamba"),
    "jamba": lambda: _mamba("jamba"),
    "zamba": _zamba,
}


UNCLAMPED = {"time_step_min": 0.0, "time_step_max": None}


def _perturb(module: torch.nn.Module, seed: int) -> None:
    """Every parameter away from its init, A_log to -exp in [-8, -0.5], dt biases around softplus^-1
    of useful steps, D and the norm weights near 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name == "A_log":
                p.copy_(torch.empty(p.shape).uniform_(math.log(0.5), math.log(8.0), generator=g))
            elif name in ("dt_bias", "dt_proj.bias", "dt_proj_bias"):
                p.copy_(noise * 0.6 - 1.0)
            elif name == "D" or name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            else:
                p.copy_(noise * (0.4 if "conv1d" in name else 0.2))


def _pair(case: str, dtype: torch.dtype, **override):
    """transformers' mixer for `case` with perturbed weights, and ours holding the same (its settings
    changed by `override`, for the tests that run ours alone)."""
    hf_cfg, hf_cls, settings = CASES[case]()
    settings = settings | override
    kind = "mamba" if hf_cls in (MambaMixer, FalconMambaMixer, JambaMambaMixer) else \
        "mamba_heads" if hf_cls is ZambaMambaMixer else "mamba2"
    cfg = ArchConfig(vocab_size=64, d_model=D_MODEL, n_layers=1, n_heads=4, d_ff=64, mixer=kind,
                     mixer_settings=settings)
    ours = mixer_kind(kind).build(cfg, 0)
    # FalconMambaMixer's own init reaches its norms before making them: built without it (perturbed below)
    hf = hf_cls(hf_cfg, layer_idx=0, **({"initialize_mixer_weights": False} if hf_cls is FalconMambaMixer else {}))
    if hf_cls is FalconH1Mixer:  # FalconH1Model registers it on each mixer
        hf.register_buffer("mup_vector", compute_mup_vector(hf_cfg), persistent=False)
    _perturb(hf, seed=sum(map(ord, case)))
    ours.load_state_dict({k: v for k, v in hf.state_dict().items() if k in ours.state_dict()}, strict=True)
    return hf_cfg, hf.to(dtype).eval(), ours.to(dtype).eval(), cfg


def _hf_call(hf, hf_cfg, x, cache, full_mask):
    mask = create_recurrent_attention_mask(hf_cfg, x, full_mask, cache)
    return hf(x, cache=cache, attention_mask=mask)


def _our_call(ours, x, cache, full_mask, past):
    ctx = Context.build(past, x.shape[1], x.dtype, x.device, attention_mask=full_mask)
    return ours(x, ctx, cache)


def _inputs(dtype: torch.dtype, batch: int = 2, pad: int = 0):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch, PREFILL + STEPS, D_MODEL, generator=g).to(dtype)
    mask = torch.ones(batch, PREFILL + STEPS, dtype=torch.long)
    mask[0, :pad] = 0
    return x, mask


def _same(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> None:
    assert ours.dtype == theirs.dtype == dtype
    if dtype == torch.float32:
        assert (ours - theirs).abs().max().item() <= 1e-5
    assert torch.equal(ours, theirs), (ours.float() - theirs.float()).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_without_cache(case, dtype):
    hf_cfg, hf, ours, _ = _pair(case, dtype)
    x, _ = _inputs(dtype)
    with torch.no_grad():
        _same(_our_call(ours, x, None, None, 0), _hf_call(hf, hf_cfg, x, None, None), dtype)


@pytest.mark.slow  # 44 cases of 34 steps each: make test runs them, test-fast the prefills
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pad", [0, 5], ids=["unpadded", "left_padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_then_cached_steps(case, dtype, pad):
    """The chunked (or scanned) prefill, then one token at a time through transformers' DynamicCache
    and through ours, every step's output and the states compared."""
    hf_cfg, hf, ours, _ = _pair(case, dtype)
    x, mask = _inputs(dtype, pad=pad)
    full = mask if pad else None
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    with torch.no_grad():
        theirs = _hf_call(hf, hf_cfg, x[:, :PREFILL], hf_cache, None if full is None else full[:, :PREFILL])
        _same(_our_call(ours, x[:, :PREFILL], cache, None if full is None else full[:, :PREFILL], 0), theirs, dtype)
        for t in range(PREFILL, PREFILL + STEPS):
            step_mask = None if full is None else full[:, :t + 1]
            theirs = _hf_call(hf, hf_cfg, x[:, t:t + 1], hf_cache, step_mask)
            _same(_our_call(ours, x[:, t:t + 1], cache, step_mask, t), theirs, dtype)
    state = cache.states[0]
    assert torch.equal(state["conv"], hf_cache.layers[0].conv_states[0])
    assert torch.equal(state["ssm"], hf_cache.layers[0].recurrent_states[0])
    assert state["ssm"].dtype == torch.float32 and state["conv"].dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", ["mamba2", "zamba2", "falcon_h1_norm_first"])
def test_mamba2_continues_a_prefill_in_chunks(case, dtype):
    """A multi-token call after a cached one (chunked prefill): the conv reads the cached window, the
    chunked scan starts from the cached state, as transformers' does; then a few steps."""
    hf_cfg, hf, ours, _ = _pair(case, dtype)
    x, _ = _inputs(dtype)
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    with torch.no_grad():
        for start, end in ((0, 11), (11, 30), (30, 31), (31, 45), (45, 46)):
            theirs = _hf_call(hf, hf_cfg, x[:, start:end], hf_cache, None)
            _same(_our_call(ours, x[:, start:end], cache, None, start), theirs, dtype)


def test_mamba_continues_a_prefill_from_its_state():
    """Mamba (v1): a multi-token call after a cached one starts its scan from the cached state, so it
    gives what one forward over the whole sequence gives (transformers' full-sequence scan restarts
    from zero there, which its own TODO calls wrong; this is the one place we differ)."""
    _, _, ours, _ = _pair("falcon_mamba", torch.float32)
    x, _ = _inputs(torch.float32)
    cache = KVCache(1)
    with torch.no_grad():
        full = _our_call(ours, x[:, :45], None, None, 0)
        parts = [_our_call(ours, x[:, s:e], cache, None, s) for s, e in ((0, 11), (11, 30), (30, 31), (31, 45))]
    assert (torch.cat(parts, dim=1) - full).abs().max().item() <= 1e-5 * full.abs().max().item()


@pytest.mark.parametrize("case", ["mamba2", "falcon_h1_norm_first", "mamba", "jamba"])
def test_cached_steps_match_our_full_forward(case):
    """Decoding token by token after a prefill computes what one forward over the whole sequence
    does: the recurrent step and the chunked scan are the same sums, rounded apart (fp32). Without a
    dt clamp: transformers clamps dt in the chunked prefill only, never in the one-token step."""
    _, _, ours, _ = _pair(case, torch.float32, **({} if case in ("mamba", "jamba") else UNCLAMPED))
    x, _ = _inputs(torch.float32)
    cache = KVCache(1)
    with torch.no_grad():
        full = _our_call(ours, x, None, None, 0)
        steps = [_our_call(ours, x[:, :PREFILL], cache, None, 0)]
        steps += [_our_call(ours, x[:, t:t + 1], cache, None, t) for t in range(PREFILL, PREFILL + STEPS)]
    diff = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert diff <= 1e-5 * full.abs().max().item(), diff


@pytest.mark.parametrize("case", ["mamba2", "mamba"])
def test_left_padding_leaves_the_real_tokens_alone(case):
    """A row padded on the left gives its real tokens what the row alone gives them: the padding is
    zeroed before the conv and the scan, so it adds nothing to either state. Without an in_proj bias:
    transformers zeroes the projection's input, so a bias reaches the conv window of the first real tokens."""
    _, _, ours, _ = _pair(case, torch.float32, **({"in_bias": False} if case == "mamba2" else {"proj_bias": False}))
    x, mask = _inputs(torch.float32, pad=5)
    with torch.no_grad():
        padded = _our_call(ours, x[:, :PREFILL], None, mask[:, :PREFILL], 0)[0, 5:]
        alone = _our_call(ours, x[:1, 5:PREFILL], None, None, 0)[0]
    assert (padded - alone).abs().max().item() <= 1e-5


@pytest.mark.parametrize("case", ["mamba2", "falcon_h1_no_norm", "jamba", "falcon_mamba"])
def test_parts_are_the_state_dict_and_the_state_size(case):
    """The declared parts list the module's state_dict in order, with its shapes; the declared state
    size is what one sequence keeps in the cache."""
    _, _, ours, cfg = _pair(case, torch.float32)
    kind = mixer_kind(cfg.mixer)
    declared = part_shapes(kind.parts(cfg), "mixer")
    assert list(declared.items()) == [(f"mixer.{k}", tuple(v.shape)) for k, v in ours.state_dict().items()]
    cache = KVCache(1)
    with torch.no_grad():
        _our_call(ours, torch.randn(1, 3, D_MODEL), cache, None, 0)
    assert sum(t.numel() for t in cache.states[0].values()) == kind.state_elements(cfg)
    assert kind.describe(cfg)


@pytest.mark.parametrize("settings, message", [
    (dict(n_heads=6, n_groups=4), "n_groups=4: must divide n_heads=6"),
    (dict(norm="mamba2", norm_before_gate=True), "only norm='falcon_h1'"),
    (dict(zxbcdt_multipliers=[1.0, 2.0]), "must be five numbers"),
    (dict(activation="gelu"), "must be one of silu"),
    (dict(chunk_size=0), "chunk_size=0: must be a positive integer"),
])
def test_mamba2_settings_are_checked(settings, message):
    with pytest.raises(ConfigError, match=message):
        ArchConfig(vocab_size=64, d_model=D_MODEL, n_layers=1, n_heads=4, d_ff=64, mixer="mamba2",
                   mixer_settings=settings)


def test_mamba_settings_are_checked():
    with pytest.raises(ConfigError, match="bc_dt_norm='jamba': must be one of none, weightless, weighted"):
        ArchConfig(vocab_size=64, d_model=D_MODEL, n_layers=1, n_heads=4, d_ff=64, mixer="mamba",
                   mixer_settings=dict(bc_dt_norm="jamba"))


@pytest.mark.parametrize("mixer, settings", [
    ("mamba2", dict(n_heads=6, head_dim=8, d_state=16, n_groups=2, norm="falcon_h1", norm_before_gate=True,
                    zxbcdt_multipliers=[0.7, 1.3, 0.45, 1.9, 0.35], in_multiplier=1.7, time_step_min=0.001)),
    ("mamba", dict(d_inner=64, dt_rank=2, bc_dt_norm="weighted")),
])
def test_settings_survive_lmconvert_json(mixer, settings):
    """The settings written to lmconvert.json read back equal (a list of multipliers as a tuple, no
    upper dt bound as null)."""
    cfg = ArchConfig(vocab_size=64, d_model=D_MODEL, n_layers=2, n_heads=4, d_ff=64, mixer=mixer,
                     mixer_settings=settings)
    assert ArchConfig.from_json(cfg.to_json()) == cfg
