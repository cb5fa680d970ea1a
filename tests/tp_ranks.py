"""What each spawned rank runs for test_tensor_parallel.py, in a module of its own: a spawned process
imports the module its function lives in, and this one needs only torch and lmconvert (not
transformers, whose import would cost every rank seconds; verify's tracer does not import it).
Each rank also records verify's trace points and gathers the ones it computed in slices."""

from __future__ import annotations

import faulthandler
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

import lmconvert
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.runtime.tensor_parallel import gather_points, load_parallel, local_bytes
from lmconvert.verify.trace import our_trace


def cannot_spawn() -> str | None:
    """Why this platform cannot run ranks in processes of their own (None when it can): the only
    reason the distributed tests skip."""
    import socket

    try:
        socket.socket().close()
    except OSError as exc:
        return f"no sockets for gloo: {exc}"
    return None if dist.is_available() and dist.is_gloo_available() else "torch.distributed with gloo is unavailable"


def incremental(model: torch.nn.Module, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits from a prefill of `prefill` tokens, then one token at a time through the KV cache."""
    cache = model.new_cache()
    steps = [ids[:, :prefill]] + [ids[:, i:i + 1] for i in range(prefill, ids.shape[1])]
    return torch.cat([model(step, cache=cache) for step in steps], 1)


@torch.no_grad()
def _run(model: torch.nn.Module, ids: torch.Tensor, prefill: int, group: Any) -> dict[str, Any]:  # noqa: ANN401
    info = model.tensor_parallel
    mine = {"bytes": local_bytes(model), "largest_read": info.largest_read, "whole_reads": info.whole_reads}
    every: list[Any] = [None] * info.plan.size
    dist.all_gather_object(every, mine, group=group)
    points = gather_points(model, our_trace(model, model, ids).points)  # what verify compares, made whole
    return {"full": model(ids), "cached": incremental(model, ids, prefill), "ranks": every, "points": points}


def run_ranks(rank: int, world: int, rendezvous: str, paths: dict[str, Path], ids: torch.Tensor, prefill: int,
              out: str) -> None:
    """Every model over ranks 0-1 (a two-rank mesh, the others waiting), then over all ranks through
    `lmconvert.load(path, tp=world)`; rank 0 writes what it saw and what every rank measured. Each rank
    then leaves as the CLI's do under torchrun, without the interpreter's teardown (`cli.entry`): DTensor's
    caches keep the gloo groups alive into it, and freeing one there aborted a finished rank in CI."""
    faulthandler.enable()  # a rank that dies of a signal prints where each of its threads was
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    pair = DeviceMesh("cpu", [0, 1])
    results: dict[int, dict[str, Any]] = {2: {}, world: {}}
    for name, path in paths.items():
        if rank < 2:
            with open_checkpoint(path) as checkpoint:
                model = load_parallel(checkpoint, pair, attention="eager")
            results[2][name] = _run(model, ids, prefill, pair.get_group())
        dist.barrier()
        model = lmconvert.load(path, attention="eager", tp=world)
        results[world][name] = _run(model, ids, prefill, None)
    if rank == 0:
        with open(out, "wb") as f:
            pickle.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
