"""The one progress line a long command draws on stderr, redrawn in place: what it is doing, how much of
it is done, how fast and how long it should still take. Drawn only on a terminal: a log or a CI gets
the command's result lines and nothing else."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

REDRAW_EVERY = 0.1  # seconds: an MoE's 11 000 tensors drawn one by one cost more than moving their bytes
SETTLED = 0.5  # seconds of a stage before its rate is trusted for a time left


@dataclass(frozen=True)
class Unit:
    """How a stage counts: bytes (shown scaled, with bytes/s) or things such as layers or tensors."""

    name: str  # plural: "bytes", "layers", "tensors"

    def amount(self, done: int, total: int) -> str:
        if self.name == "bytes":
            return f"{size(done)} of {size(total)}"
        return f"{done} of {total} {self.name}"

    def rate(self, per_second: float) -> str:
        if self.name == "bytes":
            return f"{size(per_second)}/s"
        return f"{per_second:.1f} {self.name}/s"


BYTES, LAYERS, TENSORS = Unit("bytes"), Unit("layers"), Unit("tensors")


def size(n: float) -> str:
    """Decimal units, as `ls -h --si` and the Hub show file sizes."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressLine:
    """One line, whatever the command's stages: each `stage` relabels it and starts its rate and time
    left afresh (a download, then a conversion; transformers' run, then ours). `close` ends the line."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream or sys.stderr
        self._clock = clock
        self._shown = False
        try:
            self._on = self._stream.isatty()
        except (AttributeError, ValueError):
            self._on = False

    def stage(self, label: str, unit: Unit = BYTES) -> Callable[[int, int], None]:
        """The (done, total) callback of a stage labelled `label`; its clock starts at its first call."""
        started: list[float] = []
        drawn = [float("-inf")]

        def update(done: int, total: int) -> None:
            now = self._clock()
            if not started:
                started.append(now)
            if not self._on or (now - drawn[0] < REDRAW_EVERY and done < total):
                return
            drawn[0] = now
            self._draw(render(label, unit, done, total, now - started[0]))

        return update

    def layer_stages(self, label: str) -> Callable[[int, int], None]:
        """`verify`'s stages count decoder layers run (`verify/layer_progress.py`)."""
        return self.stage(f"verifying: {label}", LAYERS)

    def _draw(self, line: str) -> None:
        self._stream.write(f"\r{line}\x1b[K")  # back to the line's start, then clear what a longer one left
        self._stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
            self._shown = False


def render(label: str, unit: Unit, done: int, total: int, elapsed: float) -> str:
    """`converting x: 1.23 GB of 2.47 GB (50%), 612.00 MB/s, 0:02 left`; the rate and the time left
    once the stage has run long enough to tell, the time taken once it is done."""
    total = max(total, done)
    parts = [f"{label}: {unit.amount(done, total)}" + (f" ({100 * done // total}%)" if total else "")]
    if elapsed >= SETTLED and done:
        per_second = done / elapsed
        parts.append(unit.rate(per_second))
        parts.append(f"{duration(elapsed)} taken" if done >= total else f"{duration((total - done) / per_second)} left")
    return ", ".join(parts)
