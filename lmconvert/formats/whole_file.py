"""A source file's sha256 as its origin announced it, checked against the bytes a conversion reads.

The Hub announces each LFS file's sha256, and huggingface_hub checks only the size of what it
downloads. A conversion reads every byte of a safetensors file anyway, in the workers that move
tensors (shards.py), but hashes each tensor on its own, with BLAKE3, while a file's sha256 must
see all its bytes in order. So each chunk a worker reads is also fed to its file's sha256 when it
comes next in the file, and only then: the hash always covers exactly the file's first `position`
bytes. A run read while another worker still reads the run before it cannot be fed; it is read
again, from the page cache it has just gone through, by whichever worker brings the hash up to
it. So is what no worker reads (the header, tensors cast or transformed on the way), and at the
end whatever is left. Each byte is read from the disk once; the sha256 itself (1.5 GB/s on one
core here) is the cost, one core per file at a time.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .digest import file_chunks
from .errors import InputError


@dataclass(frozen=True)
class Announced:
    """The sha256 a file's origin announced for it; `label` is the file as the user knows it."""

    path: Path
    sha256: str
    label: str


class AnnouncedMismatch(InputError):
    """Bytes that are not the ones announced: the caller knows what to do about its own files."""

    def __init__(self, announced: Announced, found: str) -> None:
        super().__init__(f"{announced.label}: its sha256 is {found}, not the announced {announced.sha256}; "
                         "the file is corrupt or was altered: fetch it again")
        self.announced = announced
        self.found = found


class WholeFileHash:
    """The sha256 of one file, fed in order by the threads that read it. `read` are the byte
    ranges workers will read and feed through `fed`; the rest is read by `catch_up` and `finish`."""

    def __init__(self, announced: Announced, read: Iterable[tuple[int, int]]) -> None:
        self.announced = announced
        self.size = os.path.getsize(announced.path)
        self._hash = hashlib.sha256()
        self._position = 0  # the hash covers bytes [0, position)
        self._feeding = False  # a thread is adding the bytes at `position`
        self._lock = threading.Lock()
        self._unfed: dict[int, int] = {}  # start -> end: ranges to read again when the hash reaches them
        covered = 0
        for start, end in sorted(read):
            if start > covered:
                self._unfed[covered] = start
            covered = max(covered, end)
        if 0 < covered < self.size:
            self._unfed[covered] = self.size
        if covered:
            self.catch_up()  # the header, before the first worker reads what follows it

    def feed(self, offset: int, chunk: memoryview) -> bool:
        """Add the file's bytes at `offset` if they come next; False if they do not."""
        with self._lock:
            if offset != self._position or self._feeding:
                return False
            self._feeding = True  # hashed outside the lock: other threads only learn they are not next
        try:
            self._hash.update(chunk)
        finally:
            with self._lock:
                self._position += len(chunk)
                self._feeding = False
        return True

    def fed(self, chunks: Iterable[memoryview], offset: int) -> Iterator[memoryview]:
        """The chunks of the file from `offset` on, each fed in passing; what could not be is
        registered, to be read again once the hash reaches it."""
        missed = None
        for chunk in chunks:
            if not self.feed(offset, chunk) and missed is None:
                missed = offset
            offset += len(chunk)
            yield chunk
        if missed is not None:
            with self._lock:
                self._unfed[missed] = offset

    def catch_up(self, buffer: memoryview | None = None) -> None:
        """Read again and feed the registered ranges that now come next, for as long as they do."""
        while True:
            with self._lock:
                start = self._position
                end = self._unfed.pop(start, None)
            if end is None:
                return
            for chunk in file_chunks(self.announced.path, start, end, buffer):
                if not self.feed(start, chunk):  # another reader of the same bytes came first
                    return  # (what it leaves, `finish` reads)
                start += len(chunk)

    def finish(self) -> None:
        """Once no one else reads the file: hash what is left, and refuse bytes not the announced ones."""
        for chunk in file_chunks(self.announced.path, self._position, self.size):
            self._hash.update(chunk)
        self._position = self.size
        found = self._hash.hexdigest()
        if found != self.announced.sha256:
            raise AnnouncedMismatch(self.announced, found)
