"""How much memory this process may still use, for refusing a request that cannot fit before
allocating anything for it (`verify --batch/--seq-len/--generate`, `generate --max-new-tokens`).

The least of: /proc/meminfo's MemAvailable (the kernel's estimate of what can be allocated without
swapping; sysconf's free pages where there is no /proc), what RLIMIT_AS leaves of the address
space, and what a cgroup v2 memory.max leaves (a container's limit, which MemAvailable ignores).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        status = Path("/proc/self/status").read_text()
        used = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:"))
    except (OSError, ValueError, StopIteration):
        used = 0
    return max(0, soft - used)


def _cgroup_left() -> int | None:
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping, as far as the system says; None
    when it does not say."""
    known = [m for m in (_meminfo_available(), _address_space_left(), _cgroup_left()) if m is not None]
    return min(known) if known else None


def size_text(n: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,} bytes"


