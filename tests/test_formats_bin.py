"""PyTorch `.bin` checkpoints: single and sharded files, read with weights_only=True only; fp32
parity and a bit-exact safetensors export; pickles that would run code are refused unrun."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_models import build_model, token_batch
from safetensors.torch import load_file

import lmconvert
from lmconvert.cli import main
from lmconvert.convert import to_canonical, to_hf


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr


def save_bin(model: torch.nn.Module, directory: Path, shards: int = 1, extra: dict | None = None) -> Path:
    """A transformers-style .bin checkpoint: torch.save of the state dict, sharded with an index."""
    directory.mkdir()
    model.config.save_pretrained(directory)
    state = {name: t.clone() for name, t in model.state_dict().items()}
    state.update(extra or {})
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return directory
    names, weight_map = list(state), {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[i::shards]}
        torch.save(part, directory / file)
        weight_map.update(dict.fromkeys(part, file))
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model("llama", seed=3)


@pytest.mark.parametrize("shards", [1, 3])
def test_bin_parity(model: torch.nn.Module, tmp_path: Path, shards: int) -> None:
    src = save_bin(model, tmp_path / "bin", shards)
    ids = token_batch()
    with torch.no_grad():
        ref = model(ids).logits
        ours = lmconvert.load(src, attention="eager")(ids)
    assert ref.abs().max() > 1.0
    assert (ours - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("shards", [1, 3])
def test_bin_exports_bit_exact_safetensors(model: torch.nn.Module, tmp_path: Path, shards: int) -> None:
    src = save_bin(model, tmp_path / "bin", shards)
    meta = to_canonical(src, tmp_path / "can")
    assert meta.source["format"] == "hf-bin"
    to_hf(tmp_path / "can", tmp_path / "hf")
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    original = model.state_dict()
    assert set(exported) == set(original)
    for name, t in original.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name].view(torch.uint8), t.view(torch.uint8))


def test_safetensors_preferred_over_bin(model: torch.nn.Module, tmp_path: Path) -> None:
    src = save_bin(model, tmp_path / "both")
    build_model("llama", seed=4).save_pretrained(src)  # different weights, as model.safetensors
    meta = to_canonical(src, tmp_path / "can")
    assert meta.source["format"] == "hf-safetensors"


class Evil:
    """Unpickling this calls os.system: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


class Custom:
    """A harmless custom class: still needs weights_only=False to unpickle."""

    def __init__(self) -> None:
        self.step = 7


def test_malicious_pickle_is_never_executed(model: torch.nn.Module, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    src = save_bin(model, tmp_path / "evil", extra={"payload": Evil(marker)})
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2
    assert err.count("\n") == 1 and "weights_only=False" in err and "posix.system" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_custom_class_pickle_is_refused(model: torch.nn.Module, tmp_path: Path) -> None:
    src = save_bin(model, tmp_path / "custom", shards=2, extra={"trainer_state": Custom()})
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2
    assert err.count("\n") == 1 and "weights_only=False" in err and "Custom" in err
    assert "pytorch_model-0000" in err  # names the file


def test_unreadable_bin_is_one_line(model: torch.nn.Module, tmp_path: Path) -> None:
    src = save_bin(model, tmp_path / "garbage")
    (src / "pytorch_model.bin").write_bytes(b"this is not a pickle")
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "not a readable PyTorch checkpoint" in err


def test_index_listing_a_missing_tensor(model: torch.nn.Module, tmp_path: Path) -> None:
    src = save_bin(model, tmp_path / "bin", shards=2)
    index = json.loads((src / "pytorch_model.bin.index.json").read_text())
    index["weight_map"]["model.extra.weight"] = "pytorch_model-00001-of-00002.bin"
    (src / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    code, err = run("convert", src, tmp_path / "out")
    assert code == 2 and "model.extra.weight" in err
