"""The workers that move tensors: which file each takes next, and that every job's result, error
or cancellation reaches whoever waits on it."""

from __future__ import annotations

import threading
import time

import pytest

from lmconvert.convert.digest import Scan
from lmconvert.convert.shards import Movers, next_file


def test_an_idle_worker_takes_a_file_no_one_writes() -> None:
    # file 3 has more bytes left, but a worker is writing it
    assert next_file([3, 4], {3: 1, 4: 0}, {3: 900, 4: 100}) == 4


def test_of_free_files_the_one_with_most_bytes_left_goes_first() -> None:
    assert next_file([3, 4, 5], {3: 0, 4: 0, 5: 0}, {3: 100, 4: 700, 5: 300}) == 4


def test_a_file_is_shared_only_when_every_file_with_work_is_taken() -> None:
    assert next_file([3, 4], {3: 1, 4: 1}, {3: 100, 4: 700}) == 4


def test_a_hash_the_caller_waits_for_goes_before_any_file() -> None:
    assert next_file([3, None], {3: 0, None: 0}, {3: 10**9, None: 1}) is None


def _recording(log: list[tuple[int, float, float]], file: int, seconds: float):
    def work() -> Scan:
        start = time.perf_counter()
        time.sleep(seconds)
        log.append((file, start, time.perf_counter()))
        return Scan(f"{file}", 0)
    return work


def test_two_workers_on_two_files_never_write_one_file_at_once() -> None:
    log: list[tuple[int, float, float]] = []
    movers = Movers(2)
    try:
        gate = threading.Event()
        first = movers.submit(lambda: (gate.wait(), Scan("gate", 0))[1], 3, 1)
        jobs = [movers.submit(_recording(log, f, 0.02), f, 100) for _ in range(6) for f in (3, 4)]
        gate.set()  # both files are queued in full before the second worker has chosen
        assert first.result().digest == "gate"
        assert [j.result().digest for j in jobs] == ["3", "4"] * 6
    finally:
        movers.close()
    for i, (file, start, end) in enumerate(log):
        for other, s, e in log[i + 1:]:
            overlap = min(end, e) - max(start, s)
            # the two files end together, so neither worker is ever left with only the other's file
            assert file != other or overlap <= 0, (file, start, end, s, e)


def test_close_cancels_what_has_not_started_and_an_error_reaches_the_caller() -> None:
    movers = Movers(1)
    gate = threading.Event()

    def fail() -> Scan:
        gate.wait()
        raise OSError("disk full")

    failing = movers.submit(fail, 3, 1)
    queued = [movers.submit(lambda: Scan("never", 0), 3, 1) for _ in range(3)]
    closer = threading.Thread(target=movers.close)
    closer.start()  # cancels the queue, then waits for the running job
    deadline = time.monotonic() + 10
    while not all(job.cancelled() for job in queued) and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    closer.join()
    assert all(job.cancelled() for job in queued)
    with pytest.raises(OSError, match="disk full"):
        failing.result()
    with pytest.raises(RuntimeError, match="closed"):
        movers.submit(lambda: Scan("late", 0), 3, 1)
