"""The Kimi delta attention mixer kind (`mixer="kimi_delta"`, arch/kimi_delta.py) against
transformers' own KimiLinearDeltaAttention, its weights initialised as KimiLinearPreTrainedModel
does (A_log, dt_bias) and perturbed, carried into our layout by the transform below (A_log one
value per head), bit for bit in fp32, bf16 and fp16: a prefill longer than the conv width and two
chunks, cached decoding token by token against transformers' module with its own cache (and, in
float64, against our full forward), left padding as transformers applies it. The gated delta-net's
own tests (tests/test_gated_deltanet.py) prove the shared recurrent rule unchanged for it.
"""

from __future__ import annotations

import math

import pytest
import torch
from arch_helpers import max_diff, perturb
from delta_rule_checks import (
    check_cached_decoding,
    check_left_padding,
    check_prefill,
    check_state_and_parts,
    ctx,
    inputs,
)

from lmconvert.arch import ArchConfig
from lmconvert.arch.cache import KVCache
from lmconvert.arch.errors import ConfigError
from lmconvert.arch.mixer_kinds import mixer_kind

D, H, DK, KERNEL = 32, 4, 8, 4
T = 150  # > the conv width, two chunks of 64 and a part


def _hf_config():
    from transformers import KimiLinearConfig
    return KimiLinearConfig(hidden_size=D, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                            rms_norm_eps=1e-5, linear_num_heads=H, linear_head_dim=DK, linear_conv_kernel_dim=KERNEL,
                            num_attention_heads=4, num_key_value_heads=4, vocab_size=64, pad_token_id=None,
                            bos_token_id=None, eos_token_id=None)


def to_ours(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' module layout -> ours: A_log (1, 1, heads, 1) -> (heads,); the rest one to one."""
    return hf | {"forget_gate.A_log": hf["forget_gate.A_log"].reshape(-1)}


def to_hf(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return ours | {"forget_gate.A_log": ours["forget_gate.A_log"].view(1, 1, -1, 1)}


def _settings() -> dict:
    return dict(heads=H, head_dim=DK, conv_kernel=KERNEL, norm_eps=1e-5)


def _pair(dtype: torch.dtype):
    """transformers' module, initialised as its pretrained model does and perturbed, and ours holding its weights."""
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    hf_cfg = _hf_config()
    torch.manual_seed(0)
    ref = KimiLinearDeltaAttention(hf_cfg, 0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # KimiLinearPreTrainedModel._init_weights (FLA's): module construction leaves them empty
        ref.forget_gate.A_log.copy_(torch.empty(1, 1, H, 1).uniform_(1.0, 16.0, generator=gen).log())
        dt = torch.empty(H * DK).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp().clamp_min(1e-4)
        ref.forget_gate.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
    perturb(ref, seed=3)
    ref = ref.to(dtype).eval()
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, max_positions=512,
                     mixer="kimi_delta", mixer_settings=_settings())
    ours = mixer_kind("kimi_delta").build(cfg, 0).to(dtype).eval()
    ours.load_state_dict(to_ours(dict(ref.state_dict())), strict=True)
    return ref, ours, hf_cfg


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_is_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    """A prefill of 150 tokens (conv width 4, chunks of 64): transformers' chunked path
    (chunk_kimi_delta_attention), equal bit for bit in fp32, bf16 and fp16; with and without a cache."""
    ref, ours, _ = _pair(dtype)
    check_prefill(ref, ours, inputs(dtype, D, T))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_decoding_is_transformers_step_by_step(dtype: torch.dtype) -> None:
    """A prefill of 70 tokens, a 5-token continuation (the chunked rule from the cached state), then 36
    tokens one at a time (recurrent_kimi_delta_attention), each equal bit for bit to transformers'
    module with its own cache, the states too; in float64 as our full forward
    (`delta_rule_checks.check_cached_decoding`)."""
    ref, ours, hf_cfg = _pair(dtype)
    check_cached_decoding(ref, ours, hf_cfg, inputs(dtype, D, 111))


@pytest.mark.parametrize("dtype", DTYPES)
def test_left_padding_is_transformers(dtype: torch.dtype) -> None:
    """Left padding (row 0 padded by 9): prefill and 33 decoding steps equal bit for bit; in float64,
    the padded row's real tokens as the unpadded sequence alone (`delta_rule_checks.check_left_padding`)."""
    ref, ours, hf_cfg = _pair(dtype)
    check_left_padding(ref, ours, hf_cfg, inputs(dtype, D, 133))


def test_state_elements_and_parts_are_what_transformers_has() -> None:
    """The kind's state per sequence and layer is what transformers' cache holds; the parts are the
    module's tensors; the layout transform round-trips every tensor."""
    ref, ours, hf_cfg = _pair(torch.float32)
    kind = mixer_kind("kimi_delta")
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, mixer="kimi_delta",
                     mixer_settings=_settings())
    check_state_and_parts(kind, cfg, ref, ours, hf_cfg, D)
    assert any("Kimi delta attention" in line for line in kind.describe(cfg))
    back = to_hf(dict(ours.state_dict()))
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(w, back[name]) for name, w in ref.state_dict().items())


