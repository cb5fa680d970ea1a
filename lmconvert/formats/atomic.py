"""Outputs appear whole or not at all, and never at the cost of files lmconvert did not write.

Everything is written into `.OUT.lmconvert-writing-PID-XXXX` beside OUT and renamed into place on
success; any failure removes it. With --force, an existing OUT is first renamed to
`.OUT.lmconvert-replaced-PID-XXXX`, the new output takes its place, and the old one is removed.
A run killed on the way leaves those names behind, and the next run for the same OUT cleans them
up: a half-written output is removed; a replaced one is removed when OUT is in place, or put back
as OUT when the kill came between the two renames, so no model is ever lost.

What OUT may be:
- never the input, inside it, or a directory holding it (after resolving symlinks and `..`);
- without --force, a path where nothing exists, at the start and still at the end: a second
  conversion to the same OUT fails instead of silently replacing the first;
- with --force, also a directory lmconvert wrote, recognised by the description lmconvert writes
  into every output: `lmconvert.json` in a canonical checkpoint, `lmconvert-export.json` in any
  other (HF, Meta), each listing every file of the output. A directory with neither, or holding
  any file its description does not list (something the user added), is refused.
Outputs honour the umask, as `cp` does.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .canonical import FORMAT, META_FILE
from .errors import InputError
from .jsonfile import read_json_object

Recogniser = Callable[[Path], bool]  # whether a one-file output was written by lmconvert
EXPORT_FILE = "lmconvert-export.json"  # the description of an output that has no lmconvert.json
WRITING, REPLACED = "writing", "replaced"  # what a temporary name beside OUT holds


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise InputError(f"{path}: cannot be resolved ({exc}); choose another OUT") from None


def check_output(out: Path, force: bool, inputs: tuple[Path, ...] = (), ours: Recogniser | None = None) -> None:
    """Refuse, before anything is read or written, an OUT that would lose files nobody asked to replace
    (after cleaning up what killed runs left beside it, which may put back a replaced OUT). A
    one-file output (GGUF) passes `ours`, which tells such a file lmconvert wrote."""
    out = _resolved(out)
    remove_stale(out)
    for src in inputs:
        src = _resolved(src)
        if out == src or src in out.parents:
            raise InputError(f"{out}: the output may not be inside the input {src}; choose another OUT")
        if out in src.parents:
            raise InputError(f"{out}: holds the input {src}, which writing OUT would delete; choose another OUT")
    if os.path.lexists(out):
        if not force:
            raise InputError(f"{out}: already exists; pass --force to replace it")
        refuse_unless_written_by_lmconvert(out, ours)
    parent = out.parent
    if not parent.is_dir():
        raise InputError(f"{parent}: the output's parent directory does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{parent}: not writable; choose an OUT in a writable directory")


def _listed(directory: Path) -> set[str] | None:
    """Every file the description lmconvert wrote into `directory` lists (itself included), or None
    when it holds no such description."""
    try:
        if (directory / META_FILE).is_file():
            data = read_json_object(directory / META_FILE)
            files, shards = data.get("files"), data.get("shards", {})
            if data.get("format") == FORMAT and isinstance(files, dict) and isinstance(shards, dict):
                return {META_FILE, *files, *shards}
        elif (directory / EXPORT_FILE).is_file():
            data = read_json_object(directory / EXPORT_FILE)
            files = data.get("files")
            if data.get("written_by") == "lmconvert" and isinstance(files, list):
                return {EXPORT_FILE, *(f for f in files if isinstance(f, str))}
    except InputError:  # unreadable: not a description lmconvert wrote
        pass
    return None


def refuse_unless_written_by_lmconvert(out: Path, ours: Recogniser | None = None) -> None:
    """--force replaces a directory lmconvert wrote, holding nothing but what it wrote, or a file
    that `ours` recognises as lmconvert's."""
    if ours is not None and out.is_file() and not out.is_symlink():
        if not ours(out):
            raise InputError(f"{out}: is not a file lmconvert wrote; --force replaces only those: remove it "
                             "yourself or choose another OUT")
        return
    if not out.is_dir():
        raise InputError(f"{out}: is not a directory lmconvert wrote; --force replaces only those: "
                         "remove it yourself or choose another OUT")
    listed = _listed(out)
    if listed is None:
        raise InputError(f"{out}: is not an output lmconvert wrote (it has no {META_FILE} or {EXPORT_FILE}); "
                         "--force replaces only those: remove it yourself or choose another OUT")
    others = sorted(p.name for p in out.iterdir() if p.name not in listed)
    if others:
        raise InputError(f"{out}: holds {', '.join(others[:5])}, which lmconvert did not write; --force replaces "
                         "only lmconvert's own files: move them out or choose another OUT")


