"""A command run with its stderr on a real pseudo-terminal, as a user's shell runs it: the progress line is
drawn only there (lmconvert/cli/progress.py)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading


def run_in_terminal(*args: object, env: dict[str, str] | None = None,
                    timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`python -m lmconvert.cli ARGS` with stdout a pipe and stderr a terminal: the process, with what the
    terminal showed as `stderr`, and the terminal's text as the lines it drew (each redraw of the
    progress line, after a carriage return, is one; the erase-to-end-of-line code dropped)."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "lmconvert.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=secondary, stdin=subprocess.DEVNULL, env=env)
    os.close(secondary)
    shown = bytearray()

    def read() -> None:  # the terminal's buffer is small: drain it while the command runs
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        reader.join(timeout=10)
        os.close(primary)
    text = shown.decode(errors="replace")
    lines = [part.replace("\x1b[K", "") for line in text.split("\n") for part in line.split("\r")]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout.decode(), text), [x for x in lines if x]
