"""`lmconvert verify --files`: re-hash a canonical checkpoint against the sha256 sums that
lmconvert.json recorded when it was written, and name every tensor and file that changed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .canonical import META_FILE, read_meta
from .safetensors_dir import TensorSource
from .shards import file_sha256, tensor_sha256


@dataclass
class IntegrityReport:
    changed_files: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    changed_tensors: list[str] = field(default_factory=list)
    checked_files: int = 0
    checked_tensors: int = 0

    @property
    def passed(self) -> bool:
        return not (self.changed_files or self.missing_files or self.changed_tensors)

    def lines(self) -> list[str]:
        out = [f"checked {self.checked_files} files and {self.checked_tensors} tensors against {META_FILE}"]
        out += [f"changed file: {f}" for f in self.changed_files]
        out += [f"missing file: {f}" for f in self.missing_files]
        out += [f"changed tensor: {t}" for t in self.changed_tensors]
        out.append("verdict: " + ("PASS" if self.passed else "FAIL"))
        return out


def check_files(checkpoint: Path) -> IntegrityReport:
    meta = read_meta(checkpoint)
    report = IntegrityReport()
    for name, digest in sorted(meta.files.items()):
        path = checkpoint / name
        if not path.is_file():
            report.missing_files.append(name)
            continue
        report.checked_files += 1
        if file_sha256(path) != digest:
            report.changed_files.append(name)
    if report.missing_files:
        return report
    with TensorSource(checkpoint) as source:
        for name, digest in sorted(meta.tensors.items()):
            report.checked_tensors += 1
            if name not in source.files or tensor_sha256(source.get(name)) != digest:
                report.changed_tensors.append(name)
    return report
