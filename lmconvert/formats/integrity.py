"""`lmconvert verify --files`: re-hash a canonical checkpoint against the digests that
lmconvert.json recorded when it was written, and name every tensor and file that changed, is
missing, or was added (a file lmconvert.json does not list). Exports check the same record as
they read (`check_shards`, and each tensor's digest as it is copied).

A shard is covered by its header's digest, its size and its tensors' digests (safetensors leaves no
byte between tensors), so each byte is read once, as when it was written.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .canonical import META_FILE, CanonicalMeta, listed_file, read_meta
from .digest import digest_of, file_chunks, file_digest, scan
from .errors import InputError, IntegrityError
from .safetensors_dir import TensorSource


@dataclass
class IntegrityReport:
    changed_files: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    unlisted_files: list[str] = field(default_factory=list)  # in the directory, not in lmconvert.json
    changed_tensors: list[str] = field(default_factory=list)
    checked_files: int = 0
    checked_tensors: int = 0

    @property
    def passed(self) -> bool:
        return not (self.changed_files or self.missing_files or self.unlisted_files or self.changed_tensors)

    def problems(self) -> list[str]:
        return self.changed_tensors + self.changed_files + self.missing_files + self.unlisted_files

    def lines(self) -> list[str]:
        out = [f"checked {self.checked_files} files and {self.checked_tensors} tensors against {META_FILE}"]
        out += [f"changed file: {f}" for f in self.changed_files]
        out += [f"missing file: {f}" for f in self.missing_files]
        out += [f"unlisted file: {f} (not in {META_FILE}: added after conversion)" for f in self.unlisted_files]
        out += [f"changed tensor: {t}" for t in self.changed_tensors]
        out.append("verdict: " + ("PASS" if self.passed else "FAIL"))
        return out


def _shard_intact(path: Path, expected: dict[str, object], algorithm: str) -> bool:
    """Size and header as recorded (the tensors' bytes are checked one by one)."""
    size = path.stat().st_size
    if not isinstance(expected, dict) or size != expected.get("bytes") or size < 8:
        return False
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        head = f.read(length) if 8 + length <= size else b""
    return digest_of(struct.pack("<Q", length) + head, algorithm) == expected.get("header")


def check_shards(checkpoint: Path, meta: CanonicalMeta) -> None:
    """Each shard's size and header as lmconvert.json records them (format 2), before an export
    reads it: a header edited in place could give the same bytes another dtype or shape."""
    for name, expected in sorted(meta.shards.items()):
        path = listed_file(checkpoint, name)
        if not path.is_file() or not _shard_intact(path, expected, meta.hash):
            raise IntegrityError(f"{path}: its header or size differs from what {META_FILE} records (or it is "
                                 "missing); the checkpoint changed after conversion: run `lmconvert verify --files` "
                                 "and re-convert")


def check_files(checkpoint: Path) -> IntegrityReport:
    meta = read_meta(checkpoint)
    report = IntegrityReport()
    algorithm = meta.hash
    recorded = [(name, lambda p, d=digest: file_digest(p, algorithm) == d) for name, digest in meta.files.items()]
    recorded += [(name, lambda p, e=expected: _shard_intact(p, e, algorithm)) for name, expected in meta.shards.items()]
    paths = {name: listed_file(checkpoint, name) for name, _ in recorded}  # refuses ../x before reading anything
    report.unlisted_files = sorted(p.name for p in checkpoint.iterdir() if p.name not in {META_FILE, *paths})
    for name, intact in sorted(recorded, key=lambda item: item[0]):  # a name may be listed twice
        path = paths[name]
        if not path.is_file():
            report.missing_files.append(name)
            continue
        report.checked_files += 1
        if not intact(path):
            report.changed_files.append(name)
    if report.missing_files:
        return report
    try:
        source = TensorSource(checkpoint)
    except InputError:
        if report.changed_files:  # a damaged header or index, already named above
            return report
        raise
    with source:
        for name, digest in sorted(meta.tensors.items()):
            report.checked_tensors += 1
            if name not in source.files:
                report.changed_tensors.append(name)
                continue
            path, start, end = source.raw_location(name)
            if scan(file_chunks(path, start, end), source.dtype_name(name), algorithm, checked=False).digest != digest:
                report.changed_tensors.append(name)
                if path.name not in report.changed_files:  # its shard changed with it
                    report.changed_files.append(path.name)
    report.changed_files.sort()
    return report
