"""Per-family parity figures against transformers, on the tiny perturbed models the family tests use:
fp32 max |Δ logit| (eager), bf16 faithfulness ratio (our mean error against the fp32 logits of the
same bf16 weights, over transformers' own), and whether our bf16 logits equal transformers' bit for
bit (eager, CPU).

    PYTHONPATH=$PWD:$PWD/tests python tools/family_figures.py [family ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from family_specs import IDS, SPECS
from hf_models import build_model, load_reference, save_checkpoint

import lmconvert


@torch.no_grad()
def figures(name: str, directory: Path) -> tuple[float, float, bool]:
    spec = SPECS[name]
    model = build_model(spec.model_type, **spec.kwargs)
    fp32 = save_checkpoint(model, directory / "fp32")
    bf16 = save_checkpoint(model, directory / "bf16", torch.bfloat16)
    ref = load_reference(fp32)(IDS).logits.float()
    fp32_delta = float((lmconvert.load(fp32, attention="eager")(IDS).float() - ref).abs().max())
    exact = load_reference(bf16, torch.float32)(IDS).logits.float()
    theirs = load_reference(bf16, torch.bfloat16)(IDS).logits.float()
    ours = lmconvert.load(bf16, dtype=torch.bfloat16, attention="eager")(IDS).float()
    ratio = float((ours - exact).abs().mean()) / float((theirs - exact).abs().mean())
    return fp32_delta, ratio, torch.equal(ours, theirs)


def main(names: list[str]) -> None:
    print(f"{'family':12} {'fp32 max|d|':>12} {'bf16 ratio':>11} {'bf16 bit-exact':>15}")
    for name in names or list(SPECS):
        with tempfile.TemporaryDirectory() as tmp:
            delta, ratio, exact = figures(name, Path(tmp))
        print(f"{name:12} {delta:12.3g} {ratio:11.3f} {'yes' if exact else 'no':>15}")


if __name__ == "__main__":
    main(sys.argv[1:])
