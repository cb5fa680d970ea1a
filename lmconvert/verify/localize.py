"""Where parity breaks: every point of our forward pass against the reference's, in the order we
compute them, so the first one beyond tolerance is the first operation that went wrong (every
later point inherits its error).

fp32 compares with transformers directly (max |Δ| against a bar scaled by the point's magnitude).
In bf16/fp16 both sides round, so each point asks the faithfulness question instead: is our mean
error against the fp32 reference at most 1.25x transformers' own error at that same point?

Both sides' points arrive in our layout (`layouts.py` converts the reference's by declaration),
so the two shapes must be equal. A point that could not be put in our layout, or whose shapes
differ, is not compared: it is reported as failed, with the reason, since nothing vouches for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .tolerance import Tolerance
from .trace import layer_of, sublayer_of

OwnErrors = dict[str, tuple[float, float]]  # point -> transformers' (mean, max) error vs fp32, low precision


@dataclass
class PointError:
    name: str  # canonical: "embed", "layers.3.attn.k", "layers.3" (block 3's output), "final_norm"
    layer: int | None
    sublayer: str  # "attn.k", "mlp.down", "output", or the name itself outside the blocks
    max_abs: float  # fp32: ours vs transformers; low precision: ours vs the fp32 reference
    mean_abs: float
    scale: float  # max |reference|
    limit: float  # fp32: the largest max |Δ| allowed; low precision: the largest mean error allowed
    passed: bool
    reference_error: float | None = None  # low precision: transformers' own mean error vs fp32
    reference_max: float | None = None  # low precision: transformers' own max error vs fp32
    problem: str | None = None  # why the point could not be compared (its figures are then NaN)

    @classmethod
    def uncompared(cls, name: str, problem: str) -> PointError:
        nan = math.nan
        return cls(name, layer_of(name), sublayer_of(name), nan, nan, nan, nan, False, problem=problem)

    @property
    def ratio(self) -> float | None:
        """Low precision: our error over transformers' (1.0 when both are exactly 0)."""
        if self.reference_error is None:
            return None
        if self.reference_error == 0:
            return 1.0 if self.mean_abs == 0 else math.inf
        return self.mean_abs / self.reference_error

    def to_dict(self) -> dict[str, Any]:
        """JSON has no NaN: an uncompared point's figures are null."""
        fields = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}
        return {**fields, "ratio": self.ratio}

    def describe(self) -> str:
        where = self.name if self.layer is None else f"layer {self.layer}, {self.sublayer} ({self.name})"
        if self.problem is not None:
            return f"{where}: not compared: {self.problem}"
        text = f"{where}: max |Δ| {self.max_abs:.3e}, mean |Δ| {self.mean_abs:.3e}"
        if self.reference_error is None:
            return text + f" (limit max |Δ| {self.limit:.1e})"
        return text + f" vs fp32; transformers' own mean {self.reference_error:.3e} (limit {self.limit:.3e})"


def _stats(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    diff = (ours.float() - ref.float()).abs()
    return float(diff.max()), float(diff.mean()), float(ref.float().abs().max())


def own_errors(theirs: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> OwnErrors:
    """transformers' own (mean, max) error at each point in low precision, against its fp32 run."""
    out = {}
    for name, t in theirs.items():
        if name in exact and exact[name].shape == t.shape:
            max_abs, mean_abs, _ = _stats(t, exact[name])
            out[name] = (mean_abs, max_abs)
    return out


def compare_points(ours: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tolerance: Tolerance,
                   own: OwnErrors | None = None, problems: Mapping[str, str] | None = None) -> list[PointError]:
    """Every point both sides have, in our order. `expected` holds transformers' points in fp32,
    or the fp32 reference's in low precision (with transformers' own errors in `own`), in our
    layout; `problems` names the reference's points that could not be put in it."""
    out = []
    for name, value in ours.items():
        if problems and name in problems:
            out.append(PointError.uncompared(name, problems[name]))
            continue
        ref = expected.get(name)
        if ref is None or (not tolerance.exact and (own is None or name not in own)):
            continue
        if ref.shape != value.shape:
            out.append(PointError.uncompared(name, f"our output has shape {tuple(value.shape)}, the reference's "
                                                   f"(in our declared layout) {tuple(ref.shape)}"))
            continue
        max_abs, mean_abs, scale = _stats(value, ref)
        if tolerance.exact:
            limit = tolerance.point_limit(scale, None)
            out.append(PointError(name, layer_of(name), sublayer_of(name), max_abs, mean_abs, scale, limit,
                                  max_abs <= limit))
        else:
            ref_mean, ref_max = own[name]
            limit = tolerance.point_limit(scale, ref_mean)
            out.append(PointError(name, layer_of(name), sublayer_of(name), max_abs, mean_abs, scale, limit,
                                  mean_abs <= limit, ref_mean, ref_max))
    return out


def first_failure(points: list[PointError]) -> PointError | None:
    return next((p for p in points if not p.passed), None)


def _group(point: PointError) -> str:
    if point.sublayer.startswith(("attn", "mixer")):  # the token mixer: attention, or a mixer kind (mixer_kinds)
        return "attn"
    if point.sublayer.startswith("mlp"):
        return "mlp"
    return "output"


@dataclass
class LayerRow:
    """One line of the per-layer profile: the worst figure of the attention points, of the MLP
    points, and the block's output; `failed` names the first failing point of the layer."""

    label: str
    attn: PointError | None
    mlp: PointError | None
    output: PointError | None
    failed: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.label, "failed": self.failed,
                **{k: getattr(self, k).name if getattr(self, k) else None for k in ("attn", "mlp", "output")}}


def _worst(points: list[PointError]) -> PointError | None:
    points = [p for p in points if p.problem is None]  # no figure to rank; `failed` names it
    if not points:
        return None
    if points[0].reference_error is None:
        return max(points, key=lambda p: p.max_abs)
    return max(points, key=lambda p: p.ratio or 0.0)


def profile(points: list[PointError]) -> list[LayerRow]:
    """Rows for the embedding, each layer, and the final norm, in order."""
    rows: dict[str, list[PointError]] = {}
    for point in points:
        label = str(point.layer) if point.layer is not None else point.name
        rows.setdefault(label, []).append(point)
    out = []
    for label, members in rows.items():
        groups = {g: [p for p in members if _group(p) == g] for g in ("attn", "mlp", "output")}
        failed = next((p.sublayer for p in members if not p.passed), None)
        out.append(LayerRow(label, _worst(groups["attn"]), _worst(groups["mlp"]), _worst(groups["output"]), failed))
    return out

