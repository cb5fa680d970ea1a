"""The variants Phi-3, Cohere, Cohere 2 and OLMo's `clip_qkv` added to the decoder, each held to
transformers' own code: longrope's frequencies and attention factor (against
`_compute_longrope_parameters`) and its switch to the long factors, per forward call, once a
sequence passes original_max_position_embeddings (a whole Phi-3 past it, full and cached);
Cohere's fp32 rotation, its written-out LayerNorm and per-head QK-norm weights (against
`CohereLayerNorm` and Cohere's `apply_rotary_pos_emb`, bit for bit); OLMo's clamp (a whole
perturbed model whose clamp bites); and bf16 bit-exactness of whole families against
transformers' bf16 forward on CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from family_specs import FP32_TOL, IDS, SPECS
from hf_models import (
    TINY,
    build_model,
    cached_logits,
    check_cached_decoding,
    check_round_trip,
    incremental,
    load_reference,
    save_checkpoint,
)
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.cohere.modeling_cohere import CohereLayerNorm
from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere_apply_rotary
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding
from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb as deepseek_v2_apply_rotary

import lmconvert
import lmconvert.mappings
from lmconvert.arch import ArchConfig, ConfigError, NormConfig, RopeConfig
from lmconvert.arch.norms import Norm
from lmconvert.arch.rope import SCALINGS, Rotary, apply_rotary
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.cli import main

COHERE_NORM = NormConfig(kind="layer", bias=False, eps=1e-5, dtype_order="scale_then_cast", written_out=True)


def _random(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3 + 0.5).to(dtype)


# ------------------------------------------------------------------------------------------------ longrope
SHORT, LONG = [1.0, 1.25, 1.5, 2.0], [2.0, 3.0, 5.0, 8.0]  # 4 frequencies: head_dim 16, half of it rotated


def _phi3_config(original: int, **rope: object) -> AutoConfig:
    params = {"rope_type": "longrope", "rope_theta": 2e4, "short_factor": SHORT, "long_factor": LONG,
              "partial_rotary_factor": 0.5, **rope}
    return AutoConfig.for_model("phi3", **TINY, original_max_position_embeddings=original, rope_parameters=params)


@pytest.mark.parametrize("rope", [{}, {"factor": 3.0}, {"attention_factor": 1.5}], ids=["derived", "factor", "stated"])
def test_longrope_frequencies_are_transformers(rope: dict[str, float]) -> None:
    """Short factors up to original_max_positions, long ones past it; cos/sin scaled by the
    attention factor in both regimes (from max_position_embeddings / original when `factor` is absent)."""
    config = _phi3_config(32, **rope)
    ours = lmconvert.mappings.family_for("phi3").arch_config(config.to_dict()).rope
    for seq_len in (20, 32, 33, 100):
        theirs, their_scale = ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=seq_len)
        inv_freq, scale = SCALINGS["longrope"](ours, 8, seq_len, TINY["max_position_embeddings"])
        assert torch.equal(inv_freq, theirs) and scale == their_scale, seq_len
    short, _ = SCALINGS["longrope"](ours, 8, 32, 128)
    long, _ = SCALINGS["longrope"](ours, 8, 33, 128)
    assert not torch.equal(short, long)


@pytest.fixture(scope="module")
def phi3_long(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Phi-3 whose original length (16) the test sequence (28) passes: a full forward uses the
    long factors."""
    kwargs = {**SPECS["phi3"].kwargs, "original_max_position_embeddings": 16}
    return save_checkpoint(build_model("phi3", **kwargs), tmp_path_factory.mktemp("phi3-long"))


def test_phi3_past_the_original_length_matches_transformers(phi3_long: Path) -> None:
    with torch.no_grad():
        expected = load_reference(phi3_long)(IDS).logits
        ours = lmconvert.load(phi3_long, attention="eager")(IDS)
        first = load_reference(phi3_long)(IDS[:, :16]).logits  # within the original length: short factors
    assert float((ours - expected).abs().max()) <= FP32_TOL
    assert float((first - expected[:, :16]).abs().max()) > 1e-3  # the long factors changed the first 16 too


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_phi3_cached_decoding_switches_to_long_factors_per_call(phi3_long: Path, attention: str) -> None:
    """As transformers' `dynamic_rope_update`: the prefill and the steps up to 16 positions rotate
    with the short factors, every later step with the long ones, while the cache keeps the keys
    it has. Equal to transformers' own cached decoding; not to a full forward (on either side)."""
    model = lmconvert.load(phi3_long, attention=attention)
    theirs = AutoModelForCausalLM.from_pretrained(phi3_long, attn_implementation=attention).eval()
    cache = model.new_cache()
    with torch.no_grad():
        ours = incremental(lambda chunk: model(chunk, cache=cache), IDS, 6)
        reference = cached_logits(theirs, IDS, 6)
        full = theirs(IDS).logits
    assert float((ours - reference).abs().max()) <= FP32_TOL
    assert float((reference - full).abs().max()) > 1e-3


