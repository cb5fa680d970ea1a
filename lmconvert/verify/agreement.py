"""Agreement beyond one forward pass: distributions (KL, top-1, top-5) and greedy generation,
which runs the KV cache path that a single full-sequence forward never touches."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from lmconvert.arch import KVCache

from .tolerance import Tolerance


def logit_stats(ours: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max and mean |Δlogit|, KL(ref || ours) per position averaged, top-1 agreement, and top-5
    agreement as the mean overlap of the two top-5 sets."""
    ours, ref = ours.float(), ref.float()
    diff = (ours - ref).abs()
    log_ref, log_ours = F.log_softmax(ref, -1), F.log_softmax(ours, -1)
    kl = (log_ref.exp() * (log_ref - log_ours)).sum(-1).mean()
    top1 = (ours.argmax(-1) == ref.argmax(-1)).float().mean()
    k = min(5, ours.shape[-1])
    top_ours, top_ref = ours.topk(k, -1).indices, ref.topk(k, -1).indices
    overlap = (top_ours[..., :, None] == top_ref[..., None, :]).any(-1).float().sum(-1) / k
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "kl": float(kl), "top1": float(top1),
            "top5": float(overlap.mean())}


class Steppable(Protocol):
    def __call__(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor: ...

    def new_cache(self) -> KVCache: ...


@torch.no_grad()
def greedy(model: Steppable, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt + n argmax tokens, each step's logits (B, n, vocab)): `Decoder.generate`'s loop
    without an EOS stop, also keeping the logits it chose from."""
    cache = model.new_cache()
    logits = model(prompt, cache=cache)
    out, steps = prompt, []
    for i in range(n):
        step = logits[:, -1]
        steps.append(step)
        out = torch.cat((out, step.argmax(-1, keepdim=True)), dim=1)
        if i + 1 < n:
            logits = model(out[:, -1:], cache=cache)
    return out, torch.stack(steps, 1)


@dataclass
class Generation:
    prompt_tokens: int
    new_tokens: int
    ours: list[int]  # the generated tokens only
    reference: list[int]
    first_difference: int | None  # index into the generated tokens; None when all agree
    tie: bool  # at the first difference the reference's own two candidates were within tolerance
    step_max_abs: float  # max |Δlogit| over the decoding steps up to the first difference
    step_limit: float | None  # fp32: the largest step_max_abs allowed (relative, like hidden states)
    passed: bool | None  # fp32: the verdict's; low precision: None (reported, not judged)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        steps = f"; decoding steps max |Δlogit| {self.step_max_abs:.1e}"
        if self.step_limit is not None:
            steps += f" (limit {self.step_limit:.1e})"
        if self.first_difference is None:
            return f"{self.new_tokens} greedy tokens identical" + steps
        at = self.first_difference
        text = (f"first difference at generated token {at} (position {self.prompt_tokens + at}): "
                f"ours {self.ours[at]}, reference {self.reference[at]}")
        return text + (" — a tie in the reference's own logits" if self.tie else "") + steps


def compare_generation(ours: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor],
                       prompt_tokens: int, tolerance: Tolerance) -> Generation:
    """Greedy sequences and step logits of both sides (row 0). In fp32 they must agree token for
    token, unless the reference itself could not tell the two tokens apart (a tie within the
    tolerance), after which the two continue from different text and are not compared. Cached
    decoding rounds differently from a full forward on each side, so the step logits are held to
    the hidden states' relative bar rather than the logits' absolute one."""
    ours_tokens = ours[0][0, prompt_tokens:].tolist()
    ref_tokens = ref[0][0, prompt_tokens:].tolist()
    n = min(len(ours_tokens), len(ref_tokens))
    first = next((i for i in range(n) if ours_tokens[i] != ref_tokens[i]), None)
    if first is None and len(ours_tokens) != len(ref_tokens):
        first = n
    upto = n if first is None else min(first + 1, n)
    steps_ours, steps_ref = ours[1][0, :upto].float().cpu(), ref[1][0, :upto].float().cpu()
    step_max = float((steps_ours - steps_ref).abs().max()) if upto else 0.0
    limit = tolerance.point_limit(float(steps_ref.abs().max()) if upto else 0.0, None) if tolerance.exact else None
    tie = False
    if first is not None and first < n:
        row = ref[1][0, first].float()
        tie = float(row[ref_tokens[first]] - row[ours_tokens[first]]) <= (limit or 0.0)
    passed = None
    if tolerance.exact:
        passed = (first is None or tie) and step_max <= limit
    return Generation(prompt_tokens, n, ours_tokens, ref_tokens, first, tie, step_max, limit, passed)
