"""The families against transformers: llama, mistral, gemma, gemma2, gemma3, olmo2, qwen2, qwen3,
smollm3, starcoder2, nemotron, stablelm, granite, olmo, phi3, cohere, cohere2, gpt2, gpt_neo, opt, xglm,
gptj, phi, gpt_neox, bloom, mpt, falcon, the mixtures of experts, minicpm3.

Every family is a tiny transformers model with every parameter perturbed, run on sequences several
times longer than its sliding window, with soft-caps small enough to bite. For each family:
fp32 parity (straight from the HF directory and through a canonical one), bf16 and fp16 faithfulness,
bf16 bit-exactness, a bit-exact HF -> canonical -> HF round trip, cached decoding, both config.json
styles, honoured `layer_types`, and the architecture card. Then the cross-family export matrix and the
Gemma3ForConditionalGeneration text path.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from family_specs import (
    ATTN_CAP,
    FAITHFULNESS,
    FINAL_CAP,
    FP32_TOL,
    IDS,
    NAMES,
    SPECS,
    TEXT,
    VISION,
    WINDOW,
    F,
    S,
    Spec,
    family_of,
)
from hf_models import (
    build_model,
    check_cached_decoding,
    check_round_trip,
    load_reference,
    perturb,
    save_checkpoint,
    tensors_of,
)
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

import lmconvert
from lmconvert.cli import main
from lmconvert.convert import to_canonical, to_hf
from lmconvert.formats.canonical import read_meta
from lmconvert.mappings import BY_MODEL_TYPE, FAMILIES, MappingError, family_for

# extra export sources: the variants that make cross-family export possible
SOURCES: dict[str, Spec] = {
    **SPECS,
    "llama-plain": Spec("llama", {}, {}, ()),
    "mistral-nowindow": Spec("mistral", dict(sliding_window=None), {}, ()),
    "stablelm-sequential": Spec("stablelm", dict(eos_token_id=1, partial_rotary_factor=0.5), {}, ()),
}


# transformers runs these eagerly only: it refuses SDPA for Gemma 2 (soft-caps), BLOOM and MPT
EAGER_ONLY = ("gemma2", "bloom", "mpt")


# ------------------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A saved transformers checkpoint of one source, built once per (source, dtype)."""
    made: dict[tuple[str, torch.dtype], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> Path:
        if (name, dtype) not in made:
            spec = SOURCES[name]
            directory = tmp_path_factory.mktemp(f"{name}-{str(dtype).removeprefix('torch.')}")
            made[name, dtype] = save_checkpoint(build_model(spec.model_type, **spec.kwargs), directory, dtype)
        return made[name, dtype]

    return get


@pytest.fixture(scope="module")
def canonical(checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(f"{name}-canon") / "canon"
            to_canonical(checkpoint(name), made[name])
        return made[name]

    return get


@torch.no_grad()
def hf_logits(directory: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return load_reference(directory, dtype)(IDS).logits.float()


@torch.no_grad()
def our_logits(path: Path, dtype: torch.dtype | None = None, attention: str = "eager") -> torch.Tensor:
    """Eager by default, to compare with transformers' eager reference op for op."""
    return lmconvert.load(path, dtype=dtype, attention=attention)(IDS).float()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def edited_copy(src: Path, dst: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> Path:
    """A copy of a checkpoint directory whose config.json went through `edit`."""
    dst.mkdir()
    for item in src.iterdir():
        if item.name != "config.json":
            shutil.copy2(item, dst / item.name)
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit(config), indent=2))
    return dst


# ------------------------------------------------------------------------------------------------ per family
@pytest.mark.parametrize("name", NAMES)
def test_fp32_parity(name: str, checkpoint: Callable[..., Path], canonical: Callable[[str], Path]) -> None:
    src = checkpoint(name)
    ref = hf_logits(src)
    assert max_abs(our_logits(src), ref) <= FP32_TOL
    assert max_abs(our_logits(canonical(name)), ref) <= FP32_TOL
    assert read_meta(canonical(name)).family == family_of(name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_faithfulness(name: str, dtype: torch.dtype, checkpoint: Callable[..., Path]) -> None:
    """In each half type, our error against the same half weights run in fp32 is at most
    FAITHFULNESS x transformers' own error in that type."""
    src = checkpoint(name, dtype)
    exact = hf_logits(src, torch.float32)  # the same half weights, upcast
    reference_error = float((hf_logits(src, dtype) - exact).abs().mean())
    ours_error = float((our_logits(src, dtype) - exact).abs().mean())
    assert reference_error > 0
    assert ours_error <= FAITHFULNESS * reference_error, (ours_error, reference_error)


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].bf16_exact])
def test_bf16_logits_are_transformers_bit_for_bit(name: str, checkpoint: Callable[..., Path]) -> None:
    """Where every operation follows the reference's order and dtype, bf16 rounds the same way:
    our eager bf16 logits equal transformers' eager bf16 logits exactly (CPU)."""
    src = checkpoint(name, torch.bfloat16)
    ours, ref = our_logits(src, torch.bfloat16), hf_logits(src, torch.bfloat16)
    assert torch.equal(ours, ref), max_abs(ours, ref)


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_bit_exact(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    src = checkpoint(name, torch.bfloat16)
    config = check_round_trip(src, tmp_path, FAMILIES[family_of(name)].architecture)
    assert config["dtype"] == "bfloat16"
    assert torch.equal(hf_logits(tmp_path / "back"), hf_logits(src))


@pytest.mark.parametrize("name", NAMES)
def test_sdpa_matches_transformers_sdpa(name: str, checkpoint: Callable[..., Path]) -> None:
    """Our default backend against transformers' default one (soft-capped layers run eager on
    both sides: transformers refuses SDPA for Gemma 2), and eager where transformers has no SDPA (EAGER_ONLY)."""
    src = checkpoint(name)
    implementation = "eager" if name in EAGER_ONLY or not SPECS[name].sdpa else "sdpa"
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(src, attn_implementation=implementation)(IDS).logits
    assert max_abs(our_logits(src, attention="sdpa"), ref) <= FP32_TOL


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_cached_decoding_equals_full_forward(name: str, attention: str, checkpoint: Callable[..., Path]) -> None:
    """Prefill 6 tokens, then decode the other 22 one at a time. Our cached logits match
    transformers' cached logits element by element. Against the full forward, fp32 rounding moves
    cached decoding by ~1e-5 on both sides (transformers' own too), so that equality is checked in
    float64, where rounding cannot hide a wrong position or mask."""
    src = checkpoint(name)
    implementation = "eager" if name in EAGER_ONLY or not SPECS[name].sdpa else attention
    check_cached_decoding(src, IDS, 6, attention, implementation, FP32_TOL)


def transformers4_style(spec: Spec) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """config.json the way older Hub files look: rope_theta / rope_scaling, torch_dtype, and none
    of the keys transformers 5 derives (layer_types...)."""

    def edit(config: dict[str, Any]) -> dict[str, Any]:
        drop = ("rope_parameters", "dtype", *spec.old_drop)
        old = {k: v for k, v in config.items() if k not in drop}
        return {**old, **json.loads(json.dumps(spec.old_style)), "torch_dtype": "float32",
                "transformers_version": "4.46.0"}

    return edit


@pytest.mark.parametrize("name", NAMES)
def test_both_config_styles(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    spec = SPECS[name]
    new = checkpoint(name)
    old = edited_copy(new, tmp_path / "old", transformers4_style(spec))
    new_config, old_config = (json.loads((d / "config.json").read_text()) for d in (new, old))
    assert ("rope_parameters" in new_config) == spec.rope and "rope_parameters" not in old_config
    family = family_for(new_config["model_type"])
    assert family.arch_config(old_config) == family.arch_config(new_config)
    ref = hf_logits(old)
    assert torch.equal(ref, hf_logits(new))  # transformers reads both the same way too
    assert max_abs(our_logits(old), ref) <= FP32_TOL


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].layer_types])
def test_layer_types_key_is_honoured(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    layer_types, kinds = SPECS[name].layer_types
    src = checkpoint(name)
    edited = edited_copy(src, tmp_path / "edited", lambda config: {**config, "layer_types": layer_types})
    assert lmconvert.load(edited).cfg.layer_kinds == kinds
    ref = hf_logits(edited)
    assert max_abs(our_logits(edited), ref) <= FP32_TOL
    assert max_abs(ref, hf_logits(src)) > 1e-3  # the edit matters
    to_canonical(edited, tmp_path / "canon")
    to_hf(tmp_path / "canon", tmp_path / "back")  # export writes the pattern back
    assert torch.equal(hf_logits(tmp_path / "back"), ref)


@pytest.mark.parametrize("name", NAMES)
def test_inspect_names_the_variants(name: str, checkpoint: Callable[..., Path]) -> None:
    result = CliRunner().invoke(main, ["inspect", str(checkpoint(name))])
    assert result.exit_code == 0, result.output
    assert f"family            {family_of(name)}" in result.output
    for phrase in SPECS[name].card:
        assert phrase in result.output, (phrase, result.output)
    for phrase in SPECS[name].not_on_card:
        assert phrase not in result.output


def test_rope_keys_a_type_does_not_read_change_nothing() -> None:
    """Gemma3TextConfig pre-sets rope_type "default" before merging rope_scaling, so a legacy
    {"type": "linear"} there is ignored by transformers (warning about 'factor'); so here too."""
    family = family_for("gemma3_text")
    legacy = {"model_type": "gemma3_text", "rope_scaling": {"type": "linear", "factor": 8.0}}
    assert AutoConfig.for_model("gemma3_text", rope_scaling=legacy["rope_scaling"]).rope_parameters[F]["rope_type"] \
        == "default"
    assert family.arch_config(legacy) == family.arch_config({"model_type": "gemma3_text"})
    stray = {"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}}
    assert family_for("llama").arch_config(stray) == family_for("llama").arch_config({"model_type": "llama"})


# the keys that make transformers' default config one lmconvert converts (DeepSeek's defaults have MoE layers)
CONVERTIBLE = {"deepseek_v2": {"first_k_dense_replace": 32}, "deepseek_v3": {"first_k_dense_replace": 61},
               "deepseek_v32": {"first_k_dense_replace": 61}}


@pytest.mark.parametrize("model_type", sorted(BY_MODEL_TYPE))
def test_missing_keys_take_transformers_defaults(model_type: str) -> None:
    """An almost empty config.json means what transformers' config class defaults mean."""
    family = family_for(model_type)
    stated = CONVERTIBLE.get(model_type, {})
    full = AutoConfig.for_model(model_type, **stated).to_dict()
    assert family.arch_config({"model_type": model_type, **stated}) == family.arch_config(full)


# ------------------------------------------------------------------------------------------------ soft-caps
def test_gemma2_soft_caps_bite(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    src = checkpoint("gemma2")
    capped = hf_logits(src)
    assert capped.abs().max() > 0.9 * FINAL_CAP
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        uncapped = edited_copy(src, tmp_path / key, lambda config, key=key: {**config, key: None})
        ref = hf_logits(uncapped)
        assert max_abs(ref, capped) > 0.1, key
        assert max_abs(our_logits(uncapped), ref) <= FP32_TOL


def test_gemma3_ignores_attention_soft_cap_but_not_the_final_one(checkpoint: Callable[..., Path],
                                                                 tmp_path: Path) -> None:
    src = checkpoint("gemma3")
    capped = hf_logits(src)
    assert json.loads((src / "config.json").read_text())["attn_logit_softcapping"] == ATTN_CAP
    assert lmconvert.load(src).cfg.attn_softcap is None
    no_attn_cap = edited_copy(src, tmp_path / "attn", lambda config: {**config, "attn_logit_softcapping": None})
    assert torch.equal(hf_logits(no_attn_cap), capped)
    assert capped.abs().max() > 0.9 * FINAL_CAP
    no_final_cap = edited_copy(src, tmp_path / "final", lambda config: {**config, "final_logit_softcapping": None})
    ref = hf_logits(no_final_cap)
    assert max_abs(ref, capped) > 0.1
    assert max_abs(our_logits(no_final_cap), ref) <= FP32_TOL


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_window_needs_use_sliding_window(model_type: str) -> None:
    """`sliding_window` alone does nothing; with `use_sliding_window` it covers layers i >=
    max_window_layers; `layer_types` naming sliding layers without a window is refused."""
    family = family_for(model_type)
    base = {"model_type": model_type, "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16, "sliding_window": WINDOW, "max_window_layers": 1}
    off = family.arch_config({**base, "use_sliding_window": False})
    assert off.layer_kinds == ("global",) * 3 and off.sliding_window is None
    on = family.arch_config({**base, "use_sliding_window": True})
    assert on.layer_kinds == ("global", "local", "local") and on.sliding_window == WINDOW
    with pytest.raises(MappingError, match="no sliding window"):
        family.arch_config({**base, "use_sliding_window": False, "layer_types": [S, F, F]})


# ------------------------------------------------------------------------------------------------ export matrix
OK = None
LATENT_ONLY = "deepseek_v3 always has latent attention (MLA), which this model lacks (attention='standard')"
# source -> target family -> None when the export is exact, else a phrase the refusal must contain
MATRIX: dict[str, dict[str, str | None]] = {
    "llama": {  # with q/k/v/o and MLP biases
        "olmo": "olmo cannot express this norm's kind and eps and weight, MLP biases",
        "granite": OK,
        "stablelm": "stablelm cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "nemotron": "nemotron cannot express this norm's kind and bias and weight_offset and dtype_order, this FFN "
                    "gating (llama)",
        "starcoder2": "starcoder2 cannot express this norm's kind and bias and dtype_order, this FFN gating (llama)",
        "smollm3": OK,
        "gemma": "gemma cannot express this norm's weight_offset and dtype_order, MLP biases (llama); gemma always "
                 "has embedding scaling",
        "llama": OK,
        "mistral": "mistral cannot express a q bias, a k bias, a v bias, an output-projection bias, MLP biases (llama)",
        "gemma2": "gemma2 cannot express this norm's weight_offset and dtype_order, this norm placement",
        "gemma3": "gemma3 always has QK norm, embedding scaling, which this model (llama) lacks",
        "olmo2": "olmo2 cannot express this norm's dtype_order, this norm placement, MLP biases",
        "qwen2": "qwen2 cannot express an output-projection bias, MLP biases (llama)",
        "qwen3": "qwen3 cannot express MLP biases (llama); qwen3 always has QK norm",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "llama-plain": {
        "olmo": "olmo cannot express this norm's kind and eps and weight, this RoPE configuration's fp32_tables "
                "(llama)",
        "granite": OK,
        "stablelm": "stablelm cannot express this norm's kind and bias and dtype_order (llama)",
        "nemotron": "this FFN gating",
        "starcoder2": "this FFN gating",
        "smollm3": OK,
        "gemma": "gemma always has embedding scaling",
        "llama": OK, "mistral": OK,
        "gemma2": "gemma2 always has embedding scaling", "gemma3": "gemma3 always has QK norm",
        "olmo2": "olmo2 always has QK norm",
        "qwen2": "qwen2 always has a q bias, a k bias, a v bias, which this model (llama) lacks",
        "qwen3": "qwen3 always has QK norm, which this model (llama) lacks",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "mistral": {  # window on every layer
        "olmo": "a sliding window (mistral)",
        "granite": "granite cannot express this local/global layer pattern, a sliding window (mistral)",
        "stablelm": "stablelm cannot express this head_dim",
        "nemotron": "a sliding window (mistral)",
        "starcoder2": "starcoder2 cannot express this norm's kind and bias and dtype_order, this FFN gating (mistral)",
        "smollm3": OK,
        "gemma": "a sliding window",
        "llama": "llama cannot express this local/global layer pattern, a sliding window (mistral)",
        "mistral": OK, "gemma2": "this norm placement", "gemma3": "QK norm", "olmo2": "a sliding window",
        "qwen2": "qwen2 always has a q bias", "qwen3": "qwen3 always has QK norm",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "mistral-nowindow": {
        "olmo": "this norm's kind and eps and weight",
        "granite": OK,
        "stablelm": "this norm's kind and bias and dtype_order (mistral)",
        "nemotron": "nemotron cannot express this norm's kind and bias and weight_offset and dtype_order, this FFN "
                    "gating (mistral)",
        "starcoder2": "this norm's kind and bias",
        "smollm3": OK,
        "gemma": "gemma always has embedding scaling",
        "llama": OK, "mistral": OK, "gemma2": "embedding scaling", "gemma3": "embedding scaling",
        "olmo2": "QK norm", "qwen2": "qwen2 always has a q bias", "qwen3": "qwen3 always has QK norm",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "gemma": {
        "olmo": "embedding scaling",
        "granite": "granite cannot express this norm's weight_offset and dtype_order (gemma)",
        "stablelm": "embedding scaling (gemma)",
        "nemotron": "nemotron cannot express this norm's kind and bias, this FFN gating, embedding scaling (gemma)",
        "starcoder2": "this norm's kind and bias and weight_offset",
        "smollm3": "smollm3 cannot express this norm's weight_offset and dtype_order, embedding scaling (gemma)",
        "llama": "llama cannot express this norm's weight_offset and dtype_order, embedding scaling (gemma)",
        "mistral": "a q bias, a k bias, a v bias, an output-projection bias", "gemma": OK,
        "gemma2": "gemma2 cannot express this norm placement (gemma)", "gemma3": "this norm placement",
        "olmo2": "olmo2 always has QK norm", "qwen2": "an output-projection bias",
        "qwen3": "qwen3 always has QK norm",
    },
    "gemma2": {
        "olmo": "this norm placement",
        "granite": "attention soft-capping, final-logit soft-capping",
        "stablelm": "this norm placement",
        "nemotron": "this norm placement",
        "starcoder2": "this norm placement",
        "smollm3": "a custom attention score scale, attention soft-capping, embedding scaling",
        "gemma": "gemma cannot express this norm placement, this local/global layer pattern",
        "llama": "llama cannot express this norm's weight_offset and dtype_order, this norm placement, this "
                 "local/global layer pattern, a sliding window, a custom attention score scale, attention "
                 "soft-capping, embedding scaling, final-logit soft-capping (gemma2)",
        "mistral": "attention soft-capping", "gemma2": OK,
        "gemma3": "gemma3 cannot express attention soft-capping (gemma2); gemma3 always has QK norm",
        "olmo2": "attention soft-capping", "qwen2": "attention soft-capping", "qwen3": "attention soft-capping",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "gemma3": {
        "olmo": "QK norm",
        "granite": "QK norm",
        "stablelm": "QK norm",
        "nemotron": "QK norm",
        "starcoder2": "QK norm, this FFN gating",
        "smollm3": "QK norm, a separate RoPE for local layers",
        "gemma": "gemma cannot express this norm placement, QK norm",
        "llama": "QK norm, a separate RoPE for local layers", "mistral": "a separate RoPE for local layers",
        "gemma2": "gemma2 cannot express QK norm, a separate RoPE for local layers (gemma3)", "gemma3": OK,
        "olmo2": "embedding scaling", "qwen2": "a separate RoPE for local layers",
        "qwen3": "qwen3 cannot express this norm's weight_offset and dtype_order",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "olmo2": {
        "olmo": "olmo cannot express this norm's kind and weight and dtype_order, this norm placement, QK norm",
        "granite": "QK norm",
        "stablelm": "QK norm, an output-projection bias",
        "nemotron": "this RoPE configuration's fp32_tables (olmo2)",
        "starcoder2": "this norm's kind and bias, this norm placement, QK norm",
        "smollm3": "smollm3 cannot express this norm's dtype_order, this norm placement, QK norm",
        "gemma": "this RoPE configuration's fp32_tables",
        "llama": "llama cannot express this norm's dtype_order, this norm placement, QK norm, this RoPE "
                 "configuration's fp32_tables (olmo2)",
        "mistral": "a q bias", "gemma2": "QK norm", "gemma3": "this norm's weight_offset", "olmo2": OK,
        "qwen2": "this norm placement", "qwen3": "this norm placement",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "qwen2": {
        "olmo": "a q bias, a k bias, a v bias",
        "granite": "granite cannot express a q bias, a k bias, a v bias",
        "stablelm": "stablelm cannot express this norm's kind and bias and dtype_order, this local/global layer "
                    "pattern",
        "nemotron": "a q bias, a k bias, a v bias",
        "starcoder2": "this local/global layer pattern (qwen2)",
        "smollm3": "smollm3 cannot express a q bias, a k bias, a v bias (qwen2)",
        "gemma": "a q bias, a k bias, a v bias",
        "llama": "llama cannot express a q bias, a k bias, a v bias, this local/global layer pattern, a sliding "
                 "window (qwen2)",
        "mistral": "mistral cannot express a q bias, a k bias, a v bias", "gemma2": "a q bias",
        "gemma3": "a q bias", "olmo2": "a q bias", "qwen2": OK, "qwen3": "qwen3 always has QK norm",
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "qwen3": {
        "olmo": "QK norm",
        "granite": "QK norm",
        "stablelm": "QK norm",
        "nemotron": "QK norm",
        "starcoder2": "QK norm",
        "smollm3": "smollm3 cannot express QK norm (qwen3)",
        "gemma": "QK norm",
        "llama": "llama cannot express QK norm", "mistral": "QK norm", "gemma2": "QK norm",
        "gemma3": "gemma3 cannot express this norm's weight_offset and dtype_order", "olmo2": "QK norm",
        "qwen2": "qwen2 cannot express QK norm, an output-projection bias (qwen3)", "qwen3": OK,
        "deepseek_v2": LATENT_ONLY.replace("v3", "v2"), "deepseek_v3": LATENT_ONLY,
    },
    "smollm3": {  # NoPE on layers 1 and 3, which are sliding
        "olmo": "this per-layer position pattern",
        "granite": "this per-layer position pattern",
        "stablelm": "this per-layer position pattern",
        "nemotron": "this per-layer position pattern",
        "starcoder2": "this per-layer position pattern, this local/global layer pattern (smollm3)",
        "llama": "llama cannot express this per-layer position pattern, this local/global layer pattern",
        "mistral": "MLP biases, this per-layer position pattern", "gemma": "this per-layer position pattern",
        "gemma2": "this per-layer position pattern", "gemma3": "this per-layer position pattern",
        "olmo2": "this per-layer position pattern", "qwen2": "this per-layer position pattern",
        "qwen3": "qwen3 cannot express MLP biases, this per-layer position pattern (smollm3)", "smollm3": OK,
    },
    "starcoder2": {  # LayerNorm with bias, plain GELU MLP, a window on every layer
        "olmo": "olmo always has this FFN gating",
        "granite": "granite always has this FFN gating",
        "stablelm": "stablelm always has this FFN gating",
        "nemotron": "nemotron cannot express this norm's weight_offset, this local/global layer pattern, a sliding "
                    "window (starcoder2)",
        "llama": "llama cannot express this norm's kind and bias and dtype_order, this local/global layer pattern, a "
                 "sliding window (starcoder2); llama always has this FFN gating",
        "mistral": "mistral always has this FFN gating", "gemma": "embedding scaling",
        "gemma2": "this norm placement", "gemma3": "QK norm", "olmo2": "QK norm", "qwen2": "an output-projection bias",
        "qwen3": "qwen3 always has QK norm, this FFN gating",
        "smollm3": "smollm3 cannot express this norm's kind and bias and dtype_order (starcoder2); smollm3 always has "
                   "this FFN gating",
        "starcoder2": OK,
    },
    "nemotron": {  # LayerNorm1P, relu² MLP, half the head rotated
        "olmo": "this RoPE configuration's fraction and fp32_tables (nemotron)",
        "granite": "this RoPE configuration's fraction (nemotron)",
        "stablelm": "stablelm cannot express this norm's weight_offset, an output-projection bias, MLP biases",
        "llama": "llama cannot express this norm's kind and bias and weight_offset and dtype_order, this RoPE "
                 "configuration's fraction (nemotron); llama always has this FFN gating",
        "mistral": "MLP biases, this RoPE configuration's fraction", "gemma": "this RoPE configuration's fraction",
        "gemma2": "this norm placement", "gemma3": "QK norm", "olmo2": "QK norm", "qwen2": "an output-projection bias",
        "qwen3": "QK norm", "smollm3": "this RoPE configuration's fraction (nemotron)",
        "starcoder2": "starcoder2 cannot express this norm's weight_offset, this RoPE configuration's fraction "
                      "(nemotron)",
        "nemotron": OK,
    },
    "stablelm": {  # parallel block with one LayerNorm, a quarter of the head rotated, q/k/v biases
        "olmo": "this norm placement",
        "granite": "this norm placement",
        "llama": "llama cannot express this norm's kind and bias and dtype_order, this norm placement, a q bias, a k "
                 "bias, a v bias, this RoPE configuration's fraction (stablelm)",
        "mistral": "this norm placement", "gemma": "embedding scaling", "gemma2": "this norm placement",
        "gemma3": "QK norm", "olmo2": "QK norm", "qwen2": "qwen2 cannot express this norm's kind and bias and "
        "dtype_order, this norm placement, this RoPE configuration's fraction (stablelm)",
        "qwen3": "QK norm", "smollm3": "this norm placement", "starcoder2": "this FFN gating",
        "nemotron": "nemotron cannot express this norm's weight_offset, this norm placement, a q bias, a k bias, a v "
                    "bias, this FFN gating (stablelm)",
        "stablelm": OK,
    },
    "stablelm-sequential": {  # no parallel residual, half the head rotated
        "olmo": "olmo cannot express this norm's weight and bias and dtype_order",
        "granite": "granite cannot express this norm's kind and bias and dtype_order, this RoPE configuration's "
                   "fraction (stablelm)",
        "llama": "llama cannot express this norm's kind and bias and dtype_order, this RoPE configuration's fraction "
                 "(stablelm)",
        "mistral": "this RoPE configuration's fraction", "gemma": "embedding scaling",
        "gemma2": "this norm placement", "gemma3": "QK norm", "olmo2": "QK norm",
        "qwen2": "qwen2 always has a q bias, a k bias, a v bias", "qwen3": "QK norm",
        "smollm3": "smollm3 cannot express this norm's kind and bias and dtype_order, this RoPE configuration's "
                   "fraction (stablelm)",
        "starcoder2": "starcoder2 cannot express this FFN gating, this RoPE configuration's fraction (stablelm)",
        "nemotron": "nemotron cannot express this norm's weight_offset, this FFN gating (stablelm)",
        "stablelm": OK,
    },
    "granite": {  # embedding, attention, residual and logit multipliers
        "olmo": "residual scaling",
        "llama": "llama cannot express a custom attention score scale, residual scaling, embedding scaling, a logit "
                 "scale (granite)",
        "mistral": "residual scaling", "gemma": "residual scaling", "gemma2": "residual scaling",
        "gemma3": "residual scaling", "olmo2": "residual scaling", "qwen2": "residual scaling",
        "qwen3": "residual scaling", "smollm3": "smollm3 cannot express a custom attention score scale, residual "
        "scaling, embedding scaling, a logit scale (granite)",
        "starcoder2": "residual scaling", "nemotron": "residual scaling", "stablelm": "residual scaling",
        "granite": OK,
    },
    "olmo": {  # LayerNorm with neither weight nor bias, RoPE in fp32
        "llama": "llama cannot express this norm's kind and weight, this RoPE configuration's fp32_tables (olmo)",
        "mistral": "a q bias",
        "gemma": "embedding scaling", "gemma2": "this norm placement", "gemma3": "QK norm",
        "olmo2": "olmo2 always has QK norm", "qwen2": "an output-projection bias",
        "qwen3": "qwen3 cannot express this norm's kind and weight, this RoPE configuration's fp32_tables (olmo)",
        "smollm3": "smollm3 cannot express this norm's kind and weight", "starcoder2": "this FFN gating",
        "nemotron": "this FFN gating", "stablelm": "an output-projection bias",
        "granite": "granite cannot express this norm's kind and weight, this RoPE configuration's fp32_tables",
        "olmo": OK,
    },
    "phi3": {  # fused qkv and gate_up, a window on every layer, longrope (short regime) on half of each head
        **dict.fromkeys(("llama", "mistral", "smollm3", "granite", "olmo", "gemma", "gemma2", "gemma3", "olmo2",
                         "qwen2", "qwen3", "starcoder2", "cohere", "cohere2"),
                        "cannot express this model: config.json: partial_rotary_factor=0.5 with rope_type 'longrope': "
                        "the scaled tables cover part of each head but this family's attention rotates all of it"),
        "nemotron": "nemotron cannot express this norm's kind and bias and weight_offset and dtype_order, this FFN "
                    "gating, this local/global layer pattern, a sliding window (phi3)",
        "stablelm": "stablelm cannot express this norm's kind and bias and dtype_order, this local/global layer "
                    "pattern, a sliding window (phi3)",
        "phi3": OK,
    },
    "cohere": {  # parallel block with one weight-only LayerNorm, per-head QK-norm weights, interleaved RoPE in fp32
        "llama": "llama cannot express this norm's kind and dtype_order and written_out, this norm placement, QK "
                 "norm, QK-norm weights per head, this RoPE configuration's layout and fp32_rotation, a logit scale "
                 "(cohere)",
        "mistral": "a q bias, a k bias, a v bias, an output-projection bias",
        "gemma": "gemma always has embedding scaling", "gemma2": "this norm's kind and weight_offset",
        "gemma3": "gemma3 cannot express this norm's kind and weight_offset and written_out, this norm placement, "
                  "QK-norm weights per head",
        "olmo2": "this RoPE configuration's layout and fp32_tables and fp32_rotation",
        "qwen2": "an output-projection bias",
        "qwen3": "qwen3 cannot express this norm's kind and dtype_order and written_out, this norm placement, QK-norm "
                 "weights per head",
        "smollm3": "QK norm, QK-norm weights per head",
        "starcoder2": "this FFN gating", "nemotron": "this norm's bias and weight_offset and written_out",
        "stablelm": "stablelm cannot express this norm's bias and written_out, an output-projection bias, this RoPE "
                    "configuration's layout and fp32_rotation, a logit scale (cohere)",  # its QK norms: yes
        "granite": "granite cannot express this norm's kind and dtype_order and written_out, this norm placement, QK "
                   "norm, QK-norm weights per head, this RoPE configuration's layout and fp32_rotation (cohere)",
        "olmo": "this norm's weight and dtype_order and written_out", "cohere": OK,
        "cohere2": "cohere2 cannot express QK norm, QK-norm weights per head, this per-layer position pattern (cohere)",
    },
    "cohere2": {  # as cohere without QK norm; RoPE on the sliding layers only, the full layers NoPE
        "llama": "llama cannot express this norm's kind and dtype_order and written_out, this norm placement, this "
                 "per-layer position pattern, this RoPE configuration's layout and fp32_rotation, this local/global "
                 "layer pattern, a sliding window, a logit scale (cohere2)",
        "mistral": "a q bias", "gemma": "this per-layer position pattern", "gemma2": "this per-layer position pattern",
        "gemma3": "gemma3 always has QK norm, embedding scaling", "olmo2": "olmo2 always has QK norm",
        "qwen2": "an output-projection bias", "qwen3": "qwen3 always has QK norm",
        "smollm3": "smollm3 cannot express this norm's kind and dtype_order and written_out, this norm placement, "
                   "this RoPE configuration's layout and fp32_rotation, a logit scale (cohere2)",
        "starcoder2": "this FFN gating", "nemotron": "this FFN gating", "stablelm": "this per-layer position pattern",
        "granite": "granite cannot express this norm's kind and dtype_order and written_out, this norm placement, "
                   "this per-layer position pattern, this RoPE configuration's layout and fp32_rotation, this "
                   "local/global layer pattern, a sliding window (cohere2)",
        "olmo": "this per-layer position pattern",
        "cohere": "cohere cannot express this per-layer position pattern, this local/global layer pattern, a sliding "
                  "window (cohere2)",
        "cohere2": OK,
    },
}
# Cohere and Cohere 2 as targets: every other source lacks their one weight-only LayerNorm in a
# parallel block and their interleaved RoPE rotated in fp32
_COHERE_NORM = "this norm's kind and dtype_order and written_out, this norm placement"
_OWN_NORM = "this norm's bias and written_out, this norm placement"
for _source, (_cohere, _cohere2) in {
    "llama": ("cohere cannot express " + _COHERE_NORM + ", MLP biases, this RoPE configuration's layout and "
              "fp32_rotation (llama)", "cohere2 cannot express " + _COHERE_NORM + ", MLP biases, this per-layer "
              "position pattern"),
    "llama-plain": ("cohere cannot express " + _COHERE_NORM + ", this RoPE configuration's layout and fp32_rotation "
                    "(llama)", "this per-layer position pattern, this RoPE configuration's layout and fp32_rotation"),
    "mistral": ("this local/global layer pattern, a sliding window (mistral)",
                "cohere2 cannot express " + _COHERE_NORM + ", this RoPE configuration's layout and fp32_rotation "
                "(mistral)"),
    "mistral-nowindow": (_COHERE_NORM, "this per-layer position pattern"),
    "gemma": ("this norm's kind and weight_offset", "embedding scaling (gemma)"),
    "gemma2": ("attention soft-capping", "attention soft-capping"),
    "gemma3": ("QK norm", "a separate RoPE for local layers"),
    "olmo2": ("this RoPE configuration's layout and fp32_tables and fp32_rotation (olmo2)", "QK norm"),
    "qwen2": ("a q bias, a k bias, a v bias", "a q bias, a k bias, a v bias"),
    "qwen3": ("QK norm", "QK norm"),
    "smollm3": ("MLP biases, this per-layer position pattern", "MLP biases"),
    "starcoder2": ("cohere always has this FFN gating", "cohere2 always has this FFN gating"),
    "nemotron": ("this norm's bias and weight_offset and written_out",
                 "this RoPE configuration's layout and fraction and fp32_rotation (nemotron)"),
    "stablelm": ("cohere cannot express this norm's bias and written_out, a q bias, a k bias, a v bias, this RoPE "
                 "configuration's layout and fraction and fp32_rotation (stablelm)", "this per-layer position pattern"),
    "stablelm-sequential": (_OWN_NORM, _OWN_NORM),
    "granite": ("residual scaling", "residual scaling"),
    "olmo": ("cohere cannot express this norm's weight and dtype_order and written_out, this norm placement, this "
             "RoPE configuration's layout and fp32_tables and fp32_rotation (olmo)",
             "this norm's weight and dtype_order and written_out"),
}.items():
    MATRIX[_source].update({"cohere": _cohere, "cohere2": _cohere2})
# Phi-3 as a target: no biases, llama's norm, RoPE default or longrope; exact for the llama-style
# sources without biases or other scalings (parity-tested through its fused tensors)
for _source, _phi3 in {
    "llama": "phi3 cannot express a q bias, a k bias, a v bias, an output-projection bias, MLP biases, this RoPE "
             "configuration's scaling and factor and original_max_positions (llama)",
    "llama-plain": OK, "mistral": OK, "mistral-nowindow": OK,
    "gemma": "phi3 cannot express this norm's weight_offset and dtype_order, a q bias, a k bias, a v bias, an "
             "output-projection bias, embedding scaling (gemma)",
    "gemma2": "attention soft-capping", "gemma3": "QK norm, this RoPE configuration's scaling and factor",
    "olmo2": "QK norm", "qwen2": "this RoPE configuration's scaling and factor and original_max_positions",
    "qwen3": "this RoPE configuration's scaling and factor",
    "smollm3": "this per-layer position pattern", "starcoder2": "phi3 always has this FFN gating",
    "nemotron": "phi3 always has this FFN gating", "stablelm": "this norm placement, a q bias",
    "stablelm-sequential": "phi3 cannot express this norm's kind and bias and dtype_order (stablelm)",
    "granite": "residual scaling", "olmo": "this RoPE configuration's fp32_tables (olmo)",
    "cohere": "QK-norm weights per head", "cohere2": "this per-layer position pattern",
}.items():
    MATRIX[_source]["phi3"] = _phi3
MATRIX.update({
    # the GPT-2-era families: absolute positions and no RoPE, so no exact pair with another family
    "gpt2": {
        "llama": "llama cannot express this norm's kind and bias and dtype_order, absolute position embeddings",
        "mistral": "mistral cannot express this norm's kind and bias and dtype_order, a q bias",
        "gemma": "gemma cannot express this norm's kind and bias and weight_offset, MLP biases",
        "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "olmo2": "olmo2 cannot express this norm's kind and bias, this norm placement",
        "qwen2": "qwen2 cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order, MLP biases",
        "smollm3": "smollm3 cannot express this norm's kind and bias and dtype_order, absolute position embeddings",
        "starcoder2": 'starcoder2 cannot express absolute position embeddings, this per-layer position pattern',
        "nemotron": "nemotron cannot express this norm's weight_offset, absolute position embeddings",
        "stablelm": 'stablelm cannot express an output-projection bias, MLP biases',
        "granite": "granite cannot express this norm's kind and bias and dtype_order, absolute position embeddings",
        "olmo": "olmo cannot express this norm's weight and bias and dtype_order, MLP biases",
        "opt": 'opt cannot express per-layer score scaling (1/(layer+1)), embedding dropout (gpt2)',
        "xglm": 'xglm cannot express absolute position embeddings, per-layer score scaling (1/(layer+1))',
        "gpt_neo": 'gpt_neo cannot express a q bias, a k bias',
        "gpt2": OK,
    },
    "gpt_neo": {
        "llama": "llama cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "mistral": "mistral cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "gemma": "gemma cannot express this norm's kind and bias and weight_offset, an output-projection bias",
        "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "olmo2": "olmo2 cannot express this norm's kind and bias, this norm placement",
        "qwen2": "qwen2 cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "smollm3": "smollm3 cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "starcoder2": 'starcoder2 cannot express an output-projection bias, MLP biases',
        "nemotron": "nemotron cannot express this norm's weight_offset, an output-projection bias",
        "stablelm": 'stablelm cannot express an output-projection bias, MLP biases',
        "granite": "granite cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "olmo": "olmo cannot express this norm's weight and bias and dtype_order, an output-projection bias",
        "opt": 'opt cannot express an output-projection bias, MLP biases',
        "xglm": 'xglm cannot express absolute position embeddings, this local/global layer pattern',
        "gpt_neo": OK,
        "gpt2": 'gpt2 cannot express this local/global layer pattern, a sliding window',
    },
    "opt": {
        "llama": "llama cannot express this norm's kind and bias and dtype_order, this norm placement",
        "mistral": "mistral cannot express this norm's kind and bias and dtype_order, this norm placement",
        "gemma": "gemma cannot express this norm's kind and bias and weight_offset, this norm placement",
        "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "olmo2": "olmo2 cannot express this norm's kind and bias, this norm placement",
        "qwen2": "qwen2 cannot express this norm's kind and bias and dtype_order, this norm placement",
        "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order, this norm placement",
        "smollm3": "smollm3 cannot express this norm's kind and bias and dtype_order, this norm placement",
        "starcoder2": 'starcoder2 cannot express this norm placement, absolute position embeddings',
        "nemotron": "nemotron cannot express this norm's weight_offset, this norm placement",
        "stablelm": 'stablelm cannot express this norm placement, an output-projection bias',
        "granite": "granite cannot express this norm's kind and bias and dtype_order, this norm placement",
        "olmo": "olmo cannot express this norm's weight and bias and dtype_order, this norm placement",
        "opt": OK,
        "xglm": 'xglm cannot express this norm placement, absolute position embeddings',
        "gpt_neo": 'gpt_neo cannot express this norm placement, a q bias',
        "gpt2": 'gpt2 cannot express this norm placement, a position offset',
    },
    "xglm": {
        "llama": "llama cannot express this norm's kind and bias and dtype_order, absolute position embeddings",
        "mistral": "mistral cannot express this norm's kind and bias and dtype_order, a q bias",
        "gemma": "gemma cannot express this norm's kind and bias and weight_offset, MLP biases",
        "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset, this norm placement",
        "olmo2": "olmo2 cannot express this norm's kind and bias, this norm placement",
        "qwen2": "qwen2 cannot express this norm's kind and bias and dtype_order, an output-projection bias",
        "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order, MLP biases",
        "smollm3": "smollm3 cannot express this norm's kind and bias and dtype_order, absolute position embeddings",
        "starcoder2": 'starcoder2 cannot express absolute position embeddings, a position offset',
        "nemotron": "nemotron cannot express this norm's weight_offset, absolute position embeddings",
        "stablelm": 'stablelm cannot express an output-projection bias, MLP biases',
        "granite": "granite cannot express this norm's kind and bias and dtype_order, absolute position embeddings",
        "olmo": "olmo cannot express this norm's weight and bias and dtype_order, MLP biases",
        "opt": 'opt cannot express absolute position embeddings, embedding scaling',
        "xglm": OK,
        "gpt_neo": 'gpt_neo cannot express a q bias, a k bias',
        "gpt2": 'gpt2 cannot express absolute position embeddings, a position offset',
    },
})
# the GPT-2-era families as targets: each always has absolute positions, which a RoPE model lacks
for _source, _row in {
    "llama": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "mistral": {
        "gpt2": 'gpt2 cannot express this number of KV heads, this head_dim',
        "gpt_neo": 'gpt_neo cannot express this number of KV heads, this head_dim',
        "opt": 'opt cannot express this number of KV heads, this head_dim',
        "xglm": 'xglm cannot express this number of KV heads, this head_dim',
    },
    "gemma": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and weight_offset",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and weight_offset",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and weight_offset",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and weight_offset",
    },
    "gemma2": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and weight_offset",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and weight_offset",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and weight_offset",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and weight_offset",
    },
    "gemma3": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and weight_offset",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and weight_offset",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and weight_offset",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and weight_offset",
    },
    "olmo2": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias",
        "opt": "opt cannot express this number of KV heads, this norm's kind and bias",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and bias",
    },
    "qwen2": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "qwen3": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "smollm3": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "starcoder2": {
        "gpt2": 'gpt2 cannot express this number of KV heads, this per-layer position pattern',
        "gpt_neo": 'gpt_neo cannot express this number of KV heads, a q bias',
        "opt": 'opt cannot express this number of KV heads, this per-layer position pattern',
        "xglm": 'xglm cannot express this number of KV heads, this per-layer position pattern',
    },
    "nemotron": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's weight_offset",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's weight_offset",
        "opt": "opt cannot express this number of KV heads, this norm's weight_offset",
        "xglm": "xglm cannot express this number of KV heads, this norm's weight_offset",
    },
    "stablelm": {
        "gpt2": 'gpt2 cannot express this number of KV heads, this norm placement',
        "gpt_neo": 'gpt_neo cannot express this number of KV heads, this norm placement',
        "opt": 'opt cannot express this number of KV heads, this norm placement',
        "xglm": 'xglm cannot express this number of KV heads, this norm placement',
    },
    "granite": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "olmo": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's weight and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's weight and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's weight and bias and dtype_order",
    },
    "llama-plain": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "mistral-nowindow": {
        "gpt2": "gpt2 cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "gpt_neo": "gpt_neo cannot express this number of KV heads, this norm's kind and bias and dtype_order",
        "opt": "opt cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
        "xglm": "xglm cannot express this number of KV heads, this norm's kind and eps and bias and dtype_order",
    },
    "stablelm-sequential": {
        "gpt2": 'gpt2 cannot express this number of KV heads, this FFN gating',
        "gpt_neo": 'gpt_neo cannot express this number of KV heads, this FFN gating',
        "opt": 'opt cannot express this number of KV heads, this FFN gating',
        "xglm": 'xglm cannot express this number of KV heads, this FFN gating',
    },
}.items():
    MATRIX[_source].update(_row)
MATRIX["gptj"] = {  # parallel block with one LayerNorm, interleaved RoPE over 30 of 44 dims, LM-head bias
    "llama": "llama cannot express this norm's kind and bias and dtype_order, this norm placement, an LM-head bias",
    "mistral": "mistral cannot express this norm's kind and bias and dtype_order",
    "gemma": "gemma cannot express this norm's kind and bias and weight_offset",
    "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset",
    "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset",
    "olmo2": "olmo2 cannot express this norm's kind and bias", "qwen2": "this norm placement",
    "qwen3": "q.k in fp32", "smollm3": "this RoPE configuration's layout and rotary_dims",
    "starcoder2": "starcoder2 cannot express this norm placement", "nemotron": "this parallel-block sum order",
    "stablelm": "stablelm cannot express MLP biases, an LM-head bias", "granite": "an LM-head bias",
    "olmo": "olmo cannot express this norm's weight and bias and dtype_order", "gptj": OK,
    "phi": "phi cannot express this RoPE configuration's layout and rotary_dims",
    "gpt_neox": "gpt_neox cannot express this norm placement",
}
MATRIX["phi"] = {  # GPT-J's block with biases everywhere, half-rotation RoPE over half the head, QK LayerNorm
    "llama": "llama cannot express this norm's kind and bias and dtype_order",
    "mistral": "mistral cannot express this norm's kind and bias and dtype_order",
    "gemma": "gemma cannot express this norm's kind and bias and weight_offset",
    "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset",
    "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset",
    "olmo2": "olmo2 cannot express this norm's kind and bias", "qwen2": "this norm placement",
    "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order", "smollm3": "QK norm",
    "starcoder2": "starcoder2 cannot express this norm placement", "nemotron": "nemotron cannot express this norm's "
    "weight_offset", "stablelm": "stablelm cannot express QK norm", "granite": "an LM-head bias",
    "olmo": "olmo cannot express this norm's weight and bias and dtype_order",
    "gptj": "gptj cannot express this number of KV heads", "phi": OK,
    "gpt_neox": "gpt_neox cannot express this number of KV heads",
}
MATRIX["gpt_neox"] = {  # parallel block with two LayerNorms, a quarter of the head rotated, fused qkv, MHA
    "llama": "llama cannot express this norm's kind and bias and dtype_order",
    "mistral": "mistral cannot express this norm's kind and bias and dtype_order",
    "gemma": "gemma cannot express this norm's kind and bias and weight_offset",
    "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset",
    "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset",
    "olmo2": "olmo2 cannot express this norm's kind and bias", "qwen2": "this parallel-block sum order",
    "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order", "smollm3": "this norm placement",
    "starcoder2": "starcoder2 cannot express this norm placement", "nemotron": "nemotron cannot express this norm's "
    "weight_offset", "stablelm": "stablelm cannot express this norm placement",
    "granite": "granite cannot express this norm's kind and bias and dtype_order",
    "olmo": "olmo cannot express this norm's weight and bias and dtype_order",
    "gptj": "gptj cannot express this norm placement", "phi": "phi cannot express this norm placement",
    "gpt_neox": OK, "bloom": "bloom cannot express this FFN width",
}
MATRIX["bloom"] = {  # ALiBi over six heads, embedding LayerNorm, residual after the norm, fused qkv
    "llama": "llama cannot express this norm's kind and bias and dtype_order",
    "mistral": "mistral cannot express this norm's kind and bias and dtype_order",
    "gemma": "gemma cannot express this norm's kind and bias and weight_offset",
    "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset",
    "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset",
    "olmo2": "olmo2 cannot express this norm's kind and bias", "qwen2": "the residual taken after the norm",
    "qwen3": "this kind of ALiBi", "smollm3": "this per-layer position pattern",
    "starcoder2": "starcoder2 cannot express an embedding norm", "nemotron": "nemotron cannot express this norm's "
    "weight_offset", "stablelm": "stablelm cannot express an embedding norm",
    "granite": "granite cannot express this norm's kind and bias and dtype_order",
    "olmo": "olmo cannot express this norm's weight and bias and dtype_order",
    "gptj": "gptj cannot express this norm placement", "phi": "phi cannot express this norm placement",
    "gpt_neox": "gpt_neox cannot express an embedding norm", "bloom": OK, "mpt": "mpt cannot express this norm's bias",
}
MATRIX["mpt"] = {  # MPT's ALiBi over six heads, LayerNorm without bias, no biases, fused qkv, a score scale
    "llama": "llama cannot express this norm's kind and dtype_order",
    "mistral": "mistral cannot express this norm's kind and dtype_order",
    "gemma": "gemma cannot express this norm's kind and weight_offset",
    "gemma2": "gemma2 cannot express this norm's kind and weight_offset",
    "gemma3": "gemma3 cannot express this norm's kind and weight_offset",
    "olmo2": "olmo2 cannot express this norm's kind", "qwen2": "this kind of ALiBi",
    "qwen3": "qwen3 cannot express this norm's kind and dtype_order", "smollm3": "a custom attention score scale",
    "starcoder2": "starcoder2 cannot express this norm's bias", "nemotron": "nemotron cannot express this norm's "
    "bias and weight_offset", "stablelm": "stablelm cannot express this norm's bias",
    "granite": "granite cannot express this norm's kind and dtype_order",
    "olmo": "olmo cannot express this norm's weight and dtype_order", "gptj": "gptj cannot express this norm's bias",
    "phi": "phi cannot express this norm's bias", "gpt_neox": "gpt_neox cannot express this norm's bias",
    "bloom": "bloom cannot express this norm's bias", "mpt": OK, "falcon": "falcon cannot express this norm's bias",
}
MATRIX["falcon"] = {  # Falcon-40B's layout: parallel with two LayerNorms, GQA, fused grouped qkv
    "llama": "llama cannot express this norm's kind and bias and dtype_order",
    "mistral": "mistral cannot express this norm's kind and bias and dtype_order",
    "gemma": "gemma cannot express this norm's kind and bias and weight_offset",
    "gemma2": "gemma2 cannot express this norm's kind and bias and weight_offset",
    "gemma3": "gemma3 cannot express this norm's kind and bias and weight_offset",
    "olmo2": "olmo2 cannot express this norm's kind and bias", "qwen2": "this parallel-block sum order",
    "qwen3": "qwen3 cannot express this norm's kind and bias and dtype_order", "smollm3": "this norm placement",
    "starcoder2": "starcoder2 cannot express this norm placement", "nemotron": "nemotron cannot express this norm's "
    "weight_offset", "stablelm": "stablelm cannot express this norm placement",
    "granite": "granite cannot express this norm's kind and bias and dtype_order",
    "olmo": "olmo cannot express this norm's weight and bias and dtype_order",
    "gptj": "gptj cannot express this number of KV heads", "phi": "phi cannot express this norm placement",
    "gpt_neox": "gpt_neox cannot express this number of KV heads", "bloom": "bloom cannot express this number of KV "
    "heads", "mpt": "mpt cannot express this number of KV heads", "falcon": OK,
}
# StableLM with qk_layernorm: its bias-free LayerNorms per head, each head its own weight, are what
# every other family lacks; Cohere's QK norms are the same, its block norms and placement are not
MATRIX["stablelm_qk"] = {_target: {
    "stablelm": OK, "phi": "phi always has a QK-norm bias",
    "cohere": "cohere cannot express this norm's bias and written_out, this norm placement, a q bias",
}.get(_target, "QK-norm weights per head") for _target in FAMILIES
    if _target not in ("deepseek_v2", "deepseek_v3", "minicpm3", "deepseek_v32")}  # latent: as every source below
# the new families as targets: what every other source is refused for
COLUMNS: dict[str, tuple[str, dict[str, str]]] = {  # target -> (the usual refusal, exceptions by source)
    "gptj": ("gptj cannot express this number of KV heads", {}),  # every source has 2 KV heads for 4 heads
    "gpt_neox": ("gpt_neox cannot express this number of KV heads", {}),  # every other source has 2 KV heads
    "bloom": ("bloom cannot express this FFN width", {}),  # always 4 x hidden; no other source has that
    "mpt": ("mpt cannot express this FFN width", {}),  # the same
    "falcon": ("falcon cannot express this number of KV heads",  # 2 KV heads, sequential: reads back as 4
               {"gemma2": "falcon cannot express this norm's kind and bias and weight_offset",
                "gemma3": "falcon cannot express this norm's kind and bias and weight_offset",
                "olmo2": "falcon cannot express this norm's kind and bias",
                "stablelm": "falcon cannot express a q bias",
                "gptj": "falcon cannot express MLP biases", "phi": "falcon cannot express QK norm",
                "gpt_neox": "falcon cannot express this RoPE configuration's fraction",
                "bloom": "falcon cannot express an embedding norm", "mpt": "falcon cannot express this norm's bias"}),
    "phi": ("phi cannot express this norm's kind and bias",
            {"gemma": "phi cannot express this norm's kind and bias and weight_offset",
             "nemotron": "phi cannot express this norm's weight_offset", "starcoder2": "phi cannot express this norm "
             "placement", "stablelm": "phi cannot express this FFN gating", "olmo": "phi cannot express this norm's "
             "weight and bias", "stablelm-sequential": "phi cannot express this norm placement"}),
}
NEW_ROPE, NEW_GPT = ("phi3", "cohere", "cohere2"), ("gpt2", "gpt_neo", "opt", "xglm")
NEW_ALIBI = ("gptj", "phi", "gpt_neox", "bloom", "mpt", "falcon")
# pairs between the three batches of families added together (GPT-era; Phi-3, Cohere, Cohere 2;
# the parallel and ALiBi families):
# none can hold the other exactly; each must be refused (exit 2, nothing written)
REFUSED = "export to the source family instead"
for _batch, _others in ((NEW_ROPE, NEW_GPT + NEW_ALIBI), (NEW_GPT, NEW_ROPE + NEW_ALIBI),
                        (NEW_ALIBI, NEW_ROPE + NEW_GPT)):
    for _source in _batch:
        for _target in _others:
            MATRIX[_source].setdefault(_target, REFUSED)
for _source, _row in MATRIX.items():
    for _target, (_usual, _exceptions) in COLUMNS.items():
        _row.setdefault(_target, _exceptions.get(_source, _usual))
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
# a mixture of experts exports only to its own family, and to another MoE family only as far as the
# experts agree: Mixtral's weights stay fp32, Qwen2-MoE has a shared expert, the QK norms differ
MATRIX.update({
    "mixtral": {"mixtral": OK, "qwen2_moe": "qwen2_moe cannot express this mixture of experts (mixtral)",
                "qwen3_moe": "qwen3_moe cannot express this mixture of experts (mixtral); qwen3_moe always has QK norm",
                "olmoe": "olmoe cannot express this mixture of experts"},
    "qwen2_moe": {"qwen2_moe": OK, "mixtral": "mixtral cannot express a q bias, a k bias, a v bias, this mixture of "
                                              "experts (qwen2_moe)",
                  "qwen3_moe": "this mixture of experts", "olmoe": "this mixture of experts"},
    "qwen3_moe": {"qwen3_moe": OK, "mixtral": "this mixture of experts",
                  "qwen2_moe": "qwen2_moe cannot express QK norm, an output-projection bias, this mixture of experts",
                  "olmoe": "olmoe cannot express QK norm, this mixture of experts"},
    "olmoe": {"olmoe": OK, "qwen3_moe": "qwen3_moe cannot express QK norm (olmoe)",
              "mixtral": "this mixture of experts",
              "qwen2_moe": "qwen2_moe cannot express QK norm, an output-projection bias, this mixture of experts"},
})
# every source above has standard attention, which the latent-attention families cannot hold; a dense
# model is no mixture of experts, and a dense family holds none
for _target in MOE:  # Phi-3's longrope over half of each head is refused before anything else
    MATRIX["phi3"].setdefault(_target, REFUSED)
for _name, _row in MATRIX.items():
    for _target in ("deepseek_v2", "deepseek_v3"):
        _row.setdefault(_target, f"{_target} always has latent attention (MLA)")
    for _target in FAMILIES:
        if _name in MOE:
            _row.setdefault(_target, "this mixture of experts")  # with what else the target lacks
        elif _target in MOE:
            _row.setdefault(_target, "this mixture of experts, which this model")  # "... always has ..., this"
# MiniCPM3 (latent attention, scaled embeddings, residuals and LM-head input) exports only to itself, and
# no source above has its latent attention
MATRIX["minicpm3"] = {_target: OK if _target == "minicpm3" else REFUSED for _target in FAMILIES}
for _name, _row in MATRIX.items():  # said before any mixture of experts the source has
    if _name != "minicpm3":
        _row["minicpm3"] = "minicpm3 always has latent attention (MLA)"
for _name, _row in MATRIX.items():  # DeepSeek-V3.2's sparse attention: no source above has it
    _row["deepseek_v32"] = "deepseek_v32 always has sparse attention (DSA), which this model lacks"
EXPORTS = [(source, target, refusal) for source, row in MATRIX.items() for target, refusal in row.items()]


def test_matrix_covers_every_pair() -> None:
    assert set(MATRIX) == set(SOURCES)
    assert all(set(row) == set(FAMILIES) for row in MATRIX.values())


@pytest.mark.parametrize(("source", "target", "refusal"), EXPORTS)
def test_cross_family_export(source: str, target: str, refusal: str | None, checkpoint: Callable[..., Path],
                             canonical: Callable[[str], Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(canonical(source)), str(out), "--to", "hf", "--family", target])
    if refusal is not None:
        assert result.exit_code == 2, result.output
        assert refusal in result.output, result.output
        # every refusal names what the target lacks, or what it always has that the model lacks
        assert f"{target} cannot express" in result.output or f"{target} always has" in result.output, result.output
        assert "export to the source family instead" in result.output
        assert not out.exists()
        return
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == FAMILIES[target].model_types[0]
    assert config["architectures"] == [FAMILIES[target].architecture]
    assert max_abs(hf_logits(out), hf_logits(checkpoint(source))) <= FP32_TOL


def test_smollm3_rotating_every_layer_exports_as_llama(tmp_path: Path) -> None:
    """#14's example of an exact pair outside the matrix's sources: a SmolLM3 whose every layer uses
    RoPE (`no_rope_layers` all 1) and no window is a LLaMA, written as one with equal logits."""
    model = build_model("smollm3", num_hidden_layers=4, no_rope_layers=[1, 1, 1, 1], eos_token_id=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    src = save_checkpoint(model, tmp_path / "hf")
    to_canonical(src, tmp_path / "canonical")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "canonical"), str(tmp_path / "llama"), "--to", "hf",
                                       "--family", "llama"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
    assert max_abs(hf_logits(tmp_path / "llama"), hf_logits(src)) <= FP32_TOL


# ------------------------------------------------------------------------------------------------ Gemma3 + vision
@pytest.fixture(scope="module")
def multimodal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=1)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    perturb(model)
    directory = tmp_path_factory.mktemp("gemma3-vision")
    model.save_pretrained(directory)
    with torch.no_grad():
        logits = model(IDS).logits.float()
    return directory, logits


def test_gemma3_conditional_generation_text_path(multimodal: tuple[Path, torch.Tensor], tmp_path: Path) -> None:
    src, ref = multimodal
    assert json.loads((src / "config.json").read_text())["model_type"] == "gemma3"
    names = list(tensors_of(src))
    assert any(n.startswith("vision_tower.") for n in names) and any("multi_modal_projector" in n for n in names)
    assert family_for("gemma3") is FAMILIES["gemma3"] and "vision tower" in FAMILIES["gemma3"].note
    # transformers writes the older layout on disk; also read the in-memory `model.language_model.` one
    renamed = tmp_path / "renamed"
    edited_copy(src, renamed, lambda config: config)
    (renamed / "model.safetensors").unlink()
    prefixes = {"language_model.model.": "model.language_model.", "vision_tower.": "model.vision_tower.",
                "multi_modal_projector.": "model.multi_modal_projector."}
    save_file({next((new + n[len(old):] for old, new in prefixes.items() if n.startswith(old)), n): t.contiguous()
               for n, t in tensors_of(src).items()}, str(renamed / "model.safetensors"), metadata={"format": "pt"})
    assert any(n.startswith("model.language_model.") for n in tensors_of(renamed))
    for directory in (src, renamed):
        assert max_abs(our_logits(directory), ref) <= FP32_TOL
    meta = to_canonical(src, tmp_path / "canon")
    assert meta.family == "gemma3" and meta.arch.final_softcap is None
    assert meta.source["dropped_tensors"] and all("language_model" not in n for n in meta.source["dropped_tensors"])
    assert max_abs(our_logits(tmp_path / "canon"), ref) <= FP32_TOL
    to_hf(tmp_path / "canon", tmp_path / "text")  # the text-only Gemma3ForCausalLM layout
    config = json.loads((tmp_path / "text" / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert all(n.startswith("model.") for n in tensors_of(tmp_path / "text"))
    assert max_abs(hf_logits(tmp_path / "text"), ref) <= FP32_TOL
