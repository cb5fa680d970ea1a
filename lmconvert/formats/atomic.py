"""Outputs appear whole or not at all, and never at the cost of files lmconvert did not write.

Every file lmconvert writes goes through here: `convert`'s and `pull`'s OUT (a directory, or one
GGUF file), and `verify`'s `--json` report and `--save-golden` file. Each is written into a marked
temporary beside it (`temporary.py`) and renamed into place on success; any failure removes the
temporary. With --force, an existing output is first moved into a marked temporary of its own, the
new output takes its place, and the old one is removed. A run killed on the way leaves those
temporaries behind, and the next run for the same output cleans them up: a half-written output is
removed; a replaced one is removed when the output is in place, or put back when the kill came
between the two renames, so no model is ever lost.

What an output may be:
- never an input of the run, inside one, or a directory holding one (after resolving symlinks
  and `..`);
- without --force, a path where nothing exists, at the start and still at the end: a second
  run to the same output fails instead of silently replacing the first;
- with --force, also an output lmconvert wrote: for a directory, one recognised by the description
  lmconvert writes into it: `lmconvert.json` in a canonical checkpoint, `lmconvert-export.json` in
  any other (HF, Meta), each listing every file of the output. A directory with neither, or
  holding any file its description does not list (something the user added), is refused. A
  one-file output is replaced only by a file that its `Recogniser` knows for lmconvert's (a GGUF
  file, a verify report, a golden file), never by a directory.
Outputs honour the umask, as `cp` does. Errors name the output as the user gave it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .canonical import FORMAT, META_FILE
from .errors import InputError
from .jsonfile import read_json_object
from .temporary import PAYLOAD, REPLACED, WRITING, create, discard, name_max, remove_stale

Recogniser = Callable[[Path], bool]  # whether a one-file output was written by lmconvert
EXPORT_FILE = "lmconvert-export.json"  # the description of an output that has no lmconvert.json
__all__ = ["EXPORT_FILE", "Recogniser", "atomic_directory", "atomic_file", "check_output", "remove_stale",
           "scratch_directory"]


def _resolved(path: Path, shown: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise InputError(f"{shown}: cannot be resolved ({exc}); choose another path") from None


def check_output(out: Path, force: bool, inputs: tuple[Path, ...] = (), ours: Recogniser | None = None,
                 label: str | None = None) -> None:
    """Refuse, before anything is read or written, an output that would lose files nobody asked to
    replace (after cleaning up what killed runs left beside it, which may put back a replaced one).
    A one-file output passes `ours`, which tells such a file lmconvert wrote; `label` names it in
    errors (`--json FILE`; default: the path as given)."""
    shown, other = (label, "another path") if label else (str(out), "another OUT")
    out = _resolved(out, shown)
    parent = out.parent
    if parent.is_dir() and len(os.fsencode(out.name)) > name_max(parent):
        raise InputError(f"{shown}: its name is {len(os.fsencode(out.name))} bytes, more than this filesystem "
                         f"allows ({name_max(parent)}); choose a shorter name")
    remove_stale(out)
    for src in inputs:
        src = _resolved(src, str(src))
        if out == src or src in out.parents:
            raise InputError(f"{shown}: the output may not be the input or inside the input {src}; choose {other}")
        if out in src.parents:
            raise InputError(f"{shown}: holds the input {src}, which writing it would delete; choose {other}")
    if os.path.lexists(out):
        if not force:
            raise InputError(f"{shown}: already exists; pass --force to replace it")
        refuse_unless_written_by_lmconvert(out, ours, shown)
    if not parent.is_dir():
        raise InputError(f"{parent}: the parent directory of {shown} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{parent}: not writable; choose a path in a writable directory for {shown}")


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


def refuse_unless_written_by_lmconvert(out: Path, ours: Recogniser | None = None, shown: str | None = None) -> None:
    """--force replaces a directory lmconvert wrote, holding nothing but what it wrote, or, for a
    one-file output, a file that `ours` recognises as lmconvert's."""
    shown = shown or str(out)
    if ours is not None:
        if out.is_symlink() or not out.is_file() or not ours(out):
            raise InputError(f"{shown}: is not a file lmconvert wrote; --force replaces only those: remove it "
                             "yourself or choose another path")
        return
    if out.is_symlink() or not out.is_dir():
        raise InputError(f"{shown}: is not a directory lmconvert wrote; --force replaces only those: "
                         "remove it yourself or choose another OUT")
    listed = _listed(out)
    if listed is None:
        raise InputError(f"{shown}: is not an output lmconvert wrote (it has no {META_FILE} or {EXPORT_FILE}); "
                         "--force replaces only those: remove it yourself or choose another OUT")
    others = sorted(p.name for p in out.iterdir() if p.name not in listed)
    if others:
        raise InputError(f"{shown}: holds {', '.join(others[:5])}, which lmconvert did not write; --force replaces "
                         "only lmconvert's own files: move them out or choose another OUT")