@pytest.mark.bitexact
def test_phi3_long_bf16_logits_are_transformers_bit_for_bit(tmp_path: Path) -> None:
    kwargs = {**SPECS["phi3"].kwargs, "original_max_position_embeddings": 16}
    src = save_checkpoint(build_model("phi3", **kwargs), tmp_path / "bf16", torch.bfloat16)
    with torch.no_grad():
        theirs = load_reference(src, torch.bfloat16)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS)
    assert torch.equal(ours, theirs)


def test_longrope_config_refusals() -> None:
    with pytest.raises(ConfigError, match="rope.short_factor=None: required by scaling='longrope'"):
        RopeConfig(scaling="longrope", original_max_positions=16, long_factor=(1.0,))
    with pytest.raises(ConfigError, match="must have as many entries as short_factor"):
        RopeConfig(scaling="longrope", original_max_positions=16, short_factor=(1.0,), long_factor=(1.0, 2.0))
    with pytest.raises(ConfigError, match="is read only by scaling='longrope'"):
        RopeConfig(short_factor=(1.0,))
    with pytest.raises(ConfigError, match=r"needs one entry per rotary frequency \(8\)"):
        ArchConfig(vocab_size=32, d_model=64, n_layers=1, n_heads=4, d_ff=96,
                   rope=RopeConfig(scaling="longrope", original_max_positions=16, short_factor=(1.0,) * 4,
                                   long_factor=(2.0,) * 4))


# ------------------------------------------------------------------------------------------------ Cohere ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_fp32_rotation_is_coheres_bit_for_bit(dtype: torch.dtype) -> None:
    """q and k upcast for the rotation, cos/sin in the activation dtype: Cohere's order exactly."""
    rope = RopeConfig(layout="interleaved", fp32_rotation=True)
    cos, sin = Rotary(rope, 16, 64).tables(torch.arange(40), dtype)
    q, k = _random(2, 4, 40, 16, dtype=dtype), _random(2, 2, 40, 16, seed=1, dtype=dtype)
    ref_q, ref_k = cohere_apply_rotary(q, k, cos[None], sin[None])
    assert torch.equal(apply_rotary(q, cos, sin, "interleaved", upcast=True), ref_q)
    assert torch.equal(apply_rotary(k, cos, sin, "interleaved", upcast=True), ref_k)
    if dtype == torch.bfloat16:  # the value matters: rotating in bf16 rounds differently
        assert not torch.equal(apply_rotary(q, cos, sin, "interleaved"), ref_q)


# ------------------------------------------------------------------------------------------------ DeepSeek-V2 ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("yarn", [False, True], ids=["default", "yarn"])
@pytest.mark.bitexact
def test_complex_product_is_deepseek_v2_s_bit_for_bit(dtype: torch.dtype, yarn: bool) -> None:
    """Tables from torch.polar kept in fp32, pairs rotated as fp32 complex products: transformers'
    DeepseekV2 `apply_rotary_emb` exactly, on q and k laid out as its attention slices them (each
    head's rotary part a short run, where the CPU kernel runs scalar and fuses multiply-adds)."""
    B, T, H, N, R, C = 2, 40, 4, 12, 8, 16
    params = ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 1e4}
              if yarn else {"rope_type": "default", "rope_theta": 1e4})
    hf = AutoConfig.for_model("deepseek_v2", hidden_size=64, num_attention_heads=H, qk_nope_head_dim=N,
                              qk_rope_head_dim=R, max_position_embeddings=64, rope_parameters=params)
    rope = RopeConfig(layout="interleaved", complex_product=True,
                      **(dict(scaling="yarn", factor=4.0, original_max_positions=32) if yarn else {}))
    cos, sin = Rotary(rope, R, 64).tables(torch.arange(T), dtype)
    freqs_cis = DeepseekV2RotaryEmbedding(hf)(torch.zeros(1), torch.arange(T)[None])
    assert cos.dtype == sin.dtype == torch.float32
    assert torch.equal(cos[:, ::2], freqs_cis[0].real) and torch.equal(sin[:, ::2], freqs_cis[0].imag)
    q = _random(B, T, H, N + R, dtype=dtype).transpose(1, 2)[..., N:]  # (B, H, T, R), a slice of each head
    k = _random(B, T, C + R, seed=1, dtype=dtype)[..., C:].view(B, 1, T, R)
    ref_q, ref_k = deepseek_v2_apply_rotary(q, k, freqs_cis)
    assert torch.equal(apply_rotary(q, cos, sin, "interleaved", complex_product=True), ref_q)
    assert torch.equal(apply_rotary(k, cos, sin, "interleaved", complex_product=True), ref_k)


