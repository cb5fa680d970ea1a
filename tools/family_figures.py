"""Per-family figures against transformers on CPU, for the family table: fp32 max |Δlogit| (eager on
both sides), the bf16 faithfulness ratio (our mean error over transformers' own, both against the
same bf16 weights run in fp32) and whether our bf16 logits equal transformers' bit for bit.

The models are the tiny perturbed ones of tests/family_specs.py (SPECS), then those of the latent-
and sparse-attention families' own tests (tests/test_mla.py, tests/test_dsa.py: DeepSeek-V3.2 with
index_topk 4 below the 28 tokens, ties at the cut), so the figures are the ones the tests hold to
their bars.

    PYTHONPATH=$PWD:tests python tools/family_figures.py [family ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from family_specs import IDS, SPECS
from hf_models import build_model, load_reference, save_checkpoint
from test_dsa import VARIANTS as DSA
from test_mla import VARIANTS as MLA

import lmconvert

# name -> (model_type, kwargs): every SPECS family, then the DeepSeek families' test models
MODELS: dict[str, tuple[str, dict]] = {
    **{name: (spec.model_type, spec.kwargs) for name, spec in SPECS.items()},
    "deepseek_v2": MLA["v2"], "deepseek_v3": MLA["q_lora_interleaved"],
    "deepseek_v32": ("deepseek_v32", DSA["ties"]), "deepseek_v32 moe": ("deepseek_v32", DSA["moe"]),
}


@torch.no_grad()
def figures(name: str, root: Path) -> tuple[float, float, bool]:
    model_type, kwargs = MODELS[name]
    model = build_model(model_type, **kwargs)
    fp32 = save_checkpoint(model, root / f"{name.replace(' ', '-')}-fp32")
    bf16 = save_checkpoint(model, root / f"{name.replace(' ', '-')}-bf16", torch.bfloat16)
    delta = float((lmconvert.load(fp32, attention="eager")(IDS) - load_reference(fp32)(IDS).logits).abs().max())
    exact = load_reference(bf16)(IDS).logits.float()
    theirs = load_reference(bf16, torch.bfloat16)(IDS).logits
    ours = lmconvert.load(bf16, dtype=torch.bfloat16, attention="eager")(IDS)
    ratio = float((ours.float() - exact).abs().mean() / (theirs.float() - exact).abs().mean())
    return delta, ratio, torch.equal(ours, theirs)


def main(names: list[str]) -> None:
    print(f"{'family':<16} {'fp32 max |d|':>13} {'bf16 ratio':>11}  bf16 bit-exact")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(MODELS):
            delta, ratio, same = figures(name, Path(tmp))
            print(f"{name:<16} {delta:>13.3g} {ratio:>11.4f}  {'yes' if same else 'no'}")


if __name__ == "__main__":
    main(sys.argv[1:])
