"""`lmconvert verify --nproc N`: torchrun launched by lmconvert, so that the exit status is ours.

torchrun exits 1 whenever a rank fails, whatever the rank's code (the parity-failure code for a refused
argument as for a bug), and prints its own multi-line ChildFailedError after the rank's one line. Here
the command runs `python -m torch.distributed.run --standalone --nproc-per-node N -m lmconvert verify
...` with this interpreter and this lmconvert; each rank sends its stdout and stderr to files of its
own in a private temporary directory and, on leaving, writes its exit code there (`rank_streams`,
`record_code`, called by `cli.entry`). When torchrun is done, rank 0's output is shown (its report,
or its one-line error) and the command exits with the code that speaks for the run (`outcome`):
torchrun's own output only with --debug.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import click
from click.core import ParameterSource

RANK_DIR = "LMCONVERT_RANK_DIR"  # set by `launch` for the ranks it starts
BUG = 3


def rank_streams() -> None:
    """Under `launch`, this rank's stdout and stderr into its files (file descriptors 1 and 2, so
    whatever the process writes, C code and a dying rank's traceback included, lands there)."""
    where = os.environ.get(RANK_DIR)
    if not where:
        return
    rank = os.environ.get("RANK", "0")
    for fd, name in ((1, "out"), (2, "err")):
        file = os.open(os.path.join(where, f"rank{rank}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)


def record_code(code: int) -> None:
    """Under `launch`, this rank's exit code, written just before it leaves (renamed in whole)."""
    where = os.environ.get(RANK_DIR)
    if not where:
        return
    rank = os.environ.get("RANK", "0")
    partial = os.path.join(where, f"rank{rank}.code.partial")
    with open(partial, "w") as f:
        f.write(str(code))
    os.replace(partial, os.path.join(where, f"rank{rank}.code"))


def outcome(codes: dict[int, int | None], torchrun_code: int, first: int | None = None) -> tuple[int, int | None]:
    """The exit code of the run and the rank whose stderr explains it (None: no rank can). `first`:
    the rank whose failure was recorded first.

    Rank 0 speaks for every rank (its report, its verdict, an error raised on every rank), unless its
    own failure is an internal error that came after another rank's failure (a collective broken by
    a rank that died first: "Connection closed by peer"); then, as when rank 0 had nothing to say
    (torchrun stopped it, or it passed while another rank failed), the first rank to fail speaks. A
    rank that left no code (killed, or dead of a signal) or a torchrun that failed while every rank
    succeeded is an internal error."""
    failed = [rank for rank, code in sorted(codes.items()) if code]
    if failed:
        speaker = first if first in failed else failed[0]
        if codes.get(0) and (codes[0] != BUG or speaker == 0):
            speaker = 0
        return codes[speaker] or BUG, speaker
    if any(code is None for code in codes.values()) or torchrun_code != 0:
        return BUG, None
    return 0, 0


def command_line(ctx: click.Context, leave_out: str) -> list[str]:
    """The arguments this command was given (what its user typed, not the defaults), less `leave_out`:
    options first, then `--` and the positional arguments, so a path that starts with '-' stays a path."""
    options: list[str] = []
    positional: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if name == leave_out or ctx.get_parameter_source(name) in (ParameterSource.DEFAULT,
                                                                   ParameterSource.DEFAULT_MAP, None):
            continue
        value = ctx.params[name]
        if isinstance(param, click.Argument):
            positional.append(str(value))
        elif isinstance(param, click.Option) and param.is_flag:
            if value:
                options.append(param.opts[0])
        else:
            options += [param.opts[0], str(value)]
    return [*options, "--", *positional]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _code(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def launch(command: str, args: list[str], nproc: int, debug: bool) -> int:
    """`lmconvert [--debug] COMMAND ARGS` over `nproc` ranks under torchrun; rank 0's output shown,
    the run's exit code (`outcome`) returned."""
    import lmconvert

    where = Path(tempfile.mkdtemp(prefix="lmconvert-ranks-"))  # mode 0700: this user's alone
    try:
        here = str(Path(lmconvert.__file__).resolve().parents[1])  # the ranks import this lmconvert
        env = {**os.environ, RANK_DIR: str(where),
               "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", str(nproc), "--max-restarts", "0", "-m", "lmconvert",
               *(["--debug"] if debug else []), command, *args]
        with open(where / "torchrun.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                torchrun_code = proc.wait()
            except KeyboardInterrupt:  # torchrun stops its ranks on SIGTERM; it is never killed before them
                proc.send_signal(signal.SIGTERM)
                proc.wait()
                raise
        codes = {rank: _code(where / f"rank{rank}.code") for rank in range(nproc)}
        failed = [rank for rank, c in codes.items() if c]
        first = min(failed, key=lambda rank: (where / f"rank{rank}.code").stat().st_mtime_ns) if failed else None
        code, speaker = outcome(codes, torchrun_code, first)
        sys.stdout.write(_read(where / "rank0.out"))
        sys.stdout.flush()
        shown = [0 if speaker is None else speaker]  # its line alone: rank 0's, if another speaks, is an echo
        if debug:  # everything: torchrun's own report and every rank's stderr
            shown = list(range(nproc))
            sys.stderr.write(_read(where / "torchrun.log"))
        for rank in shown:
            sys.stderr.write(_read(where / f"rank{rank}.err"))
        if speaker is None:
            missing = [str(rank) for rank, c in codes.items() if c is None]
            started = any((where / f"rank{rank}.err").exists() for rank in range(nproc))
            ranks = f"rank{'s' * (len(missing) > 1)} {', '.join(missing)}"
            what = (f"torchrun exited {torchrun_code} before any rank started" if not started else
                    f"{ranks} ended without an exit code (killed or crashed)" if missing else
                    f"torchrun exited {torchrun_code} after every rank succeeded")
            sys.stderr.write(f"lmconvert: error: internal error ({what}); this is a bug in lmconvert: rerun with "
                             "--debug (lmconvert --debug verify --nproc ...) and report torchrun's output\n")
        sys.stderr.flush()
        return code
    finally:
        shutil.rmtree(where, ignore_errors=True)
