"""Helpers for the bad-input tests: run the CLI as a user does and check the failure is clean."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from lmconvert.cli import main


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def lmconvert(*args: object) -> Result:
    """In-process, as the console script runs it (fast)."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an escaped exception is a bug, not a clean failure
    return Result(result.exit_code, result.stdout, result.stderr)


def lmconvert_process(*args: object, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lmconvert.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kwargs)


def assert_clean_failure(proc: Result, *fragments: str, out: Path | None = None, code: int = 2) -> str:
    """Exit code, one line on stderr naming what is wrong, no traceback, nothing at OUT."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and err.startswith("lmconvert: error: ")
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    if out is not None:
        assert not out.exists()
        assert not list(out.parent.glob(f".{out.name}.lmconvert-*")), "temporary files left behind"
    return err


def lmconvert_run(*args: object, umask: int | None = None, **kwargs: object) -> Result:
    """A real `lmconvert` process, run to the end (with `umask`, if given)."""
    if umask is not None:
        kwargs["preexec_fn"] = lambda: os.umask(umask)
    proc = lmconvert_process(*args, **kwargs)
    stdout, stderr = proc.communicate()
    return Result(proc.returncode, stdout, stderr)


def dead_pid() -> int:
    """The pid of a process that has ended: what a killed run leaves in its temporary names."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
