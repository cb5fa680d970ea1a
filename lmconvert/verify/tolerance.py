"""What `verify` calls agreement, per compute dtype. docs/tolerances.md explains
the numbers; golden files record them, so a regression check holds the bar it was recorded with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

FP32_MAX_ABS = 1e-5  # max |logit difference| allowed in fp32
FP32_POINT_RTOL = 1e-5  # fp32 hidden states: max |Δ| <= this x max(1, max |reference|)
FAITHFULNESS = 1.25  # bf16/fp16: our error vs the fp32 reference <= this x transformers' own


@dataclass(frozen=True)
class Tolerance:
    dtype: str
    logits_max_abs: float | None = None  # fp32 only
    point_rtol: float | None = None  # fp32 only
    faithfulness: float | None = None  # low precision only
    logits_rtol: float | None = None  # fp32 with our side tensor-parallel: the logits' bar, relative (`split`)

    @classmethod
    def for_dtype(cls, dtype: str) -> Tolerance:
        if dtype == "float32":
            return cls(dtype, logits_max_abs=FP32_MAX_ABS, point_rtol=FP32_POINT_RTOL)
        return cls(dtype, faithfulness=FAITHFULNESS)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tolerance:
        return cls(**{k: data.get(k) for k in ("dtype", "logits_max_abs", "point_rtol", "faithfulness",
                                                 "logits_rtol")})

    @property
    def exact(self) -> bool:
        """fp32 compares with transformers directly; low precision compares errors against fp32."""
        return self.faithfulness is None

    def split(self) -> Tolerance:
        """The fp32 bar for our side run tensor-parallel: each rank's row-parallel layers (o, down)
        produce a partial sum that an all-reduce adds, so the logits round as a differently blocked
        sum would, as cached decoding's do, and take the same relative bar as the hidden states
        (docs/tolerances.md). Low precision is judged by faithfulness, unchanged."""
        return replace(self, logits_max_abs=None, logits_rtol=self.point_rtol) if self.exact else self

    def logits_limit(self, scale: float) -> float:
        """fp32: the largest max |Δlogit| allowed, given the reference logits' max |value|."""
        return self.logits_max_abs if self.logits_rtol is None else self.logits_rtol * max(1.0, scale)

    def criterion(self) -> str:
        if self.exact:
            logits = f"{self.logits_max_abs:g}" if self.logits_rtol is None else \
                f"{self.logits_rtol:g} x max(1, max |ref|) (sums split across tensor-parallel ranks)"
            return (f"max |Δlogit| <= {logits}; every hidden state and decoding step max |Δ| <= "
                    f"{self.point_rtol:g} x max(1, max |ref|); greedy tokens equal")
        return (f"mean error vs fp32 reference <= {self.faithfulness}x transformers' own, for the logits and "
                "every hidden state")

    def point_limit(self, scale: float, reference_error: float | None) -> float:
        """The largest error a hidden state may show: fp32 max |Δ| relative to its magnitude, or
        in low precision our mean error against fp32 relative to transformers' own."""
        if self.exact:
            return self.point_rtol * max(1.0, scale)
        return self.faithfulness * (reference_error or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """`logits_rtol` only where it is set (under torchrun), so one-process reports keep their keys."""
        return {k: v for k, v in asdict(self).items() if k != "logits_rtol" or v is not None}
