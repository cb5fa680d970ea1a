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

import functools
import json
import shutil
from collections.abc import Callable
from dataclasses import fields as dataclass_fields
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
    TINY,
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
from lmconvert.arch import ArchConfig
from lmconvert.cli import main
from lmconvert.convert import to_canonical, to_hf
from lmconvert.formats.canonical import read_meta
from lmconvert.mappings import BY_MODEL_TYPE, FAMILIES, Inexpressible, MappingError, family_for
from lmconvert.mappings.family import VARIANT_NAMES

# extra export sources: the variants that make cross-family export possible
SOURCES: dict[str, Spec] = {
    **SPECS,
    "llama-plain": Spec("llama", {}, {}, ()),
    "mistral-nowindow": Spec("mistral", dict(sliding_window=None), {}, ()),
    "stablelm-sequential": Spec("stablelm", dict(eos_token_id=1, partial_rotary_factor=0.5), {}, ()),
}


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


@pytest.fixture(scope="module")
def reference(checkpoint: Callable[..., Path]) -> Callable[..., torch.Tensor]:
    """transformers' eager logits of `checkpoint(name, stored)` run in `dtype`, computed once per module (and
    xdist worker): the parity, faithfulness, round-trip, config-style and export tests compare with the same
    ones. Each caller gets its own copy."""
    made: dict[tuple[str, torch.dtype, torch.dtype], torch.Tensor] = {}

    def get(name: str, stored: torch.dtype = torch.float32, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if (name, stored, dtype) not in made:
            made[name, stored, dtype] = hf_logits(checkpoint(name, stored), dtype)
        return made[name, stored, dtype].clone()

    return get


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
def test_fp32_parity(name: str, checkpoint: Callable[..., Path], canonical: Callable[[str], Path],
                     reference: Callable[..., torch.Tensor]) -> None:
    src = checkpoint(name)
    ref = reference(name)
    assert max_abs(our_logits(src), ref) <= FP32_TOL
    assert max_abs(our_logits(canonical(name)), ref) <= FP32_TOL
    assert read_meta(canonical(name)).family == family_of(name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_faithfulness(name: str, dtype: torch.dtype, checkpoint: Callable[..., Path],
                           reference: Callable[..., torch.Tensor]) -> None:
    """In each half type, our error against the same half weights run in fp32 is at most
    FAITHFULNESS x transformers' own error in that type."""
    src = checkpoint(name, dtype)
    exact = reference(name, dtype, torch.float32)  # the same half weights, upcast
    reference_error = float((reference(name, dtype, dtype) - exact).abs().mean())
    ours_error = float((our_logits(src, dtype) - exact).abs().mean())
    assert reference_error > 0
    assert ours_error <= FAITHFULNESS * reference_error, (ours_error, reference_error)


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].bf16_exact])
@pytest.mark.bitexact
def test_bf16_logits_are_transformers_bit_for_bit(name: str, checkpoint: Callable[..., Path],
                                                  reference: Callable[..., torch.Tensor]) -> None:
    """Where every operation follows the reference's order and dtype, bf16 rounds the same way:
    our eager bf16 logits equal transformers' eager bf16 logits exactly (CPU)."""
    src = checkpoint(name, torch.bfloat16)
    ours, ref = our_logits(src, torch.bfloat16), reference(name, torch.bfloat16, torch.bfloat16)
    assert torch.equal(ours, ref), max_abs(ours, ref)


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_bit_exact(name: str, checkpoint: Callable[..., Path], reference: Callable[..., torch.Tensor],
                                 tmp_path: Path) -> None:
    src = checkpoint(name, torch.bfloat16)
    config = check_round_trip(src, tmp_path, FAMILIES[family_of(name)].architecture)
    assert config["dtype"] == "bfloat16"
    assert torch.equal(hf_logits(tmp_path / "back"), reference(name, torch.bfloat16))


