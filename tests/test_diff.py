"""`lmconvert diff A B` on real files in every pairing of formats the tests can make: a tiny perturbed
LLaMA as transformers saves it, its canonical conversion, the canonical's HF export and its GGUF
q8_0 export, and edited copies of them.

The Q8_0 bound: gguf (and ggml-quants.c, bit for bit) stores each block of 32 values as int8
q = round(x / d), d = max|x| / 127 in the block, and d as float16. Dequantized, an element is
d16 · q, so |x − d16·q| <= |x − d·q| + |q|·|d − d16| <= d/2 + 127 · 2^-11 · d (f16 rounds to 11
significant bits; the test model's d are far from f16's subnormals) = 0.5625 · d = 0.004429 · max|x| in
the block <= 0.004429 · max|x| of the tensor. So every quantized tensor is within
atol = Q8_0_ERROR · max|w| of its source, max|w| the checkpoint's largest weight, and never exactly
equal (a test model's random floats are not multiples of their block's d16).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from hf_models import build_model, edited_weights, make_checkpoint, save_checkpoint
from safetensors.torch import load_file
from test_formats_bin import save_bin

from lmconvert.cli import main
from lmconvert.convert import convert
from lmconvert.convert import diff as diff_module
from lmconvert.convert.diff import Tolerance, measure

Q8_0_ERROR = (0.5 + 127 * 2**-11) / 127  # of a block's max |x|: the bound above


def run(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def diffed(a: Path, b: Path, work: Path, *options: object) -> tuple[int, dict[str, Any], str, str]:
    """Exit code, the --json report, stdout and stderr of `diff A B`."""
    report = work / f"diff-{len(list(work.glob('diff-*.json')))}.json"
    code, out, err = run("diff", a, b, "--json", report, *options)
    assert code in (0, 1), err
    return code, json.loads(report.read_text()), out, err


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {t["name"]: t["status"] for t in report["tensors"]}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same model six ways: as transformers saved it (safetensors, and pytorch_model.bin), canonical,
    the canonical's HF, Meta and GGUF q8_0 exports."""
    root = tmp_path_factory.mktemp("diff")
    paths = {"hf": make_checkpoint(root / "hf", "llama"), "canonical": root / "canonical",
             "bin": save_bin(build_model("llama"), root / "bin"),
             "export": root / "export", "meta": root / "meta", "gguf": root / "m.gguf"}
    convert(paths["hf"], paths["canonical"], "canonical")
    convert(paths["canonical"], paths["export"], "hf")
    convert(paths["canonical"], paths["meta"], "meta")
    convert(paths["canonical"], paths["gguf"], "gguf", quant="q8_0")
    return paths


@pytest.fixture(scope="module")
def canonical_tensors(models: dict[str, Path]) -> dict[str, torch.Tensor]:
    return load_file(models["canonical"] / "model.safetensors")


FORMATS = {"hf": "hf-safetensors", "bin": "hf-bin", "canonical": "canonical", "export": "hf-safetensors",
           "meta": "meta"}


@pytest.mark.parametrize(("a", "b"), [("canonical", "export"), ("hf", "canonical"), ("export", "hf"),
                                      ("bin", "canonical"), ("canonical", "meta"), ("meta", "bin")])
def test_a_checkpoint_and_its_conversions_are_identical(models: dict[str, Path], canonical_tensors: dict[str, Any],
                                                       a: str, b: str, tmp_path: Path) -> None:
    code, report, out, _ = diffed(models[a], models[b], tmp_path)
    assert code == 0 and report["passed"]
    assert (report["a"]["format"], report["b"]["format"]) == (FORMATS[a], FORMATS[b])
    assert statuses(report) == dict.fromkeys(canonical_tensors, "identical")
    assert all(t["bits_identical"] and t["max_abs"] == 0 and t["rel"] == 0 for t in report["tensors"])
    n = len(canonical_tensors)
    assert report["summary"] == {"identical": n, "within_tolerance": 0, "different": 0, "only_in_A": 0,
                                 "only_in_B": 0}
    assert f"{n} tensors: {n} identical, 0 within tolerance, 0 different" in out and "verdict: SAME" in out


