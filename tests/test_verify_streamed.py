"""Models larger than memory: the canonical side streamed one block at a time equals the in-memory
Decoder bit for bit (forward, hidden states, cached generation), and `--max-memory` runs both
sides capped (transformers through accelerate's disk offload). Also: a Meta-format source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from family_specs import SPECS
from hf_models import build_model, save_checkpoint, token_batch

import lmconvert
from lmconvert.cli import main
from lmconvert.convert import to_canonical
from lmconvert.formats.canonical import META_FILE
from lmconvert.runtime.streamed import StreamedDecoder, streamed
from lmconvert.verify.agreement import greedy
from lmconvert.verify.trace import our_trace

IDS = token_batch(seq=20)


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """gemma2 (tied, soft-capped, sandwich norms) as HF and canonical; llama untied with biases; gpt2,
    whose Conv1D linears hold their weights [in, out] once loaded and copy a streamed [out, in] one at
    each call: the same bits either way."""
    root = tmp_path_factory.mktemp("streamed")
    spec = SPECS["gemma2"]
    out = {"gemma2-hf": save_checkpoint(build_model(spec.model_type, **spec.kwargs), root / "gemma2")}
    out["gemma2-canonical"] = root / "gemma2-canonical"
    to_canonical(out["gemma2-hf"], out["gemma2-canonical"])
    out["llama-hf"] = save_checkpoint(build_model("llama", **SPECS["llama"].kwargs), root / "llama")
    out["gpt2-hf"] = save_checkpoint(build_model("gpt2", **SPECS["gpt2"].kwargs), root / "gpt2")
    return out


@pytest.mark.parametrize("name", ["gemma2-hf", "gemma2-canonical", "llama-hf", "gpt2-hf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_streamed_forward_is_bit_identical(checkpoints: dict[str, Path], name: str, dtype: torch.dtype) -> None:
    path = checkpoints[name]
    model = lmconvert.load(path, dtype=dtype, attention="eager")
    with streamed(path, dtype) as stream:
        assert torch.equal(stream(IDS), model(IDS))
        ours, reference = our_trace(stream.model, stream, IDS), our_trace(model, model, IDS)
        assert list(ours.points) == list(reference.points)
        assert all(torch.equal(ours.points[k], reference.points[k]) for k in ours.points)
        assert torch.equal(greedy(stream, IDS[:1, :6], 8)[0], model.generate(IDS[:1, :6], 8))
        # nothing stays loaded between calls: every parameter is back on the meta device
        assert all(p.is_meta for p in stream.model.parameters())


def test_streamed_reports_missing_tensors(checkpoints: dict[str, Path]) -> None:
    from lmconvert.formats.errors import InputError
    from lmconvert.runtime.streamed import open_weights

    with open_weights(checkpoints["llama-hf"]) as (arch, weights):
        del weights["layers.1.mlp.up.weight"]
        with pytest.raises(InputError, match="layers.1.mlp.up.weight"):
            StreamedDecoder(arch, weights, None)


def test_max_memory_runs_both_sides_capped(checkpoints: dict[str, Path], tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    code, out, err = cli("verify", checkpoints["gemma2-canonical"], "--max-memory", "20KB", "--seq-len", 16,
                         "--generate", 4, "--json", tmp_path / "r.json")
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["streamed"] and report["max_memory"] == 20_000 and report["max_abs"] == 0.0
    assert all(p["max_abs"] == 0.0 for p in report["points"]) and len(report["points"]) == 2 + 2 * 12
    assert "streamed block by block" in out
    assert "offloaded to the disk" in caplog.text  # accelerate placed transformers' weights on disk
    code, _, err = cli("verify", checkpoints["gemma2-canonical"], "--max-memory", "lots")
    assert code == 2 and "--max-memory 'lots'" in err


def test_meta_format_source_asks_for_a_reference(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    canonical = tmp_path / "from-meta"
    shutil.copytree(checkpoints["gemma2-canonical"], canonical)
    meta = json.loads((canonical / META_FILE).read_text())
    meta["source"] = {"path": str(tmp_path / "llama-2-7b"), "format": "meta"}
    (canonical / META_FILE).write_text(json.dumps(meta))
    code, _, err = cli("verify", canonical)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "Meta's format" in err and "--reference HF_DIR" in err
    code, out, err = cli("verify", canonical, "--reference", checkpoints["gemma2-hf"], "--seq-len", 12)
    assert code == 0 and "PASS" in out, err


@pytest.mark.parametrize("device, fragment", [("meta", "verify runs on cpu or cuda"), ("nonsense:x", "not a torch"),
                                              ("cuda:99", "--device cuda:99")])
def test_bad_device_is_one_line(checkpoints: dict[str, Path], device: str, fragment: str) -> None:
    code, _, err = cli("verify", checkpoints["gemma2-canonical"], "--device", device)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
