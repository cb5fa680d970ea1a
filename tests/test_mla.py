"""Multi-head latent attention (the "latent" kind) and the dense DeepSeek-V3 and V2 families against
transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM: tiny models with every parameter
perturbed, with and without the q LoRA, every RoPE layout (V3's interleaved written de-interleaved,
V3's half, V2's pairs rotated in place), YaRN with `mscale_all_dim`, and biases. fp32 parity (eager and SDPA),
cached decoding over the latent cache, the bit-exact HF -> canonical -> HF round trip, the card's
latent cache size, and the refusal of mixture-of-experts layers transformers cannot build."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from arch_helpers import build, max_diff, tiny, tokens
from click.testing import CliRunner
from family_specs import FAITHFULNESS, FP32_TOL
from hf_models import (
    build_model,
    check_cached_decoding,
    check_parity,
    check_round_trip,
    check_streamed_verify,
    incremental,
    load_reference,
    save_checkpoint,
    token_batch,
)

import lmconvert
from lmconvert.arch import ConfigError
from lmconvert.arch.attention_kinds import LatentSettings
from lmconvert.arch.describe import variants
from lmconvert.arch.latent_attention import absorb
from lmconvert.cli import main
from lmconvert.convert import to_canonical
from lmconvert.mappings import MappingError, family_for
from lmconvert.runtime.streamed import streamed
from lmconvert.verify.agreement import greedy
from lmconvert.verify.run import verify
from lmconvert.verify.trace import point_modules

SEQ = 24
IDS = token_batch(seq=SEQ)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.8,
        "mscale_all_dim": 0.7, "rope_theta": 1e4}
# every MLA size distinct, so a swapped split or reshape cannot line up by accident
BASE = dict(num_key_value_heads=4, first_k_dense_replace=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
            qk_rope_head_dim=8, v_head_dim=10, attention_bias=True, rope_interleave=True)
V2 = {key: value for key, value in BASE.items() if key != "rope_interleave"}  # V2 always rotates pairs in place
VARIANTS: dict[str, tuple[str, dict]] = {
    "q_lora_interleaved": ("deepseek_v3", BASE),
    "plain_q": ("deepseek_v3", dict(BASE, q_lora_rank=None)),
    "half_layout": ("deepseek_v3", dict(BASE, rope_interleave=False, attention_bias=False,
                                        rms_norm_eps=1e-2)),  # the MLA norms keep 1e-6
    "yarn_mscale": ("deepseek_v3", dict(BASE, rope_parameters=YARN)),
    "v2": ("deepseek_v2", dict(V2, mlp_bias=True)),
    "v2_plain_q_yarn": ("deepseek_v2", dict(V2, q_lora_rank=None, rope_parameters=YARN)),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple[str, torch.dtype], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> Path:
        if (name, dtype) not in made:
            directory = tmp_path_factory.mktemp(f"{name}-{str(dtype).removeprefix('torch.')}")
            model_type, kwargs = VARIANTS[name]
            made[name, dtype] = save_checkpoint(build_model(model_type, **kwargs), directory, dtype)
        return made[name, dtype]

    return get


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# ----------------------------------------------------------------------------- parity with transformers
@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_fp32_parity(name: str, attention: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    check_parity(checkpoint(name), IDS, tmp_path, attention, FP32_TOL)


def test_mscale_bites(checkpoint: Callable[..., Path]) -> None:
    """Under YaRN with mscale_all_dim the score scale is transformers' own, and not the plain one."""
    src = checkpoint("yarn_mscale")
    ours = lmconvert.load(src).layers[0].attn.scale
    assert ours == load_reference(src).model.layers[0].self_attn.scaling
    assert abs(ours - (12 + 8) ** -0.5) > 1e-2


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["q_lora_interleaved", "half_layout", "v2"])
def test_cached_decoding_equals_full_forward(name: str, attention: str, checkpoint: Callable[..., Path]) -> None:
    """Prefill 5 tokens, then decode one at a time over the latent cache: equal to transformers'
    cached decoding, and (in float64, where rounding cannot hide a wrong position) to our full forward."""
    src = checkpoint(name)
    check_cached_decoding(src, IDS, 5, attention, tol=FP32_TOL)


