"""Issue #28 round three, inputs that failed as internal errors: a reference transformers cannot load is
bad input (exit 2, one line naming it), as an HF index without its `metadata` object, which lmconvert
reads and transformers' loader does not; and a source cut while it is read."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from hf_models import build_model, save_checkpoint

from lmconvert.cli import main


def test_an_index_without_metadata_converts_and_verify_names_the_reference(tmp_path: Path) -> None:
    src = save_checkpoint(build_model("llama"), tmp_path / "hf", max_shard_size="100KB")
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["metadata"]
    index_path.write_text(json.dumps(index))
    converted = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "canon")])
    assert converted.exit_code == 0, converted.output
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "canon")])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and str(src) in line and "metadata" in line and "--reference" in line, line


def test_a_source_cut_while_converted_is_bad_input_and_leaves_nothing(tmp_path: Path) -> None:
    """#28: a safetensors file cut by another process after its header was checked (here between
    opening the checkpoint and converting it) read short inside a tensor, and numpy's complaint about
    the odd-sized chunk was an internal error; it is the file's fault, named, and nothing is left."""
    from lmconvert.convert import to_canonical
    from lmconvert.formats.checkpoint import open_checkpoint
    from lmconvert.formats.errors import InputError

    src = save_checkpoint(build_model("llama"), tmp_path / "hf")
    weights = src / "model.safetensors"
    out = tmp_path / "out"
    with open_checkpoint(src) as checkpoint:
        with weights.open("r+b") as file:
            file.truncate(weights.stat().st_size - 3)  # inside the last tensor, off any element boundary
        try:
            to_canonical(checkpoint, out)
        except InputError as exc:
            assert str(weights) in str(exc) and "ends inside a tensor" in str(exc)
        else:
            raise AssertionError("a cut file converted")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["hf"]
