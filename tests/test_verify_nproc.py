"""`lmconvert verify --nproc N`: torchrun launched by lmconvert, whose exit status is lmconvert's (0 pass,
1 parity failure, 2 bad input, 3 a bug) where torchrun's is 1 for any failed rank, with rank 0's report or
one-line error and none of torchrun's own output. A rank count the model cannot be split over is refused
from its config alone, before torchrun starts; under torchrun itself every rank refuses it before the
process group, the reference or any weight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bad_input import assert_clean_failure, lmconvert
from hf_models import build_model, edited_weights, save_checkpoint
from tp_ranks import cannot_spawn

import lmconvert.runtime.tensor_parallel as tensor_parallel
import lmconvert.verify.parallel as parallel
from lmconvert.arch import ConfigError
from lmconvert.cli.torchrun import BUG, outcome
from lmconvert.convert.ingest import to_canonical


@pytest.fixture(scope="module")
def canonical(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A perturbed tiny LLaMA: 4 heads, 2 KV heads, d_ff 96, vocabulary 128."""
    tmp = tmp_path_factory.mktemp("nproc")
    hf = save_checkpoint(build_model("llama"), tmp / "hf")
    to_canonical(hf, tmp / "canonical")
    return tmp / "canonical"


def nproc(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m lmconvert ARGS` as a user runs it (this worktree's lmconvert)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "lmconvert", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=240)


def test_a_split_that_cannot_be_is_refused_before_torchrun_starts(canonical: Path, tmp_path: Path) -> None:
    """3 ranks over 4 heads: exit 2, one line naming the counts that split, before any process is
    launched; the reference was not recorded (--save-golden would have written it first)."""
    golden = tmp_path / "golden.pt"
    result = lmconvert("verify", canonical, "--nproc", "3", "--save-golden", golden)
    assert_clean_failure(result, "tensor parallelism over 3 ranks: n_heads=4 does not divide by 3 ranks",
                         "run with 2 or 4 ranks, or on one process", out=golden)
    assert result.stdout == ""


def test_nproc_with_files_is_a_usage_error(canonical: Path) -> None:
    assert_clean_failure(lmconvert("verify", canonical, "--nproc", "2", "--files"),
                         "--nproc does not apply with --files")


def test_nproc_under_torchrun_is_refused(canonical: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert_clean_failure(lmconvert("verify", canonical, "--nproc", "2"), "--nproc launches torchrun itself")


def test_every_rank_refuses_the_split_before_the_group_and_the_reference(
        canonical: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `torchrun --nproc-per-node 3` (its variables, here in one process): the refusal comes from
    the config, before the process group starts or rank 0 records anything."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran before the split was checked")

    monkeypatch.setattr(tensor_parallel, "device_mesh", never)
    monkeypatch.setattr(parallel, "expected_of", never)
    with pytest.raises(ConfigError, match="n_heads=4 does not divide by 3 ranks") as info:
        parallel.verify(canonical)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("codes", "first", "torchrun_code", "expected"), [
    ({0: 0, 1: 0}, None, 0, (0, 0)),
    ({0: 1, 1: 0}, 0, 1, (1, 0)),  # rank 0's verdict
    ({0: 2, 1: 2}, 1, 1, (2, 0)),  # raised on every rank: rank 0 speaks, whichever left first
    ({0: None, 1: 2}, 1, 1, (2, 1)),  # rank 1 failed first and torchrun stopped rank 0
    ({0: None, 1: 3, 2: 2}, 2, 1, (2, 2)),  # the first rank to fail
    ({0: 0, 1: 3}, 1, 1, (3, 1)),  # rank 0 passed, rank 1 crashed in its own way
    ({0: 3, 1: 3}, 1, 1, (3, 1)),  # rank 1 crashed first, breaking rank 0's collective: rank 1 says why
    ({0: 3, 1: 2}, 1, 1, (2, 1)),  # rank 1 refused, and rank 0 lost its peer
    ({0: 2, 1: 3}, 1, 1, (2, 0)),  # rank 0's own refusal speaks
    ({0: 0, 1: None}, None, 1, (BUG, None)),  # a rank killed by a signal left no code
    ({0: 0, 1: 0}, None, 1, (BUG, None)),  # torchrun failed though every rank succeeded
])
def test_the_exit_code_that_speaks_for_the_ranks(codes: dict[int, int | None], first: int | None,
                                                 torchrun_code: int, expected: tuple[int, int | None]) -> None:
    assert outcome(codes, torchrun_code, first) == expected


@pytest.mark.slow  # three launches of 2 ranks: ~40 s
@pytest.mark.skipif(cannot_spawn() is not None, reason=str(cannot_spawn()))
def test_nproc_exits_with_lmconvert_codes(canonical: Path, tmp_path: Path) -> None:
    """Three launches of 2 ranks: a pass (0, the report once), an error every rank raises inside the
    launch (2, where torchrun says 1), and a parity failure (1), each with rank 0's output alone."""
    golden = tmp_path / "golden.pt"
    run = nproc("verify", canonical, "--nproc", "2", "--json", tmp_path / "report.json", "--save-golden", golden,
                cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("verdict") == 1 and "tensor-parallel over 2 ranks" in run.stdout
    assert json.loads((tmp_path / "report.json").read_text())["tensor_parallel"] == 2
    assert run.stderr.strip() == f"wrote golden file {golden}"  # no word of torchrun's

    # inside the launch: rank 0 checks the golden file and every rank raises its refusal
    run = nproc("verify", canonical, "--nproc", "2", "--golden", golden, "--dtype", "bfloat16", cwd=tmp_path)
    assert_clean_failure(run, "recorded in float32; pass --dtype float32")
    assert run.stdout == ""

    def edit(tensors: dict[str, torch.Tensor]) -> None:  # rank 1's half of layer 1's query heads
        q = tensors["layers.1.attn.q.weight"]
        q[q.shape[0] // 2:] += 0.01

    broken = edited_weights(canonical, tmp_path / "broken", edit)
    run = nproc("verify", broken, "--nproc", "2", "--golden", golden, "--json", "-", cwd=tmp_path)
    err = assert_clean_failure(run, "parity check failed", code=1)
    assert "ChildFailedError" not in err
    report = json.loads(run.stdout)  # rank 0's alone
    assert report["verdict"] == "FAIL" and report["tensor_parallel"] == 2
