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


def test_a_description_written_before_a_field_existed_takes_its_familys_value(tmp_path: Path) -> None:
    """A GPT-2 canonical checkpoint written before `conv1d_linears` (and a DeepSeek-V2 one before
    `rope.complex_product`) read the field's default: the old rounding, and its own family refused
    the export. The family's config table now gives a field the file predates."""
    import torch

    import lmconvert
    from lmconvert.convert import to_canonical

    for model_type, key in (("gpt2", ("conv1d_linears",)), ("deepseek_v2", ("rope", "complex_product"))):
        extra = dict(num_key_value_heads=4, first_k_dense_replace=2) if model_type == "deepseek_v2" else {}
        src = save_checkpoint(build_model(model_type, **extra), tmp_path / model_type / "hf")
        canonical = tmp_path / model_type / "canonical"
        to_canonical(src, canonical)
        description = canonical / "lmconvert.json"
        data = json.loads(description.read_text())
        now = lmconvert.load(canonical, dtype=torch.bfloat16).cfg
        held = data["arch"] if len(key) == 1 else data["arch"][key[0]]
        assert held.pop(key[-1]) is True  # as an older lmconvert wrote it: no such key
        description.write_text(json.dumps(data))
        assert lmconvert.load(canonical, dtype=torch.bfloat16).cfg == now
        back = tmp_path / model_type / "back"
        result = CliRunner().invoke(main, ["convert", str(canonical), str(back), "--to", "hf"])
        assert result.exit_code == 0, result.output