def test_complex_product_rotates_interleaved_pairs_only() -> None:
    with pytest.raises(ConfigError, match="complex_product=True: rotates pairs of adjacent dims"):
        RopeConfig(complex_product=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_written_out_layernorm_is_coheres_bit_for_bit(dtype: torch.dtype) -> None:
    ours, theirs = Norm(64, COHERE_NORM), CohereLayerNorm(64, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(_random(64, seed=2))
        theirs.weight.copy_(ours.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = _random(2, 40, 64, seed=3, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        if dtype == torch.float32:  # the value matters: torch's kernel rounds differently
            kernel = Norm(64, NormConfig(kind="layer", eps=1e-5, dtype_order="scale_then_cast")).to(dtype)
            kernel.weight.copy_(ours.weight)
            assert not torch.equal(kernel(x), theirs(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_head_qk_norm_weights_are_coheres(dtype: torch.dtype) -> None:
    """A weight [heads, head_dim], statistics over head_dim only, as CohereLayerNorm((H, D))."""
    ours, theirs = Norm((4, 16), COHERE_NORM), CohereLayerNorm((4, 16), eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(_random(4, 16, seed=4))
        theirs.weight.copy_(ours.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    q = _random(2, 40, 4, 16, seed=5, dtype=dtype)  # (B, T, H, D), as Cohere normalises it
    with torch.no_grad():
        assert torch.equal(ours(q), theirs(q))
        assert not torch.equal(ours(q), Norm(16, COHERE_NORM).to(dtype)(q))  # one weight for all would differ


def test_per_head_qk_norm_tensors_and_refusals() -> None:
    cfg = ArchConfig(vocab_size=32, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=96, qk_norm="head",
                     qk_norm_weight="per_head", norm=COHERE_NORM)
    shapes = parameter_shapes(cfg)
    assert shapes["layers.0.attn.q_norm.weight"] == (4, 16) and shapes["layers.0.attn.k_norm.weight"] == (2, 16)
    with pytest.raises(ConfigError, match="qk_norm_weight='per_head': a weight per head needs qk_norm='head'"):
        ArchConfig(vocab_size=32, d_model=64, n_layers=1, n_heads=4, d_ff=96, qk_norm="projection",
                   qk_norm_weight="per_head")
    with pytest.raises(ConfigError, match="norm.written_out=True"):
        NormConfig(kind="rms", written_out=True)


def test_new_fields_survive_json() -> None:
    cfg = ArchConfig(vocab_size=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, qk_norm="head",
                     qk_norm_weight="per_head", norm=COHERE_NORM, clip_qkv=8.0, norm_placement="parallel_shared",
                     rope=RopeConfig(layout="interleaved", fp32_rotation=True, scaling="longrope", factor=4.0,
                                     original_max_positions=16, short_factor=SHORT * 2, long_factor=LONG * 2))
    back = ArchConfig.from_json(cfg.to_json())
    assert back == cfg and back.rope.short_factor == tuple(SHORT * 2)  # a tuple again, not a JSON list


# ------------------------------------------------------------------------------------------------ OLMo clip_qkv
CLIP = 0.5  # the perturbed projections reach about +-3: the clamp bites


@pytest.fixture(scope="module")
def olmo_clipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_model("olmo", **SPECS["olmo"].kwargs, clip_qkv=CLIP)
    return save_checkpoint(model, tmp_path_factory.mktemp("olmo-clip"))


def test_olmo_clip_qkv_matches_transformers(olmo_clipped: Path) -> None:
    ref = load_reference(olmo_clipped)
    with torch.no_grad():
        expected = ref(IDS).logits
        ours = lmconvert.load(olmo_clipped, attention="eager")(IDS)
        ref.config.clip_qkv = None
        unclipped = ref(IDS).logits
    assert lmconvert.load(olmo_clipped).cfg.clip_qkv == CLIP
    assert float((ours - expected).abs().max()) <= FP32_TOL
    assert float((unclipped - expected).abs().max()) > 0.1  # the clamp bites


def test_olmo_clip_qkv_cached_decoding_and_round_trip(olmo_clipped: Path, tmp_path: Path) -> None:
    check_cached_decoding(olmo_clipped, IDS, 6, "sdpa", "sdpa", FP32_TOL)
    config = check_round_trip(olmo_clipped, tmp_path, "OlmoForCausalLM")
    assert config["clip_qkv"] == CLIP


def test_olmo_clip_qkv_on_the_card_and_refused_by_llama(olmo_clipped: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(olmo_clipped)])
    assert result.exit_code == 0 and "q, k, v clamped to +-0.5" in result.output, result.output
    result = CliRunner().invoke(main, ["convert", str(olmo_clipped), str(tmp_path / "canon")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "canon"), str(tmp_path / "out"), "--to", "hf",
                                       "--family", "llama"])
    assert result.exit_code == 2 and "q/k/v clamping" in result.output, result.output


# ------------------------------------------------------------------------------------------------ bf16 bit-exact
# families whose bf16 logits equal transformers' bf16 logits bit for bit on CPU (eager on both sides)
BIT_EXACT = ["phi3", "cohere", "cohere2"]


@pytest.mark.parametrize("name", BIT_EXACT)
@pytest.mark.bitexact
def test_bf16_logits_are_transformers_bit_for_bit(name: str, tmp_path: Path) -> None:
    spec = SPECS[name]
    src = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path / name, torch.bfloat16)
    with torch.no_grad():
        theirs = load_reference(src, torch.bfloat16)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert torch.equal(ours, theirs)


@pytest.mark.bitexact
def test_olmo_clip_bf16_logits_are_transformers_bit_for_bit(tmp_path: Path) -> None:
    model = build_model("olmo", **SPECS["olmo"].kwargs, clip_qkv=CLIP)
    src = save_checkpoint(model, tmp_path / "bf16", torch.bfloat16)
    with torch.no_grad():
        theirs = load_reference(src, torch.bfloat16)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS)
    assert torch.equal(ours, theirs)


# ------------------------------------------------------------------------------------------------ Beam's temperature
@pytest.fixture(scope="module")
def beam(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(build_model("beam", **SPECS["beam"].kwargs), tmp_path_factory.mktemp("beam-far"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_beam_temperature_far_into_the_sequence_is_transformers(beam: Path, dtype: torch.dtype,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """At position ids 3000 on, the NoPE layers' queries are scaled by exp(0.1 log1p((p + 1) / 2048)) ~ 1.13
    (~1.0007 at the spec's own positions): ours equals transformers there (fp32 within FP32_TOL, bf16 bit for
    bit), and transformers without its scale is far off, so the temperature is what is compared."""
    from transformers.models.beam import modeling_beam

    positions = torch.arange(3000, 3000 + IDS.shape[1]).expand(IDS.shape[0], -1)
    ref = AutoModelForCausalLM.from_pretrained(beam, dtype=dtype, attn_implementation="sdpa")
    ours = lmconvert.load(beam, dtype=dtype)
    with torch.no_grad():
        expected = ref(IDS, position_ids=positions).logits
        got = ours(IDS, positions=positions)
        monkeypatch.setattr(modeling_beam, "compute_attention_scaling", lambda p: torch.ones(()))
        unscaled = ref(IDS, position_ids=positions).logits
    if dtype == torch.float32:
        assert float((got - expected).abs().max()) <= FP32_TOL
    else:
        assert torch.equal(got, expected)
    assert float((unscaled.float() - expected.float()).abs().max()) > 1e-2  # the temperature bites