def _describe(directory: Path) -> None:
    """Mark an output that has no lmconvert.json as lmconvert's, listing its files."""
    if (directory / META_FILE).exists():
        return
    files = sorted(p.name for p in directory.iterdir())
    data = {"written_by": "lmconvert", "files": files}
    (directory / EXPORT_FILE).write_text(json.dumps(data, indent=2) + "\n")


def _temporary(out: Path, kind: str) -> str:
    return f".{out.name}.lmconvert-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _restore_or_remove(old: Path, out: Path) -> None:
    """A replaced output left by a killed run: OUT again if OUT is missing, else no longer needed."""
    if os.path.lexists(out):
        _remove(old)
    else:
        os.rename(old, out)


def _leftover(name: str, out: Path) -> tuple[str, int | None] | None:
    """What a name beside `out` holds (WRITING or REPLACED) and the pid of the run that made it, for
    the names lmconvert creates; also those of lmconvert 0.1, `.OUT.tmp-PID-*` (half-written) and
    `.OUT.old-*` (holding the replaced OUT, and no pid); None for any other name."""
    rest = name.removeprefix(f".{out.name}.")
    if rest == name:
        return None
    if m := re.fullmatch(rf"lmconvert-({WRITING}|{REPLACED})-(\d+)-[0-9a-f]+", rest):
        return m.group(1), int(m.group(2))
    if m := re.fullmatch(r"tmp-(\d+)-\w+", rest):
        return WRITING, int(m.group(1))
    if re.fullmatch(r"old-\w+", rest):
        return REPLACED, None
    return None


def _age(path: Path) -> float:
    try:
        return path.lstat().st_ctime
    except OSError:  # cleaned up meanwhile by another run
        return 0.0


def remove_stale(out: Path) -> None:
    """Clean up after runs for `out` that were killed (their pid is gone), the newest first. What
    cannot be cleaned now (another run got there first) is left for the next run."""
    for path in sorted(out.parent.glob(glob.escape(f".{out.name}.") + "*"), key=_age, reverse=True):
        leftover = _leftover(path.name, out)
        if leftover is None or path.is_symlink() or not (path.is_dir() or path.is_file()):
            continue
        kind, pid = leftover
        if pid is not None and _alive(pid):
            continue
        try:
            if kind == WRITING:
                _remove(path)
            elif pid is not None:
                _restore_or_remove(path, out)
            elif path.is_dir() and os.listdir(path) == [out.name]:  # lmconvert 0.1 moved OUT into this directory
                _restore_or_remove(path / out.name, out)
                path.rmdir()
        except OSError:
            continue


def _new_directory(out: Path) -> Path:
    """A fresh temporary directory beside `out`, created with the umask's mode, as `cp` does."""
    while True:
        path = out.parent / _temporary(out, WRITING)
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:
            continue


def _rename_unless_taken(tmp: Path, out: Path) -> bool:
    """Rename `tmp` to `out` unless something is there (False). A directory that appears in the
    instant between the look and the rename fails the rename, unless it is empty."""
    if os.path.lexists(out):
        return False
    try:
        os.rename(tmp, out)
    except OSError:
        if os.path.lexists(out):
            return False
        raise
    return True


def _swap(tmp: Path, out: Path, ours: Recogniser | None = None) -> None:
    """Put `tmp` in the place of `out` (--force), which must still be an output lmconvert wrote."""
    refuse_unless_written_by_lmconvert(out, ours)
    old = out.parent / _temporary(out, REPLACED)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old, out)
        raise
    _remove(old)


@contextmanager
def atomic_directory(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out` when the block succeeds. Without `force`,
    an `out` that appeared meanwhile (another run) is an error and stays as it is."""
    out = _resolved(out)
    remove_stale(out)
    tmp = _new_directory(out)
    try:
        yield tmp
        _describe(tmp)
        if not _rename_unless_taken(tmp, out):
            if not force:
                raise InputError(f"{out}: appeared while this run was writing it (another conversion?); nothing "
                                 "was written: pass --force to replace it, or choose another OUT")
            _swap(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"{out}: writing failed ({exc.strerror or exc}); nothing was written: "
                         "free some space or fix permissions and retry") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_file(out: Path, force: bool, ours: Recogniser) -> Iterator[Path]:
    """Yield a temporary file name beside `out` that becomes `out` when the block succeeds; as
    `atomic_directory`, for an output that is one file (`ours` tells one lmconvert wrote). The
    block creates the file, with the umask's mode as `cp` does."""
    out = _resolved(out)
    remove_stale(out)
    tmp = out.parent / _temporary(out, WRITING)
    try:
        yield tmp
        if not _rename_unless_taken(tmp, out):
            if not force:
                raise InputError(f"{out}: appeared while this run was writing it (another conversion?); nothing "
                                 "was written: pass --force to replace it, or choose another OUT")
            _swap(tmp, out, ours)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{out}: writing failed ({exc.strerror or exc}); nothing was written: "
                         "free some space or fix permissions and retry") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

