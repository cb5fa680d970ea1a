"""A reference transformers cannot load is bad input (exit 2, one line naming it), never an
internal error: issue #28's HF index without its `metadata` object, which lmconvert reads and
transformers' loader does not."""

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
