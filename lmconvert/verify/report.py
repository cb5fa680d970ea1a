"""`verify`'s result: the verdict and every figure behind it, as a compact table for people and as
JSON (schema `lmconvert.verify/2`, documented in docs/verify.md) for machines."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .agreement import Generation
from .localize import LayerRow, PointError, first_failure, profile
from .tolerance import Tolerance

SCHEMA = "lmconvert.verify/2"


@dataclass
class Report:
    checkpoint: str
    reference: str | None  # transformers' checkpoint, None when checked against a golden file
    golden: str | None
    dtype: str
    device: str
    batch: int
    seq_len: int
    tokens: str  # where the ids came from
    streamed: bool  # our side ran block by block (--max-memory)
    max_memory: int | None
    logits: dict[str, float]  # ours vs transformers in this dtype: max_abs, mean_abs, kl, top1, top5
    logits_passed: bool
    points: list[PointError]
    tolerance: Tolerance
    versions: dict[str, Any]
    generation: Generation | None = None
    ours_error: float | None = None  # low precision: mean |ours - fp32 reference|
    reference_error: float | None = None  # low precision: mean |transformers - fp32 reference|
    vs_fp32: dict[str, dict[str, float]] | None = None  # low precision: each side's logit stats vs fp32
    notes: list[str] = field(default_factory=list)
    tensor_parallel: int | None = None  # our side ran split over this many ranks (torchrun)

    @property
    def first_failure(self) -> PointError | None:
        return first_failure(self.points)

    @property
    def passed(self) -> bool:
        return (self.logits_passed and self.first_failure is None
                and (self.generation is None or self.generation.passed is not False))

    def failures(self) -> list[str]:
        """What failed, in a few words each: the logits, the first point, the generation."""
        out = [] if self.logits_passed else ["logits"]
        if self.first_failure is not None:
            out.append(f"first at {self.first_failure.name}")
        if self.generation is not None and self.generation.passed is False:
            out.append("greedy generation")
        return out

    @property
    def criterion(self) -> str:
        return self.tolerance.criterion()

    @property
    def ratio(self) -> float | None:
        if self.ours_error is None:
            return None
        return self.ours_error / self.reference_error if self.reference_error else math.inf

    def to_dict(self) -> dict[str, Any]:
        failure = self.first_failure
        return {
            "schema": SCHEMA, "passed": self.passed, "verdict": "PASS" if self.passed else "FAIL",
            "criterion": self.criterion, "checkpoint": self.checkpoint, "reference": self.reference,
            "golden": self.golden, "dtype": self.dtype, "device": self.device, "batch": self.batch,
            "seq_len": self.seq_len, "tokens": self.tokens, "streamed": self.streamed, "max_memory": self.max_memory,
            "tensor_parallel": self.tensor_parallel,
            **self.logits, "ours_error": self.ours_error, "reference_error": self.reference_error,
            "ratio": self.ratio, "logits_passed": self.logits_passed, "vs_fp32": self.vs_fp32,
            "first_failure": failure.to_dict() if failure else None,
            "points": [p.to_dict() for p in self.points],
            "layers": [row.to_dict() for row in profile(self.points)],
            "generation": self.generation.to_dict() if self.generation else None,
            "tolerances": self.tolerance.to_dict(), "versions": self.versions, "notes": self.notes,
        }

    def table(self) -> str:
        return "\n".join([_summary(self), "", _profile(self)])


def _rows(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _summary(r: Report) -> str:
    ours = r.checkpoint + ("  (streamed block by block)" if r.streamed else "") + \
        (f"  (tensor-parallel over {r.tensor_parallel} ranks)" if r.tensor_parallel else "")
    if r.golden:
        recorded = r.versions.get("reference", {}).get("transformers")
        against = f"golden file {r.golden} (transformers {recorded or '?'})"
    else:
        against = f"{r.reference} (transformers {r.versions.get('transformers') or '?'}, eager)"
    rows = [("checkpoint", ours), ("reference", against), ("dtype / device", f"{r.dtype} / {r.device}"),
            ("tokens", f"{r.batch} x {r.seq_len}, {r.tokens}"),
            ("max |Δlogit|", f"{r.logits['max_abs']:.3e}"), ("mean |Δlogit|", f"{r.logits['mean_abs']:.3e}"),
            ("KL(ref || ours)", f"{r.logits['kl']:.3e}"),
            ("top-1 / top-5 agreement", f"{r.logits['top1']:.2%} / {r.logits['top5']:.2%}")]
    if r.ours_error is not None:
        rows += [("ours vs fp32 reference", f"{r.ours_error:.3e}"),
                 ("transformers vs fp32 reference", f"{r.reference_error:.3e}"), ("ratio", f"{r.ratio:.3f}")]
        if r.vs_fp32:
            rows.append(("KL(fp32 || ours / transformers)",
                         f"{r.vs_fp32['ours']['kl']:.3e} / {r.vs_fp32['reference']['kl']:.3e}"))
    if r.generation is not None:
        judged = {None: " (reported, not judged in low precision)", True: "", False: "  FAIL"}[r.generation.passed]
        rows.append(("greedy generation", r.generation.summary() + judged))
    failure = r.first_failure
    rows += [("criterion", r.criterion), ("first failure", failure.describe() if failure else "none"),
             ("verdict", "PASS" if r.passed else "FAIL")]
    rows += [("note", note) for note in r.notes]
    return _rows(rows)


def _cell(point: PointError | None) -> str:
    if point is None:
        return ""
    if point.reference_error is None:
        return f"{point.max_abs:.1e}"
    ratio = point.ratio
    return "inf" if ratio is None or math.isinf(ratio) else f"{ratio:.2f}"


def _profile(r: Report) -> str:
    rows: list[LayerRow] = profile(r.points)
    if not rows:
        return "per-layer profile: no points could be compared"
    if r.tolerance.exact:
        head = ["layer", "attn max|Δ|", "mlp max|Δ|", "out max|Δ|", "out mean|Δ|", ""]
    else:
        head = ["layer", "attn ratio", "mlp ratio", "out ratio", "out err vs fp32", ""]
    lines = [head]
    failure = r.first_failure
    for row in rows:
        out = row.output
        mark = ""
        if row.failed:
            mark = f"FAIL at {row.failed}" + ("  <- first" if failure and row.label in (str(failure.layer),
                                                                                      failure.name) else "")
        lines.append([row.label, _cell(row.attn), _cell(row.mlp), _cell(out),
                      f"{out.mean_abs:.1e}" if out else "", mark])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    title = ("per-layer profile (worst point per group; fp32: max |Δ| vs transformers)" if r.tolerance.exact else
             "per-layer profile (worst point per group: our mean error / transformers' own, vs fp32)")
    return title + "\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                                    for line in lines)
