"""`lmconvert verify`: run our decoder and transformers on the same tokens and compare logits.

fp32 must agree element by element. In bf16 and fp16 both sides round, so agreement between
them is not the criterion; faithfulness is: our error against transformers run in fp32 may be at
most 1.25x transformers' own error in that dtype.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .canonical import is_canonical, read_meta
from .errors import InputError
from .hf_source import parse_dtype
from .load import arch_of, load
from .reference import load_reference, reference_logits

FP32_MAX_ABS = 1e-5  # max |logit difference| allowed in fp32
FAITHFULNESS = 1.25  # bf16/fp16: our mean error vs fp32 reference <= this x transformers' own


@dataclass
class Report:
    dtype: str
    device: str
    batch: int
    seq_len: int
    max_abs: float
    mean_abs: float
    kl: float
    top1: float
    criterion: str
    passed: bool
    ours_error: float | None = None  # low precision: mean |ours - reference fp32|
    reference_error: float | None = None  # low precision: mean |reference - reference fp32|
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        rows = [("dtype / device", f"{self.dtype} / {self.device}"),
                ("tokens", f"{self.batch} x {self.seq_len}"),
                ("max |Δlogit|", f"{self.max_abs:.3e}"), ("mean |Δlogit|", f"{self.mean_abs:.3e}"),
                ("KL(ref || ours)", f"{self.kl:.3e}"), ("top-1 agreement", f"{self.top1:.2%}")]
        if self.ours_error is not None:
            ratio = self.ours_error / self.reference_error if self.reference_error else math.inf
            rows += [("ours vs fp32 reference", f"{self.ours_error:.3e}"),
                     ("transformers vs fp32 reference", f"{self.reference_error:.3e}"),
                     ("ratio", f"{ratio:.3f}")]
        rows += [("criterion", self.criterion), ("verdict", "PASS" if self.passed else "FAIL")]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def compare(ours: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    ours, ref = ours.float(), ref.float()
    diff = (ours - ref).abs()
    log_ref, log_ours = F.log_softmax(ref, -1), F.log_softmax(ours, -1)
    kl = (log_ref.exp() * (log_ref - log_ours)).sum(-1).mean()
    top1 = (ours.argmax(-1) == ref.argmax(-1)).float().mean()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "kl": float(kl), "top1": float(top1)}


def resolve_reference(checkpoint: Path, reference: Path | None) -> Path:
    if reference is not None:
        return reference
    if not is_canonical(checkpoint):
        return checkpoint
    recorded = read_meta(checkpoint).source.get("path")
    if not recorded or not Path(recorded).is_dir():
        raise InputError(f"{checkpoint}: the recorded source {recorded!r} is not available; pass --reference SRC")
    return Path(recorded)


def default_seq_len(checkpoint: Path) -> int:
    arch, _ = arch_of(checkpoint)
    window = arch.sliding_window or 0
    return min(arch.max_positions, max(64, min(2 * window + 1, 512)))


@torch.no_grad()
def verify(checkpoint: Path, reference: Path | None = None, dtype: str = "float32", device: str = "cpu",
           seq_len: int | None = None, batch: int = 2, seed: int = 0) -> Report:
    torch_dtype = parse_dtype(dtype)
    if torch_dtype is None:
        raise InputError("--dtype keep is not a compute dtype; choose float32, bfloat16 or float16")
    reference = resolve_reference(checkpoint, reference)
    model = load(checkpoint, dtype=torch_dtype, device=device, attention="eager")
    seq_len = seq_len or default_seq_len(checkpoint)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, seq_len), generator=generator).to(device)
    ours = model(ids)
    del model
    ref_model = load_reference(reference, torch_dtype, device)
    ref = reference_logits(ref_model, ids)
    del ref_model
    stats = compare(ours, ref)
    if torch_dtype == torch.float32:
        passed = stats["max_abs"] <= FP32_MAX_ABS
        return Report(dtype, device, batch, seq_len, **stats, passed=passed,
                      criterion=f"max |Δlogit| <= {FP32_MAX_ABS:g}")
    ref_model = load_reference(reference, torch.float32, device)
    exact = reference_logits(ref_model, ids).float()
    ours_error = float((ours.float() - exact).abs().mean())
    ref_error = float((ref.float() - exact).abs().mean())
    return Report(dtype, device, batch, seq_len, **stats, ours_error=ours_error, reference_error=ref_error,
                  passed=ours_error <= FAITHFULNESS * ref_error,
                  criterion=f"mean error vs fp32 reference <= {FAITHFULNESS}x transformers' own")