@pytest.mark.parametrize("name", NAMES)
def test_sdpa_matches_transformers_sdpa(name: str, checkpoint: Callable[..., Path]) -> None:
    """Our default backend against transformers' default one (soft-capped layers run eager on
    both sides: transformers refuses SDPA for Gemma 2), and eager where transformers has no SDPA (`Spec.sdpa`)."""
    src = checkpoint(name)
    implementation = "eager" if not SPECS[name].sdpa else "sdpa"
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
    implementation = "eager" if not SPECS[name].sdpa else attention
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


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].old_styled])
def test_both_config_styles(name: str, checkpoint: Callable[..., Path], reference: Callable[..., torch.Tensor],
                            tmp_path: Path) -> None:
    spec = SPECS[name]
    new = checkpoint(name)
    old = edited_copy(new, tmp_path / "old", transformers4_style(spec))
    new_config, old_config = (json.loads((d / "config.json").read_text()) for d in (new, old))
    assert ("rope_parameters" in new_config) == spec.rope and "rope_parameters" not in old_config
    family = family_for(new_config["model_type"])
    assert family.arch_config(old_config) == family.arch_config(new_config)
    ref = hf_logits(old)
    assert torch.equal(ref, reference(name))  # transformers reads both the same way too
    assert max_abs(our_logits(old), ref) <= FP32_TOL


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].layer_types])
def test_layer_types_key_is_honoured(name: str, checkpoint: Callable[..., Path],
                                     reference: Callable[..., torch.Tensor], tmp_path: Path) -> None:
    layer_types, kinds = SPECS[name].layer_types
    src = checkpoint(name)
    edited = edited_copy(src, tmp_path / "edited", lambda config: {**config, "layer_types": layer_types})
    assert lmconvert.load(edited).cfg.layer_kinds == kinds
    ref = hf_logits(edited)
    assert max_abs(our_logits(edited), ref) <= FP32_TOL
    assert max_abs(ref, reference(name)) > 1e-3  # the edit matters
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


# the keys that make transformers' default config one lmconvert converts: a spec's `convertible`, and DeepSeek's
# (model types without a spec; their defaults have MoE layers)
CONVERTIBLE = {"deepseek_v2": {"first_k_dense_replace": 32}, "deepseek_v3": {"first_k_dense_replace": 61},
               "deepseek_v32": {"first_k_dense_replace": 61},
               **{spec.model_type: spec.convertible for spec in SPECS.values() if spec.convertible}}


@pytest.mark.parametrize("model_type", sorted(BY_MODEL_TYPE))
def test_missing_keys_take_transformers_defaults(model_type: str) -> None:
    """An almost empty config.json means what transformers' config class defaults mean."""
    family = family_for(model_type)
    stated = CONVERTIBLE.get(model_type, {})
    full = AutoConfig.for_model(model_type, **stated).to_dict()
    assert family.arch_config({"model_type": model_type, **stated}) == family.arch_config(full)


# ------------------------------------------------------------------------------------------------ soft-caps
def test_gemma2_soft_caps_bite(checkpoint: Callable[..., Path], reference: Callable[..., torch.Tensor],
                               tmp_path: Path) -> None:
    src = checkpoint("gemma2")
    capped = reference("gemma2")
    assert capped.abs().max() > 0.9 * FINAL_CAP
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        uncapped = edited_copy(src, tmp_path / key, lambda config, key=key: {**config, key: None})
        ref = hf_logits(uncapped)
        assert max_abs(ref, capped) > 0.1, key
        assert max_abs(our_logits(uncapped), ref) <= FP32_TOL


def test_gemma3_ignores_attention_soft_cap_but_not_the_final_one(checkpoint: Callable[..., Path],
                                                                 reference: Callable[..., torch.Tensor],
                                                                 tmp_path: Path) -> None:
    src = checkpoint("gemma3")
    capped = reference("gemma3")
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
# Every source exported as every family. What a family can hold is written nowhere here: the source's
# config is translated to the target's config.json, passed through transformers' own config class for
# the target (which keeps only what that class reads, and applies its defaults), and read back. Every
# ArchConfig field that does not come back is a variant the target cannot express, and the refusal
# must name each one; where transformers or the target refuse the translated config outright, the
# export must be refused too. An export that is exact must give the source's logits in transformers.


