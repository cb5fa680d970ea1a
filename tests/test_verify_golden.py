"""Golden files: `--save-golden` stores the token batch and transformers' outputs; `--golden`
checks against them in a process where importing transformers fails, as in a CI job that does
not install it; a regression is still located."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from family_specs import SPECS
from hf_models import build_model, load_reference, save_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lmconvert.cli import main
from lmconvert.convert import to_canonical

# the CLI, with every import of transformers (or accelerate) failing
WITHOUT_TRANSFORMERS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "accelerate"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from lmconvert.cli import main
main(sys.argv[1:], prog_name="lmconvert")
"""


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def without_transformers(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_TRANSFORMERS, *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("golden")
    spec = SPECS["gemma2"]
    hf = save_checkpoint(build_model(spec.model_type, **spec.kwargs), root / "hf", torch.bfloat16)
    to_canonical(hf, root / "canonical")
    return hf, root / "canonical"


def test_the_block_really_blocks(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TRANSFORMERS.replace("main(sys.argv[1:]", "import transformers"
                                                                             "; main(sys.argv[1:]")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "transformers is blocked" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_record_then_check_without_transformers(pair: tuple[Path, Path], tmp_path: Path, dtype: str) -> None:
    hf, canonical = pair
    golden = tmp_path / "golden.safetensors"
    code, out, err = cli("verify", canonical, "--dtype", dtype, "--seq-len", 20, "--generate", 6,
                         "--save-golden", golden)
    assert code == 0 and "PASS" in out and "wrote golden file" in err
    with safe_open(str(golden), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
        ids, logits = f.get_tensor("ids"), f.get_tensor("logits")
    assert meta["format"] == "lmconvert-golden" and meta["dtype"] == dtype and meta["device"] == "cpu"
    assert json.loads(meta["versions"])["transformers"] and json.loads(meta["versions"])["torch"]
    assert json.loads(meta["tolerance"])["dtype"] == dtype
    assert {"ids", "logits", "generation.sequences", "generation.logits", "points.embed", "points.layers.1",
            "points.layers.1.attn.o", "points.layers.1.mlp.down", "points.final_norm"} <= names
    assert "points.layers.1.attn.q" not in names  # wide projections are left out of the file
    # the stored logits are transformers' own on the stored ids, element for element
    with torch.no_grad():
        theirs = load_reference(hf, getattr(torch, dtype))(ids).logits
    assert torch.equal(logits, theirs)
    if dtype != "float32":
        assert "logits.fp32" in names and float(json.loads(meta["reference_error"])) > 0
        assert json.loads(meta["own_errors"])["layers.1"][0] > 0
    proc = without_transformers("verify", canonical, "--golden", golden, "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout and "golden file" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["dtype"] == dtype and report["golden"] == str(golden) and report["reference"] is None
    assert report["versions"]["reference"]["transformers"] and report["generation"]["first_difference"] is None
    assert len(report["points"]) == 2 + 2 * 3


@pytest.mark.slow
def test_golden_locates_a_regression_without_transformers(pair: tuple[Path, Path], tmp_path: Path) -> None:
    _, canonical = pair
    golden = tmp_path / "golden.safetensors"
    assert cli("verify", canonical, "--seq-len", 20, "--generate", 0, "--save-golden", golden)[0] == 0
    broken = tmp_path / "broken"
    shutil.copytree(canonical, broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["layers.1.attn_post_norm.weight"] -= 1.0  # the (1 + w) offset dropped in one norm
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    proc = without_transformers("verify", broken, "--golden", golden, "--max-memory", "1MB", "--json", "-")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    # the file keeps the residual-width points: layer 0 and layer 1's attention output still agree; the
    # MLP, which reads the wrongly normalised residual, is the first kept point to differ
    assert report["streamed"] and report["first_failure"]["layer"] == 1
    assert report["first_failure"]["name"] == "layers.1.mlp.down"
    assert all(p["passed"] for p in report["points"] if p["name"] in ("layers.0", "layers.1.attn.o"))
    # with transformers at hand, every module is a point: the norm itself is named
    code, out, _ = cli("verify", broken, "--seq-len", 20, "--generate", 0, "--json", "-")
    assert code == 1 and json.loads(out)["first_failure"]["name"] == "layers.1.attn_post_norm"


def test_golden_errors_are_one_line(pair: tuple[Path, Path], tmp_path: Path) -> None:
    _, canonical = pair
    golden = tmp_path / "golden.safetensors"
    assert cli("verify", canonical, "--dtype", "bfloat16", "--seq-len", 12, "--generate", 0,
               "--save-golden", golden)[0] == 0
    not_golden = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(not_golden))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a file at all")
    cases = [
        (("--golden", not_golden), "not an lmconvert golden file"),
        (("--golden", garbage), "not a readable safetensors file"),
        (("--golden", golden, "--dtype", "float32"), "recorded in bfloat16; pass --dtype bfloat16"),
        (("--golden", golden, "--reference", canonical), "drop --reference"),
    ]
    for args, fragment in cases:
        code, _, err = cli("verify", canonical, *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
