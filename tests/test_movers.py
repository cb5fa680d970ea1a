"""The workers that move tensors: which file each takes next, and that every job's result, error
or cancellation reaches whoever waits on it."""

from __future__ import annotations

import threading
import time

import pytest

from lmconvert.formats.digest import Scan
from lmconvert.formats.shards import Movers, next_file


def test_an_idle_worker_takes_a_file_no_one_writes() -> None:
    # file 3 has more bytes left, but a worker is writing it
    assert next_file([3, 4], {3: 1, 4: 0}, {3: 900, 4: 100}) == 4


def test_of_free_files_the_one_with_most_bytes_left_goes_first() -> None:
    assert next_file([3, 4, 5], {3: 0, 4: 0, 5: 0}, {3: 100, 4: 700, 5: 300}) == 4


def test_a_file_is_shared_only_when_every_file_with_work_is_taken() -> None:
    assert next_file([3, 4], {3: 1, 4: 1}, {3: 100, 4: 700}) == 4


def test_a_hash_the_caller_waits_for_goes_before_any_file() -> None:
    assert next_file([3, None], {3: 0, None: 0}, {3: 10**9, None: 1}) is None


def test_two_workers_on_two_files_never_write_one_file_at_once() -> None:
    """The two workers run in lockstep (a barrier inside every job), so each step shows which two
    files are being written together."""
    movers = Movers(2)
    barrier = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    running: list[int] = []
    together: list[tuple[int, ...]] = []

    def job(file: int):
        def work() -> Scan:
            with lock:
                running.append(file)
            barrier.wait()  # both workers are inside a job
            with lock:
                together.append(tuple(sorted(running)))
            barrier.wait()  # both have looked
            with lock:
                running.remove(file)
            barrier.wait()
            return Scan(f"{file}", 0)
        return work

    try:
        with movers._ready:  # every job is queued before either worker chooses
            jobs = [movers.submit(job(f), f, 100) for f in (3, 3, 3, 4, 4, 4)]
        assert [j.result().digest for j in jobs] == ["3", "3", "3", "4", "4", "4"]
    finally:
        movers.close()
    assert together == [(3, 4)] * 6


def test_close_cancels_what_has_not_started_and_an_error_reaches_the_caller() -> None:
    movers = Movers(1)
    gate = threading.Event()

    def fail() -> Scan:
        gate.wait()
        raise OSError("disk full")

    failing = movers.submit(fail, 3, 1)
    queued = [movers.submit(lambda: Scan("never", 0), 3, 1) for _ in range(3)]
    deadline = time.monotonic() + 10
    while not failing.running() and time.monotonic() < deadline:  # the one worker has taken it
        time.sleep(0.001)
    closer = threading.Thread(target=movers.close)
    closer.start()  # cancels the queue, then waits for the running job
    while not all(job.cancelled() for job in queued) and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    closer.join()
    assert all(job.cancelled() for job in queued)
    with pytest.raises(OSError, match="disk full"):
        failing.result()
    with pytest.raises(RuntimeError, match="closed"):
        movers.submit(lambda: Scan("late", 0), 3, 1)