def _describe(directory: Path) -> None:
    """Mark an output that has no lmconvert.json as lmconvert's, listing its files."""
    if (directory / META_FILE).exists():
        return
    files = sorted(p.name for p in directory.iterdir())
    data = {"written_by": "lmconvert", "files": files}
    (directory / EXPORT_FILE).write_text(json.dumps(data, indent=2) + "\n")


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


def _swap(new: Path, out: Path, ours: Recogniser | None, shown: str) -> None:
    """Put `new` in the place of `out` (--force), which must still be an output lmconvert wrote: the
    old one is first moved into a marked temporary, so a kill between the renames loses nothing."""
    refuse_unless_written_by_lmconvert(out, ours, shown)
    old = create(out, REPLACED, shown)
    try:
        os.rename(out, old / PAYLOAD)
    except OSError:
        discard(old)
        raise
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old / PAYLOAD, out)
        discard(old)
        raise
    discard(old)


@contextmanager
def _atomic(out: Path, force: bool, ours: Recogniser | None, label: str | None,
            make: Callable[[Path], None]) -> Iterator[Path]:
    shown = label or str(out)
    out = _resolved(out, shown)
    remove_stale(out)
    tmp = create(out, WRITING, shown)
    new = tmp / PAYLOAD
    try:
        make(new)
        yield new
        if not _rename_unless_taken(new, out):
            if not force:
                raise InputError(f"{shown}: appeared while this run was writing it (another run?); nothing "
                                 "was written: pass --force to replace it, or choose another path")
            _swap(new, out, ours, shown)
    except OSError as exc:
        discard(tmp)
        raise InputError(f"{shown}: writing failed ({exc.strerror or exc}); nothing was written: "
                         "free some space or fix permissions and retry") from exc
    except BaseException:
        discard(tmp)
        raise
    discard(tmp)  # the marker, all that is left


def _mkdir(path: Path) -> None:
    path.mkdir(0o777)  # the umask's mode, as `cp` makes directories


@contextmanager
def atomic_directory(out: Path, force: bool = False, label: str | None = None) -> Iterator[Path]:
    """Yield a temporary directory that becomes `out` when the block succeeds. Without `force`,
    an `out` that appeared meanwhile (another run) is an error and stays as it is."""
    with _atomic(out, force, None, label, _mkdir) as new:
        yield new
        _describe(new)


@contextmanager
def atomic_file(out: Path, force: bool, ours: Recogniser, label: str | None = None) -> Iterator[Path]:
    """Yield a temporary file name beside `out` that becomes `out` when the block succeeds; as
    `atomic_directory`, for an output that is one file (`ours` tells one lmconvert wrote). The
    block creates the file, with the umask's mode as `cp` does."""
    with _atomic(out, force, ours, label, lambda _: None) as new:
        yield new


@contextmanager
def scratch_directory(out: Path, label: str | None = None) -> Iterator[Path]:
    """A directory for files a run needs while it writes `out` and never keeps (the side files a
    one-step export reads from): a marked temporary beside `out`, as the output's own is, removed when
    the block ends, and by the next run for `out` when a killed run left it."""
    shown = label or str(out)
    tmp = create(_resolved(out, shown), WRITING, shown)
    try:
        _mkdir(tmp / PAYLOAD)
        yield tmp / PAYLOAD
    finally:
        discard(tmp)
