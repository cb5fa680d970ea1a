"""The progress line (lmconvert/cli/progress.py): bytes, bytes/s and time left for `convert` (and `pull`,
in test_pull.py), layers for `verify`; drawn on a terminal only. The counts it is fed are checked
against what the files written hold and against the layers both models run."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from bad_input import lmconvert
from hf_models import make_checkpoint
from safetensors import safe_open
from terminal import run_in_terminal

from lmconvert.cli.progress import BYTES, LAYERS, ProgressLine, render, size
from lmconvert.convert import convert


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_how_much_how_fast_and_how_long() -> None:
    assert (render("converting x", BYTES, 1_230_000_000, 2_470_000_000, 2.0)
            == "converting x: 1.23 GB of 2.47 GB (49%), 615.00 MB/s, 0:02 left")
    assert render("converting x", BYTES, 2_470_000_000, 2_470_000_000, 125.0).endswith("(100%), 19.76 MB/s, 2:05 taken")
    assert render("verifying: lmconvert, float32", LAYERS, 12, 30, 4.0) == \
        "verifying: lmconvert, float32: 12 of 30 layers (40%), 3.0 layers/s, 0:06 left"
    # too early to tell a rate; nothing to count yet; a count past its total
    assert render("x", BYTES, 1000, 5000, 0.2) == "x: 1.00 kB of 5.00 kB (20%)"
    assert render("x", BYTES, 0, 0, 3.0) == "x: 0 B of 0 B"
    assert render("x", LAYERS, 7, 5, 1.0).startswith("x: 7 of 7 layers (100%)")
    assert size(999) == "999 B" and size(1_000_000) == "1.00 MB" and size(3.2e12) == "3.20 TB"


def test_the_line_is_redrawn_in_place_at_most_every_tenth_of_a_second() -> None:
    stream, clock = Terminal(), Clock()
    line = ProgressLine(stream, clock)
    update = line.stage("converting x")
    update(100, 1000)
    clock.now += 0.05
    update(200, 1000)  # too soon: not drawn
    clock.now += 0.06
    update(300, 1000)
    clock.now += 0.01
    update(1000, 1000)  # the end is always drawn
    line.close()
    assert stream.getvalue().split("\r")[1:] == [
        "converting x: 100 B of 1.00 kB (10%)\x1b[K", "converting x: 300 B of 1.00 kB (30%)\x1b[K",
        "converting x: 1.00 kB of 1.00 kB (100%)\x1b[K\n"]


def test_nothing_is_drawn_off_a_terminal() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream)
    line.stage("x")(5, 5)
    line.close()
    assert stream.getvalue() == ""


def _written_bytes(out: Path, to: str) -> int:
    """What the tensors written take, read back from the files."""
    if to == "gguf":
        from gguf import GGUFReader

        return sum(int(t.n_bytes) for t in GGUFReader(out).tensors)
    if to == "meta":
        return sum(t.nbytes for f in out.glob("consolidated.*.pth")
                   for t in torch.load(f, weights_only=True).values())
    total = 0
    for f in out.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            total += sum(st.get_tensor(n).nbytes for n in st.keys())  # noqa: SIM118 - safe_open has no __iter__
    return total


@pytest.mark.parametrize(("to", "out_name", "extra"), [
    ("canonical", "can", {"max_shard_bytes": 20_000}), ("hf", "hf", {}), ("gguf", "m.gguf", {}),
    ("meta", "meta", {"shards": 2}),
])
def test_conversions_count_every_byte_they_write(tmp_path: Path, to: str, out_name: str, extra: dict) -> None:
    src = make_checkpoint(tmp_path / "src", "llama")
    seen: list[tuple[int, int]] = []
    out = tmp_path / out_name
    convert(src, out, to, progress=lambda done, total: seen.append((done, total)), **extra)
    written = _written_bytes(out, to)
    assert seen[-1] == (written, written)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and {t for _, t in seen} == {written}


def test_convert_draws_its_line_on_a_terminal_only(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "llama")
    proc, lines = run_in_terminal("convert", src, tmp_path / "can")
    assert proc.returncode == 0, proc.stderr
    written = _written_bytes(tmp_path / "can", "canonical")
    assert lines[-1].startswith(f"converting src: {size(written)} of {size(written)} (100%)"), lines
    assert proc.stdout == f"wrote {tmp_path / 'can'}\n"
    piped = lmconvert("convert", src, tmp_path / "again")
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verify_counts_the_layers_both_models_run(tmp_path: Path, dtype: str) -> None:
    """Each side runs its stack once on the batch and once per generated token; a low-precision
    reference runs once more in fp32. The count comes from the blocks' own forward calls."""
    from lmconvert.verify.run import verify

    src = make_checkpoint(tmp_path / "src", "llama")
    seen: dict[str, list[tuple[int, int]]] = {}

    def stages(label: str):  # noqa: ANN202
        seen[label] = []
        return lambda done, total: seen[label].append((done, total))

    report = verify(src, dtype=dtype, generate=3, stages=stages)
    assert report.passed
    layers = 2  # hf_models' tiny llama
    runs = {f"transformers, {dtype}": layers * 4, f"lmconvert, {dtype}": layers * 4}
    if dtype != "float32":
        runs["transformers, float32 (its own error)"] = layers
    assert list(seen) == [*(k for k in runs if k.startswith("transformers")), f"lmconvert, {dtype}"]
    for label, total in runs.items():
        assert seen[label] == [(i, total) for i in range(total + 1)], label


@pytest.mark.slow  # 7 s: a whole verify through a terminal
def test_verify_draws_layers_on_a_terminal(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "llama")
    proc, lines = run_in_terminal("verify", src, "--generate", "2")
    assert proc.returncode == 0, proc.stderr
    assert any(x.startswith("verifying: transformers, float32: 6 of 6 layers (100%)") for x in lines), lines
    assert any(x.startswith("verifying: lmconvert, float32: 6 of 6 layers (100%)") for x in lines), lines
    assert "PASS" in proc.stdout
