"""MiniCPM3 beyond what every family gets in test_families.py (its SPECS entry: fp32 and bf16 parity,
cached decoding, round trip, both config styles, card, export matrix, verify's points): longrope past
its original length, `verify` locating a broken MLA projection by name, the golden file, the exact
`scale_depth` on export, and the card of a MiniCPM3-4B-shaped config."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from family_specs import FP32_TOL, IDS, SPECS
from hf_models import (
    build_model,
    cached_logits,
    check_streamed_verify,
    incremental,
    load_reference,
    save_checkpoint,
)
from safetensors.torch import load_file, save_file
from test_verify_golden import without_transformers
from transformers import AutoConfig, AutoModelForCausalLM

import lmconvert
from lmconvert.arch.describe import variants
from lmconvert.cli import main
from lmconvert.convert import to_canonical
from lmconvert.mappings import family_for

SPEC = SPECS["minicpm3"]
LONG = {**SPEC.kwargs, "rope_parameters": {**SPEC.kwargs["rope_parameters"], "original_max_position_embeddings": 16}}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """(HF directory, canonical directory): "short" is the SPECS model, "long" the same with
    longrope's original length 16, below the 28 tokens of IDS."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in cache:
            root = tmp_path_factory.mktemp(f"minicpm3-{name}")
            hf = save_checkpoint(build_model("minicpm3", **(LONG if name == "long" else SPEC.kwargs)), root / "hf")
            to_canonical(hf, root / "canonical")
            cache[name] = hf, root / "canonical"
        return cache[name]

    return get


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


# ----------------------------------------------------------------------------- longrope's long regime
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_past_the_original_length_matches_transformers(made: Callable[[str], tuple[Path, Path]],
                                                        attention: str) -> None:
    hf, canonical = made("long")
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(hf, attn_implementation=attention).eval()
        expected = theirs(IDS).logits
        first = theirs(IDS[:, :16]).logits  # within the original length: the short factors
        assert max_abs(first, expected[:, :16]) > 1e-3  # the long factors changed the first 16 too
        assert max_abs(lmconvert.load(canonical, attention=attention)(IDS), expected) <= FP32_TOL


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_cached_decoding_switches_factors_per_call(made: Callable[[str], tuple[Path, Path]], attention: str) -> None:
    """A prefill of 6 and steps up to position 16 rotate with the short factors, later steps with the
    long ones while the cache keeps the latent keys as they were rotated: transformers' cached
    decoding, step for step (so not the full forward, which is long all along)."""
    hf, _ = made("long")
    model = lmconvert.load(hf, attention=attention)
    theirs = AutoModelForCausalLM.from_pretrained(hf, attn_implementation=attention).eval()
    cache = model.new_cache()
    with torch.no_grad():
        ours = incremental(lambda chunk: model(chunk, cache=cache), IDS, 6)
        reference = cached_logits(theirs, IDS, 6)
        assert max_abs(ours, reference) <= FP32_TOL
        assert max_abs(ours, model(IDS)) > 1e-3


# ----------------------------------------------------------------------------- verify names the MLA point
def reversed_rows(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name].flip(0).contiguous()
    return edit


def swapped_latent(tensors: dict[str, torch.Tensor]) -> None:
    """kv_a's rows read as [k_rot | c_kv] instead of [c_kv | k_rot]."""
    t = tensors["layers.1.attn.kv_a.weight"]
    tensors["layers.1.attn.kv_a.weight"] = torch.cat((t[16:], t[:16])).contiguous()


