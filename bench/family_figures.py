"""Per-family agreement figures against transformers on CPU: for each family's tiny perturbed
model (tests/family_specs.py, plus the layouts tests/test_parallel_alibi.py adds), the fp32 max
|logit difference|, the bf16 faithfulness ratio (our mean error against the fp32 run of the same
bf16 weights, over transformers' own), and whether our bf16 logits equal transformers' bit for bit.
Both sides run eager attention.

    python bench/family_figures.py [NAME ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT)]
from common import table  # noqa: E402
from family_specs import IDS, SPECS  # noqa: E402
from hf_models import build_model, load_reference, save_checkpoint  # noqa: E402
from test_parallel_alibi import LAYOUTS  # noqa: E402

import lmconvert  # noqa: E402

SOURCES = {**{name: (spec.model_type, spec.kwargs) for name, spec in SPECS.items()}, **LAYOUTS}


@torch.no_grad()
def figures(model_type: str, kwargs: dict, work: Path) -> list[str]:
    model = build_model(model_type, **kwargs)
    fp32, bf16 = save_checkpoint(model, work / "fp32"), save_checkpoint(model, work / "bf16", torch.bfloat16)
    ref = load_reference(fp32)(IDS).logits
    fp32_diff = float((lmconvert.load(fp32, attention="eager")(IDS) - ref).abs().max())
    exact = load_reference(bf16)(IDS).logits  # the same bf16 weights, run in fp32
    theirs = load_reference(bf16, torch.bfloat16)(IDS).logits
    ours = lmconvert.load(bf16, dtype=torch.bfloat16, attention="eager")(IDS)
    ratio = float((ours.float() - exact).abs().mean()) / float((theirs.float() - exact).abs().mean())
    return [f"{fp32_diff:.1e}", f"{ratio:.3f}", "yes" if torch.equal(ours, theirs) else "no"]


def main(names: list[str]) -> None:
    rows = [["family", "fp32 max |d|", "bf16 ratio", "bf16 bit-exact"]]
    for name in names or list(SOURCES):
        with tempfile.TemporaryDirectory() as work:
            rows.append([name, *figures(*SOURCES[name], Path(work))])
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
