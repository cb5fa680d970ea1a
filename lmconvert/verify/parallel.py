"""`verify` under `torchrun`: our side tensor-parallel over the launched ranks, the reference on rank 0.

Rank 0 records the reference (transformers where the ranks run: on GPUs spread by accelerate over
every GPU of its node, on CPUs the CPU; offloading beyond `--max-memory` as on one process; or a
golden file) before any rank loads its slices, so the reference has the devices to itself (no room
is kept for the slices: they load after it is freed), and hands the record to every rank. Each rank then loads its
slices of the model (`runtime/tensor_parallel.py`) and runs the same trace and greedy generation;
the points that each rank computed a slice of (q, k, v, gate, up) are gathered whole. Rank 0
judges and returns the report, with `tensor_parallel` set to the rank count; the other ranks return
None and print nothing. An error on rank 0 while recording is raised on every rank, so none waits
for a record that will not come. A rank count the model cannot be split over is refused by every
rank before anything runs (`tensor_parallel.check_split`: heads, KV heads, MLP and expert widths).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch

from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.dtypes import torch_dtype
from lmconvert.formats.errors import InputError
from lmconvert.runtime.launch import backend, launched

from .report import Report
from .request import Request
from .run import expected_of, judge, run_model, verify_request

T = TypeVar("T")
RECORD_WAIT = timedelta(hours=24)  # past this, record a golden file first (--save-golden) and verify against it


def from_rank0(make: Callable[[], T]) -> T:
    """`make()` run on rank 0 and its result (or its exception) handed to every rank. The others wait
    for it in a gloo group of their own, on the CPU, for up to RECORD_WAIT: under NCCL they would wait
    inside a collective on their GPUs, spinning on the GPUs the spread reference computes on, and
    NCCL's watchdog ends a collective after 10 minutes (gloo's default: 30), less than a large
    reference takes to record; the record (every point, GBs for a large model) also crosses in host
    memory instead of being copied onto every GPU."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=RECORD_WAIT)
    box: list[object] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", make())
        except Exception as exc:  # noqa: BLE001 - raised again on every rank below
            box[0] = ("error", exc)
    dist.broadcast_object_list(box, src=0, group=group)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def verify_parallel(request: Request) -> Report | None:
    """`_verify_ranks`, and the process group ended after it when it was started here, from torchrun's
    environment (NCCL warns at the exit of a group never destroyed)."""
    import torch.distributed as dist

    started = not dist.is_initialized()
    try:
        return _verify_ranks(request)
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


def _verify_ranks(request: Request) -> Report | None:
    import torch.distributed as dist

    from lmconvert.runtime.tensor_parallel import check_split, device_mesh, gather_points, load_parallel

    device = request.device or "cpu"
    with open_checkpoint(request.checkpoint) as ckpt:
        # every rank refuses a split that cannot be, from the config alone: before the process group,
        # before rank 0 records the reference, before any weight is read
        check_split(ckpt.arch, dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"]))
        mesh = device_mesh()
        expected = from_rank0(lambda: expected_of(ckpt, request, device))  # rank 0 records, and writes the outputs
        if torch.cuda.is_available():  # the reference's blocks, freed (cycles too), back to every GPU for our slices
            gc.collect()
            torch.cuda.empty_cache()
        model = load_parallel(ckpt, mesh, torch_dtype(expected.dtype), attention="eager")
        ours = torch.device("cpu") if mesh.device_type == "cpu" else torch.device("cuda", torch.cuda.current_device())
        trace, generation = run_model(model, model, expected, ours)
        trace.points = gather_points(model, trace.points)
    if dist.get_rank() != 0:
        return None
    expected.tolerance = expected.tolerance.split()
    report = judge(request.checkpoint, expected, trace, generation, mesh.device_type, False, request.max_memory,
                   request.golden)
    report.tensor_parallel = mesh.size()
    return report


def check_ranks(checkpoint: Path, ranks: int) -> None:
    """Whether `checkpoint` splits over `ranks` (`verify --nproc` asks before it starts torchrun): its
    config alone is read."""
    from lmconvert.runtime.tensor_parallel import check_split

    with open_checkpoint(checkpoint) as ckpt:
        check_split(ckpt.arch, ranks)


def ranks_device(device: str | None) -> str:
    """The reference's device under torchrun: where the ranks run unless told. On GPUs (NCCL) a bare
    `cuda`, which spreads transformers over the node's GPUs (`reference.spread_map`); on CPUs (gloo)
    the CPU. A reference on the CPU beside ranks on GPUs is refused: fp32 on the two differs by
    rounding alone (2.6e-5 on an H200), which the bar would count against us."""
    ranks = "cuda" if backend() == "nccl" else "cpu"
    if device is None:
        return ranks
    if torch.device(device).type != ranks:
        raise InputError(f"--device {device}: under torchrun the ranks run on {ranks} ({backend()}), and the reference "
                         "runs beside them; drop --device, or hide the GPUs "
                         "(CUDA_VISIBLE_DEVICES=) to run every rank on the CPU")
    return device


def verify(checkpoint: Path, reference: Path | None = None, **options: Any) -> Report | None:  # noqa: ANN401
    """`run.verify` (on `device`, the CPU by default), or under torchrun `verify_parallel` (None on ranks
    other than 0), its reference on the ranks' device unless `device` names one of its kind."""
    request = Request(checkpoint, reference, **options)
    if launched():
        return verify_parallel(replace(request, device=ranks_device(request.device)))
    return verify_request(request)