@pytest.mark.parametrize(("point", "edit"), [
    ("attn.q_a", reversed_rows("layers.1.attn.q_a.weight")),
    ("attn.kv_a", swapped_latent),
    ("attn.kv_b", reversed_rows("layers.1.attn.kv_b.weight")),
], ids=["q_a", "kv_a", "kv_b"])
def test_verify_names_the_broken_mla_projection(point: str, edit: Callable[[dict[str, torch.Tensor]], None],
                                                made: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    hf, canonical = made("short")
    broken = tmp_path / "broken"
    shutil.copytree(canonical, broken)
    tensors = load_file(broken / "model.safetensors")
    edit(tensors)
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["verify", str(broken), "--reference", str(hf), "--seq-len", "20",
                                       "--generate", "0", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["first_failure"]["name"] == f"layers.1.{point}"
    names = [p["name"] for p in report["points"]]
    assert all(p["passed"] and p["max_abs"] == 0.0 for p in report["points"][:names.index(f"layers.1.{point}")])


# ----------------------------------------------------------------------------- golden file
@pytest.mark.slow
def test_golden_file_checks_without_transformers(made: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    _, canonical = made("short")
    golden = tmp_path / "golden.safetensors"
    result = CliRunner().invoke(main, ["verify", str(canonical), "--seq-len", "20", "--generate", "6",
                                       "--save-golden", str(golden)])
    assert result.exit_code == 0, result.output
    proc = without_transformers("verify", canonical, "--golden", golden, "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["reference"] is None and report["max_abs"] == 0.0
    assert report["generation"]["first_difference"] is None


# ----------------------------------------------------------------------------- config
def test_export_writes_back_the_stated_scale_depth() -> None:
    """scale_depth / sqrt(6) * sqrt(6) is not 1.4 in floating point: export finds the value that
    transformers turns into the same residual scale, which is the one the file stated."""
    assert 1.4 / math.sqrt(6) * math.sqrt(6) != 1.4
    family = family_for("minicpm3")
    config = AutoConfig.for_model("minicpm3", num_hidden_layers=6, scale_depth=1.4, dim_model_base=48,
                                  hidden_size=64, num_attention_heads=4,
                                  num_key_value_heads=4).to_dict()
    written = family.to_hf(family.from_hf(config))
    assert written["scale_depth"] == 1.4 and written["dim_model_base"] == 48
    assert family.from_hf(written) == family.from_hf(config)


def test_inspect_of_a_minicpm3_4b_shaped_config() -> None:
    """MiniCPM3-4B's sizes (transformers' defaults): 256 + 32 cached entries against 40 heads x
    (96 + 64), in 62 layers."""
    cfg = family_for("minicpm3").arch_config({"model_type": "minicpm3"})
    lines = variants(cfg)
    assert "latent KV cache: 288 entries per token and layer (c_kv 256 + k_rot 32); MHA with these heads: 6400; " \
           "4.5% of it" in lines
    assert "LM-head input divided by 10" in lines and "embedding scale: 12 (rounded to weight dtype)" in lines
    assert f"residual scale: {1.4 / math.sqrt(62):g} (each sublayer's output)" in lines
    assert cfg.kv_cache_bytes_per_token(2) == 62 * 288 * 2


def test_inspect_prints_the_latent_cache_of_a_checkpoint(made: Callable[[str], tuple[Path, Path]]) -> None:
    result = CliRunner().invoke(main, ["inspect", str(made("short")[0])])
    assert result.exit_code == 0, result.output
    assert "latent KV cache: 24 entries per token and layer" in result.output
    assert "KV cache          192 bytes per token (float32)" in result.output


def test_the_reference_really_scales(made: Callable[[str], tuple[Path, Path]]) -> None:
    """The three multipliers are not 1 in the SPECS model (so its parity tests cover them)."""
    model = load_reference(made("short")[0])
    assert model.config.logits_scaling == 64 / 24 and model.model.embed_tokens.scalar_embed_scale == 12
    assert model.model.layers[0].residual_scale == 1.4 / math.sqrt(2)



def test_verify_with_max_memory_streams_both_sides(made: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    """Streamed verification (one block at a time on both sides) of the canonical checkpoint."""
    _, canonical = made("short")
    # embed, final norm; per layer 12 modules and the output
    assert check_streamed_verify(canonical, tmp_path) == 2 + 2 * 13