def test_gguf_q8_0_export_is_within_the_quantization_error(models: dict[str, Path],
                                                           canonical_tensors: dict[str, torch.Tensor],
                                                           tmp_path: Path) -> None:
    """Strict (the default): every quantized tensor differs, exit 1. Within Q8_0's bound: exit 0, the
    F32 ones (norms) bit for bit, each quantized one within the bound of its own largest value."""
    code, strict, _, err = diffed(models["canonical"], models["gguf"], tmp_path)
    assert code == 1 and not strict["passed"]
    matrices = {n for n, t in canonical_tensors.items() if t.dim() == 2}
    assert matrices and {n for n, s in statuses(strict).items() if s == "different"} == matrices
    assert "differ:" in err and f"{len(matrices)} different" in err and len(err.strip().splitlines()) == 1

    atol = Q8_0_ERROR * max(float(t.abs().max()) for t in canonical_tensors.values())
    code, report, out, _ = diffed(models["canonical"], models["gguf"], tmp_path, "--atol", atol)
    assert code == 0 and report["passed"], out
    assert report["b"]["format"] == "gguf" and report["tolerance"]["atol"] == atol
    for tensor in report["tensors"]:
        source = canonical_tensors[tensor["name"]]
        assert tensor["a"] == {"shape": list(source.shape), "dtype": "float32"}
        if tensor["name"] in matrices:
            assert tensor["status"] == "within tolerance" and tensor["b"]["dtype"] == "Q8_0"
            assert 0 < tensor["max_abs"] <= Q8_0_ERROR * float(source.abs().max()), tensor
            assert 0 < tensor["rel"] < 0.01 and not tensor["bits_identical"]
        else:
            assert tensor["status"] == "identical" and tensor["b"]["dtype"] == "F32", tensor
    # GGUF stores float metadata as float32: the one config difference, said so
    assert report["config_differences"] == {"norm.eps": {"a": 1e-6, "b": float(torch.tensor(1e-6).item())}}
    assert "norm.eps" in out and "the same float32" in out


def test_a_perturbed_tensor_is_the_one_reported(models: dict[str, Path], canonical_tensors: dict[str, Any],
                                                tmp_path: Path) -> None:
    """One element of one HF tensor moved by 1e-3: that canonical tensor, and only it, differs, in both
    directions; --atol above the change accepts it."""
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.1.mlp.down_proj.weight"][3, 5] += 1e-3

    edited = edited_weights(models["hf"], tmp_path / "edited", edit)
    change = float(load_file(edited / "model.safetensors")["model.layers.1.mlp.down_proj.weight"][3, 5]
                   - canonical_tensors["layers.1.mlp.down.weight"][3, 5])
    for a, b in ((models["canonical"], edited), (edited, models["canonical"])):
        code, report, out, err = diffed(a, b, tmp_path)
        assert code == 1, out
        expected = dict.fromkeys(canonical_tensors, "identical") | {"layers.1.mlp.down.weight": "different"}
        assert statuses(report) == expected
        (row,) = (t for t in report["tensors"] if t["status"] == "different")
        assert row["max_abs"] == pytest.approx(abs(change), rel=1e-6) and row["outside_tolerance"] == 1
        assert row["a"] == row["b"] == {"shape": [64, 96], "dtype": "float32"}
        assert err.strip() == f"lmconvert: error: {a} and {b} differ: 1 different; criterion: equal values " \
                              "(atol 0, rtol 0)"
    code, report, _, _ = diffed(models["canonical"], edited, tmp_path, "--atol", 2e-3)
    assert code == 0 and statuses(report)["layers.1.mlp.down.weight"] == "within tolerance"
    # relative: rtol 1e-4 of a weight this size (|w| < 10) is below the 1e-3 change
    code, report, _, _ = diffed(models["canonical"], edited, tmp_path, "--rtol", 1e-4)
    assert code == 1


