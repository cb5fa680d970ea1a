"""Every argument that is more than a click type: sizes, memory budgets, devices and dtypes. Each
fails with one line that names the option, so nothing below the CLI parses user text."""

from __future__ import annotations

import math
import re

from lmconvert.formats.dtypes import CASTS, parse_cast
from lmconvert.formats.errors import InputError

__all__ = ["CASTS", "check_device", "check_sampling", "parse_cast", "parse_memory", "parse_size"]

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str, option: str = "--max-shard-size") -> int:
    """A size such as 5GB, 500MB or 512MiB, in bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", text.upper())
    if not match:
        raise InputError(f"{option} {text!r}: expected a size such as 5GB or 500MB")
    return int(float(match.group(1)) * _UNITS[match.group(2) or "B"])


def parse_memory(text: str | None) -> int | None:
    """--max-memory's size in bytes (e.g. 1GB, 512MiB)."""
    if text is None:
        return None
    try:
        size = parse_size(text)
    except InputError:
        raise InputError(f"--max-memory {text!r}: expected a size such as 1GB or 512MB") from None
    if size <= 0:
        raise InputError(f"--max-memory {text!r}: must be more than 0")
    return size


def check_device(device: str) -> str:
    """A bad --device fails here in one line, not as a traceback from deep inside torch."""
    import torch

    try:
        target = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r}: not a torch device; use cpu, cuda or cuda:N") from None
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: no CUDA device is available to torch {torch.__version__}; "
                             "use --device cpu or a CUDA build of torch")
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s)")
    elif target.type != "cpu":
        raise InputError(f"--device {device!r}: verify runs on cpu or cuda")
    return device


def check_sampling(temperature: float | None, top_k: int | None, top_p: float | None, system: str | None,
                   chat: bool | None) -> None:
    """generate's sampling and chat options, each refused in one line when it cannot mean anything."""
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise InputError(f"--temperature {temperature:g}: must be a finite number >= 0 (0: greedy)")
    if top_k is not None and top_k < 0:
        raise InputError(f"--top-k {top_k}: must be >= 0 (0: no top-k filtering)")
    if top_p is not None and not (0 < top_p <= 1):
        raise InputError(f"--top-p {top_p:g}: must be more than 0 and at most 1 (1: no top-p filtering)")
    if system is not None and chat is False:
        raise InputError("--system only applies in chat; drop --no-chat or --system")
