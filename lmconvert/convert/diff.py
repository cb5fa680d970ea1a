"""`lmconvert diff A B`: two checkpoints, in any formats lmconvert reads, compared tensor by tensor.

Each side is opened as any input is (`open_checkpoint`), so tensors are matched by their canonical
names and compared in the canonical layout, whatever the files call or permute them: a GGUF's q/k
rows are unpermuted, an HF fused qkv is split, a quantized tensor is dequantized as the readers do
(float32, `gguf.quants.dequantize`). One pair is in memory at a time, and it is compared in slices
of rows, so memory holds the two tensors and little more, as conversion holds one.

Per tensor: shape and stored type on each side, max |Δ|, the relative error ‖A−B‖ / max(‖A‖, ‖B‖)
(Frobenius norms), and whether the bits are identical. A pair is
- identical: same dtype, same shape, same bytes (NaNs the same NaN, and -0.0 is not 0.0);
- within tolerance: same shape, and every element |a − b| <= atol + rtol·max(|a|, |b|) (symmetric,
  so `diff A B` and `diff B A` agree), NaN matching NaN; with the default atol = rtol = 0 that is
  equal values, in types that may differ (bfloat16 beside float32);
- different: otherwise, or of another shape;
- only in A / only in B: a tensor one model has and the other lacks (an untied head, biases, layers).
The models' decoder configs are compared too and their differences listed: `diff` judges weights
only (`verify` judges what a model computes), so they do not change the verdict.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmconvert.arch.errors import CheckFailed
from lmconvert.formats.atomic import atomic_file, check_output
from lmconvert.formats.checkpoint import Checkpoint, open_checkpoint
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object
from lmconvert.formats.source import TensorReader
from lmconvert.mappings.tables.transforms import same_bits

from .plan import Progress

if TYPE_CHECKING:
    import torch

SCHEMA = "lmconvert.diff/1"
STATUSES = ("identical", "within tolerance", "different", "only in A", "only in B")
SLICE = 1 << 22  # elements compared at once: the temporaries of a comparison are a few of these


class TensorsDiffer(CheckFailed, RuntimeError):
    """Some tensor differs beyond the tolerance, or only one side has it (exit 1)."""


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for option, value in (("--atol", self.atol), ("--rtol", self.rtol)):
            if not (math.isfinite(value) and value >= 0):
                raise InputError(f"{option} {value}: must be a finite number, 0 or more")

    def criterion(self) -> str:
        if self.atol == 0 and self.rtol == 0:
            return "equal values (atol 0, rtol 0)"
        return f"|a - b| <= {self.atol:g} + {self.rtol:g} * max(|a|, |b|)"


@dataclass
class TensorDiff:
    name: str  # canonical
    status: str  # one of STATUSES
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None  # as stored: torch's name, or a GGUF tensor's ggml type (Q8_0)
    dtype_b: str | None = None
    max_abs: float | None = None  # None: not compared (one side only, or shapes differ)
    rel: float | None = None
    bits_identical: bool = False
    outside: int = 0  # elements beyond the tolerance
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status,
                "a": None if self.shape_a is None else {"shape": list(self.shape_a), "dtype": self.dtype_a},
                "b": None if self.shape_b is None else {"shape": list(self.shape_b), "dtype": self.dtype_b},
                "max_abs": _number(self.max_abs), "rel": _number(self.rel), "bits_identical": self.bits_identical,
                "outside_tolerance": self.outside, "note": self.note or None}


def _number(x: float | None) -> float | str | None:
    """JSON has no NaN or Infinity: those are written as the strings "nan" and "inf"."""
    return x if x is None or math.isfinite(x) else str(x)


@dataclass
class DiffReport:
    a: str
    b: str
    format_a: str
    format_b: str
    tolerance: Tolerance
    names: list[str]  # every canonical name, in the order compared
    config: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # decoder config fields that differ
    rows: list[TensorDiff] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for row in self.rows:
            counts[row.status] += 1
        return counts

    @property
    def passed(self) -> bool:
        return all(row.status in ("identical", "within tolerance") for row in self.rows)

    def failures(self) -> str:
        counts = self.counts()
        return ", ".join(f"{counts[s]} {s}" for s in STATUSES[2:] if counts[s])

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "a": {"path": self.a, "format": self.format_a},
                "b": {"path": self.b, "format": self.format_b}, "passed": self.passed,
                "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                              "criterion": self.tolerance.criterion()},
                "summary": {s.replace(" ", "_"): n for s, n in self.counts().items()},
                "config_differences": {k: {"a": a, "b": b} for k, (a, b) in self.config.items()},
                "tensors": [row.to_dict() for row in self.rows]}

    # -- text: a header, one line per tensor as it is compared, then the summary -------------------
    def _widths(self) -> list[int]:
        return [max([len("tensor"), *(len(n) for n in self.names)]), 16, 9, 16, 9, 9, 9, 6]

    def header(self) -> str:
        lines = [f"A  {self.a}  ({self.format_a})", f"B  {self.b}  ({self.format_b})"]
        lines += [f"note: the decoder configs differ in {name}: {a!r} (A) vs {b!r} (B)"
                  + (", the same float32 (as GGUF stores it)" if _same_float32(a, b) else "")
                  for name, (a, b) in self.config.items()]
        head = ["tensor", "shape A", "dtype A", "shape B", "dtype B", "max|Δ|", "rel.err", "bits", "verdict"]
        return "\n".join([*lines, "", _line(head, self._widths())])

    def line(self, row: TensorDiff) -> str:
        def shape(s: tuple[int, ...] | None) -> str:
            return "-" if s is None else "[" + ", ".join(map(str, s)) + "]"

        def num(x: float | None) -> str:
            return "-" if x is None else "0" if x == 0 else f"{x:.2e}" if math.isfinite(x) else str(x)

        bits = "-" if row.max_abs is None else "same" if row.bits_identical else "differ"
        verdict = row.status + (f" ({row.note})" if row.note else "")
        return _line([row.name, shape(row.shape_a), row.dtype_a or "-", shape(row.shape_b), row.dtype_b or "-",
                      num(row.max_abs), num(row.rel), bits, verdict], self._widths())

    def summary(self) -> str:
        counts = self.counts()
        worst = max((r for r in self.rows if r.max_abs is not None and r.status != "identical"),
                    key=lambda r: (math.isnan(r.max_abs or 0), r.max_abs), default=None)
        lines = ["", f"{len(self.rows)} tensors: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES),
                 f"criterion: {self.tolerance.criterion()}"]
        if worst is not None:
            lines.append(f"largest max|Δ|: {worst.max_abs:.3e} in {worst.name} (rel.err {worst.rel:.3e})")
        lines.append("verdict: " + ("SAME within tolerance" if self.passed else "DIFFERENT"))
        return "\n".join(lines)

    def table(self) -> str:
        return "\n".join([self.header(), *(self.line(r) for r in self.rows), self.summary()])


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, [*widths, 0], strict=True)).rstrip()


def is_diff_report(file: Path) -> bool:
    """Whether `file` is a JSON report `diff` wrote (so --force may replace it)."""
    try:
        schema = read_json_object(file).get("schema")
    except InputError:
        return False
    return isinstance(schema, str) and schema.split("/")[0] == SCHEMA.split("/")[0]


def write_report(path: Path, report: DiffReport, force: bool) -> None:
    """The JSON report, atomically (`formats.atomic`)."""
    with atomic_file(path, force, is_diff_report, f"--json {path}") as tmp:
        tmp.write_text(json.dumps(report.to_dict(), indent=2) + "\n")


def diff(a: Path, b: Path, tolerance: Tolerance, json_out: Path | None = None, force: bool = False,
         show: Callable[[str], None] | None = None, progress: Progress | None = None) -> DiffReport:
    """Compare A and B tensor by tensor; `show` gets the header and each tensor's line as they come.
    `json_out` (written when done) is checked first: never an input, inside one or holding one."""
    if json_out is not None:
        check_output(json_out, force, (a, b), is_diff_report, f"--json {json_out}")
    with open_checkpoint(a) as left, open_checkpoint(b) as right:
        names = in_read_order(left, right)
        report = DiffReport(str(a), str(b), left.format, right.format, tolerance, names,
                            config_differences(left, right))
        if show is not None:
            show(report.header())
        both = [n for n in names if n in left.plan and n in right.plan]  # the ones read
        readers = Held.of(left, both), Held.of(right, both)
        for done, name in enumerate(names, 1):
            row = compare(name, left, right, tolerance, readers)
            report.rows.append(row)
            if show is not None:
                show(report.line(row))
            if progress is not None:
                progress(done, len(names))
    if show is not None:
        show(report.summary())
    if json_out is not None:
        write_report(json_out, report, force)
    return report


def config_differences(a: Checkpoint, b: Checkpoint) -> dict[str, tuple[Any, Any]]:
    """The decoder config fields (ArchConfig, nested ones as `norm.eps`) whose values differ."""
    left, right = _flat(a.arch.to_dict()), _flat(b.arch.to_dict())
    return {k: (left.get(k), right.get(k)) for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)}


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _same_float32(a: Any, b: Any) -> bool:  # noqa: ANN401 - any config value
    """Two floats that float32 holds as one value (GGUF stores its float metadata so: 1e-6 comes back
    as 9.999999974752427e-07)."""
    import struct

    floats = all(isinstance(x, float) for x in (a, b))
    return floats and struct.pack("<f", a) == struct.pack("<f", b)


def in_read_order(a: Checkpoint, b: Checkpoint) -> list[str]:
    """Every canonical name (A's, then those only B has), the names that share a stored tensor on
    either side next to each other: one expert's gate and up come from the one `gate_up_proj` of its
    layer in transformers 5's layout, and every expert's gate from one stacked tensor in GGUF. So each
    stored tensor is read once: kept by `Held` (or by the GGUF reader, which keeps the last one) until
    the last name that needs it has been compared, and no longer."""
    names = [*a.plan, *(n for n in b.plan if n not in a.plan)]
    parent: dict[object, object] = {}

    def root(x: object) -> object:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]  # type: ignore[index]
            x = parent[x]
        return x

    for name in names:
        for side, ckpt in (("A", a), ("B", b)):
            if name not in ckpt.plan:
                continue
            parts = getattr(ckpt.source.tensors, "parts", None)  # a GGUF tensor's stacked experts
            for stored in ckpt.stored_names(name):
                for key in ((side, stored), *((side, "part", p) for p in (parts(stored) if parts else ()))):
                    parent[root(key)] = root(name)
    groups: dict[object, list[str]] = {}
    for name in names:
        groups.setdefault(root(name), []).append(name)
    return [name for group in groups.values() for name in group]


class Held:
    """A checkpoint's stored tensors, each kept after it is read for as long as some canonical
    tensor still to be compared needs it (several experts from one fused tensor), and no longer."""

    def __init__(self, reader: TensorReader, uses: Counter[str]) -> None:
        self.reader, self.uses = reader, uses
        self._held: dict[str, torch.Tensor] = {}

    @classmethod
    def of(cls, ckpt: Checkpoint, names: list[str]) -> Held:
        return cls(ckpt.source.tensors, Counter(s for n in names for s in ckpt.stored_names(n)))

    def get(self, name: str) -> torch.Tensor:
        tensor = self._held.pop(name, None)
        if tensor is None:
            tensor = self.reader.get(name)
        self.uses[name] -= 1
        if self.uses[name] > 0:
            self._held[name] = tensor
        return tensor

    def __getattr__(self, attr: str) -> Any:  # noqa: ANN401 - names, shape, where...: the reader's
        return getattr(self.reader, attr)


def compare(name: str, a: Checkpoint, b: Checkpoint, tolerance: Tolerance,
            readers: tuple[Held, Held] | None = None) -> TensorDiff:
    """One canonical tensor of both sides, each read (and dequantized) only here."""
    if name not in b.plan:
        return TensorDiff(name, "only in A", a.shape(name), dtype_a=a.stored_type(name))
    if name not in a.plan:
        return TensorDiff(name, "only in B", shape_b=b.shape(name), dtype_b=b.stored_type(name))
    row = TensorDiff(name, "different", a.shape(name), b.shape(name), a.stored_type(name), b.stored_type(name))
    if row.shape_a != row.shape_b:
        row.note = "shapes differ"
        return row
    x, y = (a.tensor(name), b.tensor(name)) if readers is None else \
        (a.tensor(name, readers[0]), b.tensor(name, readers[1]))
    row.bits_identical = same_bits(x, y)
    if row.bits_identical:
        row.max_abs, row.rel, row.status = 0.0, 0.0, "identical"
        return row
    row.max_abs, row.rel, row.outside = measure(x, y, tolerance)
    if row.outside == 0:
        row.status = "within tolerance"
    return row


def measure(x: torch.Tensor, y: torch.Tensor, tolerance: Tolerance) -> tuple[float, float, int]:
    """(max |Δ|, ‖x−y‖ / max(‖x‖, ‖y‖), elements beyond the tolerance), computed in float32
    (float64 where a side is), a slice of rows at a time. max |Δ| is NaN where a NaN faces a number."""
    import torch

    wide = torch.float64 if torch.float64 in (x.dtype, y.dtype) else torch.float32
    if x.dim() == 0:
        x, y = x.reshape(1), y.reshape(1)
    rows = max(1, SLICE // max(1, math.prod(x.shape[1:])))
    max_abs, outside = 0.0, 0
    squares = {"d": 0.0, "x": 0.0, "y": 0.0}
    for start in range(0, x.shape[0], rows):
        p, q = x[start:start + rows].to(wide), y[start:start + rows].to(wide)
        same = (p == q) | (p.isnan() & q.isnan())  # equal infinities too, whose difference is NaN
        delta = torch.where(same, torch.zeros((), dtype=wide), (p - q).abs())
        limit = tolerance.atol + tolerance.rtol * torch.maximum(p.abs(), q.abs())
        outside += int((~(same | (delta <= limit))).sum())
        if bool(delta.isnan().any()):
            max_abs = math.nan
        elif not math.isnan(max_abs):
            max_abs = max(max_abs, float(delta.max()) if delta.numel() else 0.0)
        for key, t in (("d", delta), ("x", p), ("y", q)):
            finite = t[t.isfinite()].double()
            squares[key] += float((finite * finite).sum())
    scale = math.sqrt(max(squares["x"], squares["y"]))
    error = math.sqrt(squares["d"])
    rel = error / scale if scale > 0 else (0.0 if error == 0 else math.inf)
    return max_abs, rel if math.isfinite(max_abs) else max_abs, outside