def test_tensors_only_one_side_has(tmp_path: Path) -> None:
    """An untied head only in A; attention biases only in B. Neither is read, both fail the diff."""
    a = make_checkpoint(tmp_path / "a", "llama", tie_word_embeddings=False)
    b = make_checkpoint(tmp_path / "b", "llama", tie_word_embeddings=True, attention_bias=True)
    code, report, out, err = diffed(a, b, tmp_path)
    assert code == 1
    only_a = {t["name"] for t in report["tensors"] if t["status"] == "only in A"}
    only_b = {t["name"] for t in report["tensors"] if t["status"] == "only in B"}
    assert only_a == {"lm_head.weight"}
    assert only_b == {f"layers.{i}.attn.{p}.bias" for i in range(2) for p in "qkvo"}
    head = next(t for t in report["tensors"] if t["name"] == "lm_head.weight")
    assert head["a"] == {"shape": [128, 64], "dtype": "float32"} and head["b"] is None and head["max_abs"] is None
    assert report["summary"]["only_in_A"] == 1 and report["summary"]["only_in_B"] == 8
    assert {"tie_embeddings", "q_bias", "o_bias"} <= set(report["config_differences"])
    assert "1 only in A, 8 only in B" in err


def test_mismatched_shapes(tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "a", "llama")
    b = make_checkpoint(tmp_path / "b", "llama", intermediate_size=128)
    code, report, out, _ = diffed(a, b, tmp_path)
    assert code == 1
    mlp = {t["name"]: t for t in report["tensors"] if ".mlp." in t["name"] and "norm" not in t["name"]}
    assert len(mlp) == 6
    for name, row in mlp.items():
        assert row["status"] == "different" and row["note"] == "shapes differ" and row["max_abs"] is None
        want = ([96, 64], [128, 64]) if "down" not in name else ([64, 96], [64, 128])
        assert (row["a"]["shape"], row["b"]["shape"]) == want
    assert report["config_differences"] == {"d_ff": {"a": 96, "b": 128}}
    assert "different (shapes differ)" in out


@pytest.mark.parametrize("which", ["a", "b"])
def test_bad_paths_are_one_line_exit_2(models: dict[str, Path], which: str, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for bad, said in ((tmp_path / "missing", "does not exist; give the path of a checkpoint"),
                      (tmp_path / "empty", "not a checkpoint in a supported format")):
        args = (bad, models["canonical"]) if which == "a" else (models["canonical"], bad)
        code, out, err = run("diff", *args, "--json", tmp_path / "r.json")
        assert code == 2 and err.startswith(f"lmconvert: error: {bad}: {said}"), err
        assert len(err.strip().splitlines()) == 1 and not out and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("args", "fragment"), [(["--atol", "-1"], "--atol -1.0: must be a finite number"),
                                                (["--rtol", "nan"], "--rtol nan: must be a finite number")])
def test_bad_tolerances(models: dict[str, Path], args: list[str], fragment: str) -> None:
    code, _, err = run("diff", models["canonical"], models["export"], *args)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_json_never_over_an_input(models: dict[str, Path], tmp_path: Path) -> None:
    """--json inside an input, an input itself, or a directory holding one is refused before
    anything is read; an existing file only with --force, and only a diff report."""
    gguf_before = models["gguf"].read_bytes()
    refusals = ((models["canonical"] / "report.json", "the output may not be the input or inside the input"),
                (models["gguf"], "the output may not be the input"),
                (models["canonical"].parent, "holds the input"))
    for target, said in refusals:
        code, out, err = run("diff", models["canonical"], models["gguf"], "--json", target)
        assert code == 2 and f"--json {target}: {said}" in err and len(err.strip().splitlines()) == 1, err
        assert not out
    assert not (models["canonical"] / "report.json").exists() and models["gguf"].read_bytes() == gguf_before

    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": true}\n')
    code, _, err = run("diff", models["canonical"], models["export"], "--json", mine)
    assert code == 2 and "already exists; pass --force" in err
    code, _, err = run("diff", models["canonical"], models["export"], "--json", mine, "--force")
    assert code == 2 and "is not a file lmconvert wrote" in err and json.loads(mine.read_text()) == {"mine": True}
    report = tmp_path / "r.json"
    assert run("diff", models["canonical"], models["export"], "--json", report)[0] == 0
    assert run("diff", models["canonical"], models["gguf"], "--json", report, "--force")[0] == 1
    assert json.loads(report.read_text())["b"]["path"] == str(models["gguf"])  # replaced by the second


