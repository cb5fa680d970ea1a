"""Who wrote a temporary, and whether that run has certainly ended.

A pid alone proves nothing: pids are recycled, and a name shaped like ours may be the user's. So a
run records its pid with what makes it unique (the process's start time, Linux's
/proc/<pid>/stat field 22, in clock ticks since boot) and where that pid means something (host,
machine id, boot id, pid namespace). `ended` says True only when it is sure; whatever it cannot
tell (another host or container, a platform without /proc) counts as still running, so a
leftover is kept rather than a live run's output deleted.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

Identity = dict[str, Any]  # JSON-ready: pid, start, host, machine, boot, pid_ns


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None where it cannot be read. The
    command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None  # fields[0] is field 3


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def identity() -> Identity:
    """This process, as a temporary's marker records it."""
    pid = os.getpid()
    return {"pid": pid, "start": start_time(pid), "host": socket.gethostname(),
            "machine": _read("/etc/machine-id"), "boot": _read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _pid_namespace()}


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def ended(recorded: object) -> bool:
    """Whether the run a marker records has certainly ended (so its temporary may be cleaned up)."""
    if not isinstance(recorded, dict):
        return False
    here = identity()
    pid = recorded.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:  # 0 and -N would name process groups
        return False
    if any(recorded.get(key) != here[key] for key in ("host", "machine")):
        return False  # another machine, or one we cannot tell apart: its pids are not ours to ask
    if recorded.get("boot") != here["boot"]:
        # the same machine since rebooted: every run of the old boot has ended; unknown ids prove nothing
        return recorded.get("machine") is not None and recorded.get("boot") is not None and here["boot"] is not None
    if recorded.get("pid_ns") != here["pid_ns"]:
        return False  # another container's pids
    if not _exists(pid):
        return True
    start, then = start_time(pid), recorded.get("start")
    return start is not None and then is not None and start != then  # the pid was recycled