@pytest.mark.parametrize(("settings", "message"), [
    (dict(heads=0, head_dim=8), "heads=0: must be a positive"),
    (dict(heads=2, head_dim=8, conv_kernel=True), "conv_kernel=True"),
    (dict(heads=2, head_dim=8, norm_eps=0), "norm_eps=0"),
    (dict(heads=2, head_dim=8, activation="gelu"), "activation='gelu': must be one of silu"),
    (dict(heads=2, key_heads=2), "unknown field.*key_heads"),
])
def test_bad_settings_are_refused_by_name(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, mixer="kimi_delta",
                   mixer_settings=settings)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_nope_latent_attention_is_kimi_linear_attention(dtype: torch.dtype, q_lora_rank: int | None) -> None:
    """Kimi Linear's other layers: KimiLinearAttention, DeepSeek's MLA without RoPE (the latent kind
    with layer_positions "none": the k_rot part shared by every head unrotated), eager, a prefill of
    40 then 12 cached tokens one at a time, bit for bit in fp32, bf16 and fp16, with and without the
    q LoRA; the cache of each holds the same latent."""
    from transformers import DynamicCache, KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearAttention

    from lmconvert.arch.attention_kinds import attention_kind
    from lmconvert.arch.describe import variants

    hf_cfg = KimiLinearConfig(hidden_size=D, num_hidden_layers=1, layer_types=["full_attention"],
                              num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=16,
                              qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, vocab_size=64,
                              pad_token_id=None, bos_token_id=None, eos_token_id=None)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = KimiLinearAttention(hf_cfg, 0)
    perturb(ref, seed=3)
    ref = ref.to(dtype).eval()
    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=1, n_heads=4, d_ff=48, max_positions=512, head_dim=8,
                     attention="latent", layer_positions=("none",),
                     attention_settings=dict(kv_lora_rank=16, qk_nope_head_dim=12, v_head_dim=10,
                                             q_lora_rank=q_lora_rank))
    card = variants(cfg)
    assert "MLA head dims: q/k 12 + shared unrotated (no positions) 8, v 10; score scale 0.223607" in card
    assert "positions: none (all layers)" in card and not any("RoPE" in line for line in card)
    ours = attention_kind("latent").build(cfg, 0, None, None).to(dtype).eval()
    ours.backend = "eager"
    names = {"q_proj": "q", "q_a_proj": "q_a", "q_a_layernorm": "q_a_norm", "q_b_proj": "q_b",
             "kv_a_proj_with_mqa": "kv_a", "kv_a_layernorm": "kv_a_norm", "kv_b_proj": "kv_b", "o_proj": "o"}
    ours.load_state_dict({f"{names[n.rpartition('.')[0]]}.{n.rpartition('.')[2]}": w
                          for n, w in ref.state_dict().items()}, strict=True)
    x = inputs(dtype, D, 52)
    hf_cache, cache = DynamicCache(config=hf_cfg), KVCache(1)
    pieces = [(0, 40)] + [(t, t + 1) for t in range(40, 52)]
    with torch.no_grad():
        for start, end in pieces:
            n = end - start
            mask = torch.full((n, end), torch.finfo(dtype).min, dtype=dtype).triu(start + 1)[None, None]
            expected, _ = ref(x[:, start:end], mask, cache=hf_cache)
            got = ours(x[:, start:end], ctx(start, n, dtype), cache)
            assert torch.equal(got, expected), (start, max_diff(got, expected))
    assert torch.equal(cache.keys[0], hf_cache.layers[0].keys)
    assert torch.equal(cache.values[0], hf_cache.layers[0].values)


def test_kimi_shaped_stack_decodes_as_its_full_forward() -> None:
    """Kimi Linear's shape in the canonical decoder: three KDA layers to one NoPE MLA layer, in float64.
    A prefill of 70 (two chunks), then 40 tokens one at a time, equal to the uncached forward over all
    110 (chunked throughout) within 1e-10; the cache holds each layer's state and what the card says."""
    from arch_helpers import build, tokens

    cfg = ArchConfig(vocab_size=64, d_model=D, n_layers=4, n_heads=4, d_ff=48, max_positions=512, head_dim=8,
                     mixer="kimi_delta", mixer_settings=_settings(), layer_mixers=("mixer",) * 3 + ("attention",),
                     attention="latent", layer_positions=("none",) * 4,
                     attention_settings=dict(kv_lora_rank=16, qk_nope_head_dim=12, v_head_dim=10))
    model = build(cfg, dtype=torch.float64)
    ids = tokens(seq=110)
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        steps = torch.cat([model(ids[:, :70], cache=cache)] + [model(ids[:, t:t + 1], cache=cache)
                                                               for t in range(70, 110)], 1)
        assert max_diff(model(ids[:, -1:])[:, 0], full[:, -1]) > 1e-3  # the state is not ignored
    assert max_diff(steps, full) <= 1e-10
    assert [set(s) for s in cache.states] == [{"conv", "recurrent"}] * 3 + [set()]
    state = sum(t.numel() for s in cache.states for t in s.values()) // ids.shape[0]
    assert state == 3 * mixer_kind("kimi_delta").state_elements(cfg)


def test_kimi_linear_layout_transforms_invert_bit_for_bit() -> None:
    """The family's two layout transforms: q_conv1d, k_conv1d, v_conv1d gathered into conv1d and cut
    back, A_log [1, 1, heads, 1] to one value per head and back, every bit kept."""
    from lmconvert.mappings.tables.transforms import EqualPart, Shaped

    conv = torch.randn(3 * H * DK, 1, KERNEL).to(torch.bfloat16)
    steps = [EqualPart(3, i).bind({}) for i in range(3)]
    parts = [t.inverse(conv) for t in steps]
    assert [tuple(p.shape) for p in parts] == [(H * DK, 1, KERNEL)] * 3
    assert torch.equal(steps[0].forward(parts), conv)
    assert all(torch.equal(p, conv[i * H * DK:(i + 1) * H * DK]) for i, p in enumerate(parts))
    a_log = torch.randn(1, 1, H, 1)
    shaped = Shaped((1, 1, -1, 1)).bind({})
    assert shaped.forward(a_log).shape == (H,) and torch.equal(shaped.inverse(shaped.forward(a_log)), a_log)
