"""Whether this process is one rank of a `torchrun` launch, and which backend its collectives use.
Kept apart from `tensor_parallel.py` so that asking imports nothing of `torch.distributed` (which some
torch builds lack): one-process `verify` asks on every run."""

from __future__ import annotations

import os


def launched() -> bool:
    """Whether this process was started by `torchrun` (or anything that sets its rendezvous
    variables), with any number of ranks: one rank is a mesh of one, which runs the same code."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def backend() -> str:
    """NCCL where there are GPUs, gloo on CPUs."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"