def test_the_cache_holds_the_latent_not_keys_and_values(checkpoint: Callable[..., Path]) -> None:
    model = lmconvert.load(checkpoint("q_lora_interleaved"))
    cache = model.new_cache()
    with torch.no_grad():
        model(IDS[:, :7], cache=cache)
    assert tuple(cache.keys[1].shape) == (2, 1, 7, 16)  # c_kv after its norm: (B, 1, S, kv_lora_rank)
    assert tuple(cache.values[1].shape) == (2, 1, 7, 8)  # k_rot: (B, 1, S, qk_rope_head_dim)
    assert model.cfg.kv_cache_bytes_per_token(2) == 2 * (16 + 8) * 2


# ----------------------------------------------------------------------------- conversion
@pytest.mark.parametrize("name", ["q_lora_interleaved", "plain_q", "yarn_mscale", "v2", "v2_plain_q_yarn"])
def test_round_trip_is_bit_exact(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    src = checkpoint(name, torch.bfloat16)
    check_round_trip(src, tmp_path, json.loads((src / "config.json").read_text())["architectures"][0])
    with torch.no_grad():
        assert torch.equal(load_reference(tmp_path / "back")(IDS).logits, load_reference(src)(IDS).logits)


def test_inspect_shows_the_latent_cache(checkpoint: Callable[..., Path]) -> None:
    result = CliRunner().invoke(main, ["inspect", str(checkpoint("q_lora_interleaved"))])
    assert result.exit_code == 0, result.output
    for phrase in ("family            deepseek_v3", "attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16",
                   "q/k 12 + rotary 8, v 10", "biases: q_a, kv_a, o", "RoPE interleaved",
                   # c_kv 16 + k_rot 8 against MHA's 4 heads x (20 + 10)
                   "latent KV cache: 24 entries per token and layer (c_kv 16 + k_rot 8); MHA with these heads: 120; "
                   "20.0% of it",
                   "KV cache          192 bytes per token (float32)"):  # 2 layers x 24 entries x 4 bytes
        assert phrase in result.output, (phrase, result.output)


def test_v2_card_says_its_rotation(checkpoint: Callable[..., Path]) -> None:
    result = CliRunner().invoke(main, ["inspect", str(checkpoint("v2"))])
    assert result.exit_code == 0, result.output
    for phrase in ("family            deepseek_v2", "MLA RoPE: rotary dims in pairs, rotated in place",
                   "biases: mlp", "biases: q_a, kv_a, o"):
        assert phrase in result.output, (phrase, result.output)


def test_v2_and_v3_do_not_convert_into_each_other_silently(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    """The same sizes, but V2 rotates pairs in place and V3 de-interleaves them: refused both ways."""
    for name, target in (("v2", "deepseek_v3"), ("q_lora_interleaved", "deepseek_v2")):
        to_canonical(checkpoint(name), tmp_path / name)
        result = CliRunner().invoke(main, ["convert", str(tmp_path / name), str(tmp_path / f"{name}-out"),
                                           "--to", "hf", "--family", target])
        assert result.exit_code == 2, result.output
        assert "deinterleave" in result.output, result.output


def test_inspect_of_a_deepseek_v3_shaped_config() -> None:
    """DeepSeek-V3's own sizes: 512 + 64 cached entries against 128 heads x (192 + 128)."""
    cfg = family_for("deepseek_v3").arch_config({"model_type": "deepseek_v3", "first_k_dense_replace": 61})
    line = next(v for v in variants(cfg) if v.startswith("latent KV cache"))
    assert line == ("latent KV cache: 576 entries per token and layer (c_kv 512 + k_rot 64); "
                    "MHA with these heads: 40960; 1.4% of it")
    assert cfg.kv_cache_bytes_per_token(2) == 61 * 576 * 2


@pytest.mark.parametrize(("model_type", "stated", "needle"), [
    ("deepseek_v3", {"first_k_dense_replace": None}, "first_k_dense_replace=null"),
    ("deepseek_v3", {"first_k_dense_replace": 1, "n_group": None},
     "n_group=null, but first_k_dense_replace=1 makes layers 1 mixture-of-experts layers"),
    ("deepseek_v3", {"first_k_dense_replace": 0, "num_experts_per_tok": None},
     "num_experts_per_tok=null, but first_k_dense_replace=0 makes layers 0-1 mixture-of-experts layers"),
    ("deepseek_v2", {}, "num_experts_per_tok=null, but first_k_dense_replace=0 makes layers 0-1"),  # V2's defaults
    ("deepseek_v2", {"num_experts_per_tok": 2, "topk_method": "group_limited_greedy"}, "n_group=null"),
    ("deepseek_v2", {"num_experts_per_tok": 2, "mlp_bias": True}, "mlp_bias=true with mixture-of-experts layers"),
])
def test_moe_layers_transformers_cannot_build_are_refused_naming_them(model_type: str, stated: dict,
                                                                      needle: str) -> None:
    """MoE layers themselves are read (tests/test_moe.py); what transformers' config class lets
    through but its model cannot build, or what the decoder cannot hold, is refused in one line."""
    config = {"model_type": model_type, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "n_routed_experts": 8, "moe_intermediate_size": 8, **stated}
    with pytest.raises(MappingError) as caught:
        family_for(model_type).arch_config(config)
    message = str(caught.value)
    assert message.startswith("config.json: ") and needle in message and "\n" not in message, message


# ----------------------------------------------------------------------------- the kind on its own
LATENT = dict(attention="latent", head_dim=8,
              attention_settings=dict(kv_lora_rank=16, qk_nope_head_dim=12, v_head_dim=10, q_lora_rank=24))


def test_latent_decoder_decodes_from_its_cache() -> None:
    model = build(tiny(**LATENT))
    ids = tokens()
    cache = model.new_cache()
    with torch.no_grad():
        stepped = torch.cat([model(ids[:, :3], cache=cache)] + [model(ids[:, i:i + 1], cache=cache)
                                                                 for i in range(3, ids.shape[1])], 1)
        assert max_diff(stepped, model(ids)) < 1e-5


def test_settings_round_trip_through_json() -> None:
    cfg = tiny(**LATENT)
    assert cfg.attention_settings == LatentSettings(16, 12, 10, 24)
    assert type(cfg).from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(("overrides", "needle"), [
    (dict(n_kv_heads=2), "n_kv_heads=2: latent attention has n_kv_heads = n_heads"),
    (dict(qk_norm="head"), "qk_norm='head'"),
    (dict(q_bias=True), "q_bias=True: latent attention's biases are attention_settings.bias"),
    (dict(attn_softcap=5.0), "attn_softcap=5.0"),
    (dict(layer_positions=("rope", "none")), "latent attention uses RoPE on every layer"),
    (dict(attention_settings=dict(kv_lora_rank=0)), "attention_settings.kv_lora_rank=0"),
    (dict(attention_settings=dict(q_lora_rank=True)), "attention_settings.q_lora_rank=True"),
    (dict(attention_settings=dict(norm_eps=0)), "attention_settings.norm_eps=0"),
    (dict(rope=dict(layout="interleaved", complex_product=True)),
     "rope.complex_product=True: a complex product rotates the pairs in place"),
    # Ling 3's per-head gate is the one latent attention takes
    (dict(attn_output_gate="projection"), "attn_output_gate='projection': gates the standard attention's output "
                                          "(latent attention's with 'projection_head' only)"),
])
def test_what_latent_attention_cannot_compute_is_refused(overrides: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        tiny(**{**LATENT, **overrides})
    assert needle in str(caught.value)


def test_the_mla_norms_take_their_own_eps(checkpoint: Callable[..., Path]) -> None:
    """rms_norm_eps is the block norms' only: the MLA norms keep 1e-6, as transformers' do (the
    half_layout parity above runs with rms_norm_eps=1e-2, where the difference shows)."""
    src = checkpoint("half_layout")
    cfg = lmconvert.load(src).cfg
    assert cfg.norm.eps == 1e-2 and cfg.attention_settings.norm_eps == 1e-6
    assert load_reference(src).model.layers[0].self_attn.kv_a_layernorm.variance_epsilon == 1e-6


def test_export_to_a_family_without_latent_attention_is_refused(checkpoint: Callable[..., Path],
                                                                tmp_path: Path) -> None:
    to_canonical(checkpoint("plain_q"), tmp_path / "canon")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "canon"), str(out), "--to", "hf", "--family", "llama"])
    assert result.exit_code == 2, result.output
    assert "this attention kind, these attention settings (deepseek_v3)" in result.output, result.output
    assert "export to the source family instead" in result.output and not out.exists()


