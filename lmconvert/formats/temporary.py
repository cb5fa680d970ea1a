"""The temporaries lmconvert writes beside an output, and the cleanup after runs that were killed.

Each temporary is a directory `.PART.lmconvert-KIND-PID-XXXXXXXX` beside OUT holding a marker,
`lmconvert-temporary.json` (the run that made it: `process.identity()`, and the full OUT it is
for), and `output`: the output being written (KIND `writing`), or a replaced OUT moved aside
(`replaced`). The marker is written before anything else, so a killed run leaves nothing that is
not marked. PART is OUT's name, or, when the name would not leave room for the rest within the
filesystem's NAME_MAX, its first bytes and a hash of the whole: any valid OUT gets a temporary.

Cleanup touches only what it can prove a run of lmconvert made for this OUT and that run has
certainly ended: the name's shape, a readable marker naming this OUT, nothing in the directory but
the marker and `output`. A name shaped like ours is no proof (a user's `.out.tmp-20240101-backup/`
is theirs), so names of lmconvert 0.1 (`.OUT.tmp-*`, `.OUT.old-*`) and unmarked ones are left alone.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError
from .jsonfile import read_json_object
from .process import ended, identity

MARKER = "lmconvert-temporary.json"
PAYLOAD = "output"
WRITING, REPLACED = "writing", "replaced"
NAME_MAX = 255  # POSIX's usual limit, where the filesystem does not say
RESERVED = len("..lmconvert-replaced--") + 10 + 8  # what a temporary's name adds to PART: kind, pid, token


def name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def _part(out: Path) -> str:
    """OUT's name in its temporaries' names, short enough that they fit NAME_MAX. Independent of
    the pid, so any later run finds a killed run's temporaries by it."""
    name = os.fsencode(out.name)
    room = max(name_max(out.parent) - RESERVED, 32)
    if len(name) <= room:
        return out.name
    digest = hashlib.sha256(name).hexdigest()[:12]
    return os.fsdecode(name[:room - len(digest) - 1]) + "~" + digest


def _marker(out: Path, kind: str) -> str:
    return json.dumps({"written_by": "lmconvert", "kind": kind, "out": os.fsdecode(out), "run": identity()},
                      indent=2) + "\n"


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back (and delivered just after) while a temporary and its marker come
    or go together: interrupted in between, a run would leave a directory without its marker, which
    no later run could prove its own and clean up. (SIGKILL cannot be held back; its window is the
    two system calls.) Only the main thread can block them for the process's Python handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def create(out: Path, kind: str, shown: str) -> Path:
    """A new marked temporary directory for `out` (resolved); `shown` names OUT in errors as the
    user gave it. The directory is made with the umask's mode, as `cp` makes its files."""
    with _uninterrupted():
        return _create(out, kind, shown)


def _create(out: Path, kind: str, shown: str) -> Path:
    while True:
        path = out.parent / f".{_part(out)}.lmconvert-{kind}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir(0o777)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise InputError(f"{shown}: cannot create a temporary beside it ({exc.strerror or exc}); nothing was "
                             "written: choose a writable OUT on a filesystem with free space") from None
    try:
        (path / MARKER).write_text(_marker(out, kind))
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise InputError(f"{shown}: writing failed ({exc.strerror or exc}); nothing was written: free some "
                         "space or fix permissions and retry") from None
    return path


def discard(path: Path) -> None:
    """Remove a temporary this run made (its output first: the marker goes last, with the directory)."""
    payload = path / PAYLOAD
    if payload.is_dir() and not payload.is_symlink():
        shutil.rmtree(payload, ignore_errors=True)
    elif os.path.lexists(payload):
        payload.unlink(missing_ok=True)
    with _uninterrupted():
        shutil.rmtree(path, ignore_errors=True)


def _proven(path: Path, out: Path) -> str | None:
    """The kind of a temporary a run of lmconvert made for `out` and that has certainly ended; None
    for anything else, which is left as it is."""
    if path.is_symlink() or not path.is_dir():
        return None
    marker = path / MARKER
    try:
        if marker.is_symlink() or not set(os.listdir(path)) <= {MARKER, PAYLOAD}:
            return None
        data = read_json_object(marker)
    except (OSError, InputError):
        return None
    kind = data.get("kind")
    if (data.get("written_by") != "lmconvert" or data.get("out") != os.fsdecode(out) or kind not in (WRITING, REPLACED)
            or not path.name.startswith(f".{_part(out)}.lmconvert-{kind}-") or not ended(data.get("run"))):
        return None
    return kind


def _age(path: Path) -> float:
    try:
        return path.lstat().st_ctime
    except OSError:  # cleaned up meanwhile by another run
        return 0.0


def remove_stale(out: Path) -> None:
    """Clean up after killed runs for `out` (resolved), the newest first: a half-written output is
    removed; a replaced OUT is put back when OUT is missing (the kill came between the two renames),
    else removed. What cannot be cleaned now (another run got there first) is left for the next."""
    pattern = glob.escape(f".{_part(out)}.lmconvert-") + "*"
    for path in sorted(out.parent.glob(pattern), key=_age, reverse=True):
        if not re.fullmatch(r"\.(?s:.+)\.lmconvert-(writing|replaced)-\d+-[0-9a-f]{8}", path.name):
            continue
        kind = _proven(path, out)
        if kind is None:
            continue
        try:
            if kind == REPLACED and os.path.lexists(path / PAYLOAD) and not os.path.lexists(out):
                os.rename(path / PAYLOAD, out)
            discard(path)
        except OSError:
            continue
