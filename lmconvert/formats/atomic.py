"""Outputs appear whole or not at all: everything is written into a temporary directory beside
OUT and renamed into place on success; any failure removes the temporary directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError


def check_output(out: Path, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    out = out.resolve()
    for src in inputs:
        src = src.resolve()
        if out == src or src in out.parents:
            raise InputError(f"{out}: the output may not be inside the input {src}; choose another OUT")
    if out.exists() and not force:
        raise InputError(f"{out}: already exists; pass --force to replace it")
    parent = out.parent
    if not parent.is_dir():
        raise InputError(f"{parent}: the output's parent directory does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{parent}: not writable; choose an OUT in a writable directory")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(out: Path) -> None:
    """Remove temporary directories beside `out` left by runs that were killed (their pid is gone)."""
    for tmp in out.parent.glob(f".{out.name}.tmp-*"):
        pid = tmp.name.removeprefix(f".{out.name}.tmp-").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_directory(out: Path) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out` when the block succeeds. A killed run
    leaves only a hidden temporary directory, which the next run removes."""
    out = out.resolve()
    remove_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"{out}: writing failed ({exc.strerror or exc}); nothing was written: "
                         "free some space or fix permissions and retry") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
