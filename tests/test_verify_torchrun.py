"""`torchrun --nproc-per-node 2 -m lmconvert verify` on CPU (gloo): our side tensor-parallel, transformers
on rank 0, one report from rank 0 with `tensor_parallel: 2`, which holds every point (q, k, v, gate and up
gathered whole from the ranks' slices) to transformers; then, against the golden file that run saved, a
checkpoint wrong only in the half of a query projection that rank 1 holds fails, in that layer's attention."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_models import build_model, save_checkpoint
from safetensors.torch import load_file, save_file
from tp_ranks import cannot_spawn

from lmconvert.convert.ingest import to_canonical

pytestmark = [pytest.mark.slow,  # two torchrun launches of 2 ranks: ~25 s
              pytest.mark.skipif(cannot_spawn() is not None, reason=str(cannot_spawn()))]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
            "-m", "lmconvert"]


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=240)


@pytest.fixture(scope="module")
def canonical(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("torchrun")
    hf = save_checkpoint(build_model("llama", num_attention_heads=8, num_key_value_heads=4, head_dim=8), tmp / "hf")
    to_canonical(hf, tmp / "canonical")
    return tmp / "canonical"


def test_verify_under_torchrun_reports_once_from_rank_0(canonical: Path, tmp_path: Path) -> None:
    run = torchrun("verify", str(canonical), "--json", str(tmp_path / "report.json"), "--save-golden",
                   str(tmp_path / "golden.pt"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "PASS" and report["tensor_parallel"] == 2
    assert report["reference"].endswith("hf") and report["device"] == "cpu"  # gloo: the reference on the CPU too
    tolerances = report["tolerances"]  # the logits' bar relative under torchrun (one process keeps 1e-5 absolute)
    assert tolerances["logits_rtol"] == 1e-5 and tolerances["logits_max_abs"] is None
    names = {p["name"] for p in report["points"]}
    assert {"layers.0.attn.q", "layers.0.attn.k", "layers.1.mlp.gate", "layers.1.mlp.down"} <= names
    assert run.stdout.count("verdict") == 1  # rank 1 printed nothing
    assert "tensor-parallel over 2 ranks" in run.stdout

    broken = tmp_path / "broken"
    shutil.copytree(canonical, broken)
    shards = list(broken.glob("*.safetensors"))
    for shard in shards:
        tensors = load_file(shard)
        if "layers.1.attn.q.weight" in tensors:
            q = tensors["layers.1.attn.q.weight"]
            q[q.shape[0] // 2:] += 0.01 * torch.ones_like(q[q.shape[0] // 2:])  # rank 1's half of the heads
            save_file(tensors, shard, metadata={"format": "pt"})
    run = torchrun("verify", str(broken), "--golden", str(tmp_path / "golden.pt"), "--json", "-", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    report = json.loads(run.stdout)  # rank 1 wrote nothing into it
    assert report["verdict"] == "FAIL" and report["tensor_parallel"] == 2
    assert report["first_failure"]["name"] == "layers.1.attn.o"  # a golden file keeps the residual-wide points
    assert run.stderr.count("lmconvert: error:") == 1