# ----------------------------------------------------------------------------- verify's MLA points
@pytest.mark.parametrize("name", ["q_lora_interleaved", "plain_q", "v2"])
def test_verify_compares_every_mla_point(name: str, checkpoint: Callable[..., Path]) -> None:
    """attn.q (or q_a, q_a_norm, q_b), kv_a, kv_a_norm and kv_b are declared on both sides and
    compared; V3 agrees exactly at each, V2 (its complex rotation) within verify's tolerance."""
    src = checkpoint(name)
    report = verify(src, seq_len=20, generate=6)
    cfg = lmconvert.load(src).cfg
    expected = set(point_modules(cfg)) | {"embed", "final_norm"} | {f"layers.{i}" for i in range(cfg.n_layers)}
    assert {p.name for p in report.points} == expected
    mla = {"attn.kv_a", "attn.kv_a_norm", "attn.kv_b"} | ({"attn.q"} if name == "plain_q" else
                                                          {"attn.q_a", "attn.q_a_norm", "attn.q_b"})
    assert {p.name.split(".", 2)[2] for p in report.points if p.name.startswith("layers.0.attn.")} == mla | {"attn.o"}
    assert report.passed, report.table()
    if name != "v2":
        assert all(p.max_abs == 0.0 for p in report.points)
    assert report.generation is not None and report.generation.first_difference is None