def test_json_to_stdout(models: dict[str, Path]) -> None:
    code, out, _ = run("diff", models["hf"], models["export"], "--json", "-")
    report = json.loads(out)  # the JSON alone
    assert code == 0 and report["schema"] == "lmconvert.diff/1" and report["passed"]
    assert report["a"] == {"path": str(models["hf"]), "format": "hf-safetensors"}


def test_help_lists_diff() -> None:
    code, out, _ = run("--help")
    assert code == 0 and "diff" in out and "comparison (diff)" in out
    code, out, _ = run("diff", "--help")
    assert code == 0 and "--atol" in out and "--rtol" in out and "--json" in out


def _reference(x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float) -> tuple[float, float, int]:
    """The same three numbers, computed on whole float64 tensors by the definitions."""
    p, q = x.double(), y.double()
    same = (p == q) | (p.isnan() & q.isnan())
    delta = torch.where(same, torch.zeros(()), (p - q).abs())
    outside = int((~same & ~(delta <= atol + rtol * torch.maximum(p.abs(), q.abs()))).sum())
    finite = lambda t: t[t.isfinite()]  # noqa: E731
    norm = max(float(finite(p).norm()), float(finite(q).norm()))
    return float(delta.max()), float(finite(delta).norm()) / norm, outside


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_comparison_in_slices_is_the_comparison_of_the_whole(dtype: torch.dtype,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory stays bounded because a pair is compared a few rows at a time: with slices of 7 elements
    (rows of 3), the numbers are those of the whole tensors, infinities and NaNs included."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, generator=generator).to(dtype)
    y = (x.float() + 1e-3 * torch.randn(50, 3, generator=generator)).to(dtype)
    x[4, 1] = y[4, 1] = math.inf  # equal infinities: equal
    x[9, 0] = y[9, 0] = math.nan  # NaN facing NaN: equal
    expected = _reference(x, y, 1e-3, 1e-2)
    monkeypatch.setattr(diff_module, "SLICE", 7)
    got = measure(x, y, Tolerance(1e-3, 1e-2))
    assert got[0] == pytest.approx(expected[0], rel=1e-6) and got[1] == pytest.approx(expected[1], rel=1e-6)
    assert got[2] == expected[2] > 0
    y[20, 2] = math.nan  # NaN facing a number: not within any tolerance, and max |Δ| says so
    got = measure(x, y, Tolerance(1.0, 1.0))
    assert math.isnan(got[0]) and got[2] == 1


def test_a_mixture_of_experts_reads_each_stored_tensor_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Experts come from one tensor per layer in transformers 5's layout (`gate_up_proj`) and in GGUF
    (`ffn_gate_exps`, ...), and one tensor each in a canonical checkpoint: compared expert by expert,
    each stored tensor is still read once, not once per expert (the readers are wrapped to count
    their reads; what they read is theirs)."""
    from lmconvert.formats.gguf import GgufFile
    from lmconvert.formats.safetensors_dir import TensorSource

    model = build_model("mixtral", num_local_experts=4, num_experts_per_tok=2)  # llama.cpp has no windows
    fused = save_checkpoint(model, tmp_path / "fused", save_original_format=False)
    convert(fused, tmp_path / "canonical", "canonical")
    convert(tmp_path / "canonical", tmp_path / "m.gguf", "gguf", quant="f32")
    reads: Counter[tuple[str, str]] = Counter()
    for cls, method in ((TensorSource, "get"), (GgufFile, "read")):
        original = getattr(cls, method)

        def counted(self: Any, name: str, original: Any = original) -> torch.Tensor:  # noqa: ANN401
            reads[str(getattr(self, "directory", getattr(self, "path", ""))), name] += 1
            return original(self, name)

        monkeypatch.setattr(cls, method, counted)
    for a, b in (("canonical", "fused"), ("canonical", "m.gguf"), ("m.gguf", "fused")):
        reads.clear()
        code, report, out, _ = diffed(tmp_path / a, tmp_path / b, tmp_path)
        assert code == 0 and set(statuses(report).values()) == {"identical"}, out
        assert sum(".experts.3." in t["name"] for t in report["tensors"]) == 6  # gate, up, down in both layers
        assert max(reads.values()) == 1, [k for k, n in reads.items() if n > 1]
        assert any("gate_up_proj" in name or "ffn_gate_exps" in name for _, name in reads)