@functools.cache
def source_arch(name: str) -> ArchConfig:
    spec = SOURCES[name]
    config = json.loads(AutoConfig.for_model(spec.model_type, **{**TINY, **spec.kwargs}).to_json_string(use_diff=False))
    return family_for(config["model_type"]).arch_config(config)


def lost_in_transformers(arch: ArchConfig, target: str) -> tuple[str, ...] | None:
    """The ArchConfig fields that do not survive `target`'s config.json as transformers reads it
    (empty: exact); None where the translated config is refused by transformers or by the family."""
    family = FAMILIES[target]
    try:
        written = {"model_type": family.model_types[0], **family.to_hf(arch)}
        read = json.loads(AutoConfig.for_model(**written).to_json_string(use_diff=False))
        back = family.from_hf(read)
    except Exception:  # noqa: BLE001 - any refusal of the translated config, by transformers or by us
        return None
    return tuple(f.name for f in dataclass_fields(ArchConfig) if getattr(back, f.name) != getattr(arch, f.name))


def convert_as(canonical: Path, out: Path, target: str) -> Any:  # noqa: ANN401 - click's Result
    return CliRunner().invoke(main, ["convert", str(canonical), str(out), "--to", "hf", "--family", target])


@pytest.mark.parametrize("source", list(SOURCES))
def test_cross_family_export(source: str, canonical: Callable[[str], Path], reference: Callable[..., torch.Tensor],
                             tmp_path: Path) -> None:
    """`source` exported as every family. Each refusal names every variant lost (checked on the
    family's own translation; the CLI's refusal once per source: exit 2, nothing written), and each
    exact export gives the source's logits in transformers (through the CLI)."""
    arch, own = source_arch(source), family_for(SOURCES[source].model_type).name
    exact = []
    for target in FAMILIES:
        lost = lost_in_transformers(arch, target)
        if target == own:
            assert lost == (), f"{target} cannot hold its own test model: {lost}"
        if lost == ():
            exact.append(target)
            continue
        with pytest.raises(Inexpressible) as refused:
            FAMILIES[target].hf_config(arch, source_family=own)
        said = str(refused.value)
        # every refusal names what the target lacks, or what it always has that the model lacks
        assert f"{target} cannot express" in said or f"{target} always has" in said, said
        assert all(VARIANT_NAMES[name] in said for name in lost or ()), (target, lost, said)
        assert "export to the source family instead" in said
    refused_target = next(t for t in FAMILIES if t not in exact)
    result = convert_as(canonical(source), tmp_path / "refused", refused_target)
    assert result.exit_code == 2 and "export to the source family instead" in result.output, result.output
    assert not (tmp_path / "refused").exists()
    expected = reference(source)
    for target in exact:
        out = tmp_path / target
        result = convert_as(canonical(source), out, target)
        assert result.exit_code == 0, (target, result.output)
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == FAMILIES[target].model_types[0]
        assert config["architectures"] == [FAMILIES[target].architecture]
        assert max_abs(hf_logits(out), expected) <= FP32_TOL, target


def test_every_variant_has_a_name_a_refusal_can_say() -> None:
    assert [f.name for f in dataclass_fields(ArchConfig) if f.name not in VARIANT_NAMES] == []


@pytest.mark.slow
def test_some_exports_across_families_are_exact() -> None:
    """The matrix is not all refusals: LLaMA's plain model is Granite's, Mistral's without a window
    is LLaMA's, and so on (each confirmed by transformers' logits in test_cross_family_export)."""
    exact = {(s, t) for s in SOURCES for t in FAMILIES
             if t != family_for(SOURCES[s].model_type).name and lost_in_transformers(source_arch(s), t) == ()}
    assert {("llama", "granite"), ("llama", "smollm3"), ("mistral-nowindow", "llama")} <= exact, sorted(exact)


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
    assert family_for("gemma3") is FAMILIES["gemma3"]
    said = CliRunner().invoke(main, ["inspect", str(src)])  # the wrapper is read as its text decoder, and said so
    assert said.exit_code == 0 and said.output.count("vision tower and multi-modal projector are left out") == 1
    said = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "said")])
    assert said.exit_code == 0 and "note: " in said.output and "vision tower" in said.output, said.output
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