# ----------------------------------------------------------------------------- absorbed decoding
@pytest.mark.parametrize("name", ["q_lora_interleaved", "half_layout", "v2"])
def test_absorbed_decoding_equals_expanded(name: str, checkpoint: Callable[..., Path]) -> None:
    """Attending in latent space (kv_b folded into the query and the output) gives the expanded
    path's logits, fp32 <= 1e-5, over a prefill and 32 cached decoding steps, and in a full forward."""
    ids = token_batch(seq=40, seed=3)
    expanded = lmconvert.load(checkpoint(name), attention="eager")
    absorbed = absorb(lmconvert.load(checkpoint(name), attention="eager"))
    assert all(block.attn.absorbed for block in absorbed.layers)
    with torch.no_grad():
        steps = {}
        for label, model in (("expanded", expanded), ("absorbed", absorbed)):
            cache = model.new_cache()
            steps[label] = incremental(lambda chunk, m=model, c=cache: m(chunk, cache=c), ids, 8)  # 32 decoded
            assert tuple(cache.keys[0].shape) == (2, 1, 40, 16)  # the same latent cache
        assert max_abs(steps["absorbed"], steps["expanded"]) <= FP32_TOL
        assert max_abs(absorbed(ids), expanded(ids)) <= FP32_TOL
        assert max_abs(absorb(absorbed, False)(ids), expanded(ids)) == 0.0  # switched back: the expanded path


@pytest.mark.parametrize("name", ["q_lora_interleaved", "half_layout", "yarn_mscale", "v2"])
def test_bf16_faithfulness(name: str, checkpoint: Callable[..., Path]) -> None:
    """In bf16, our logits stray from the exact (fp32 over the same bf16 weights) ones no more than
    transformers' own bf16 logits do, give or take the tolerance every family gets."""
    src = checkpoint(name, torch.bfloat16)
    with torch.no_grad():
        exact = load_reference(src, torch.float32)(IDS).logits.float()
        reference_error = float((load_reference(src, torch.bfloat16)(IDS).logits.float() - exact).abs().mean())
        ours_error = float((lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS).float() - exact)
                           .abs().mean())
    assert reference_error > 0
    assert ours_error <= FAITHFULNESS * reference_error, (ours_error, reference_error)


@pytest.mark.parametrize("name", ["v2", "v2_plain_q_yarn"])
@pytest.mark.bitexact
def test_v2_bf16_is_transformers_bit_for_bit(name: str, checkpoint: Callable[..., Path]) -> None:
    """V2's RoPE as transformers computes it (`rope.complex_product`: torch.polar tables in fp32, complex
    products): our eager bf16 logits are its eager bf16 logits exactly (CPU)."""
    src = checkpoint(name, torch.bfloat16)
    with torch.no_grad():
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS)
        theirs = load_reference(src, torch.bfloat16)(IDS).logits
    assert torch.equal(ours, theirs), max_abs(ours, theirs)


# ----------------------------------------------------------------------------- streamed
@pytest.mark.bitexact
def test_streamed_forward_is_bit_identical(checkpoint: Callable[..., Path]) -> None:
    """One block at a time from the files, latent cache included in greedy decoding."""
    src = checkpoint("q_lora_interleaved")
    model = lmconvert.load(src, attention="eager")
    with streamed(src, torch.float32) as stream, torch.no_grad():
        assert torch.equal(stream(IDS), model(IDS))
        assert torch.equal(greedy(stream, IDS[:1, :6], 8)[0], model.generate(IDS[:1, :6], 8))


def test_verify_with_max_memory_streams_both_sides(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    to_canonical(checkpoint("q_lora_interleaved"), tmp_path / "canon")
    # embed, final norm; per layer 12 modules and the output
    assert check_streamed_verify(tmp_path / "canon", tmp_path) == 2 + 2 * 13
