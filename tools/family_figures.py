"""Per-family figures against transformers on CPU, for the family table: fp32 max |Δlogit| (eager on
both sides), the bf16 faithfulness ratio (our mean error over transformers' own, both against the
same bf16 weights run in fp32), whether our bf16 logits equal transformers' bit for bit, and the
fp16 faithfulness ratio.

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
def half(model: torch.nn.Module, root: Path, dtype: torch.dtype) -> tuple[float, bool]:
    """Our mean error over transformers' own in `dtype`, both against the same half weights run in
    fp32, and whether our logits equal transformers' bit for bit."""
    path = save_checkpoint(model, root, dtype)
    exact = load_reference(path)(IDS).logits.float()
    theirs = load_reference(path, dtype)(IDS).logits
    ours = lmconvert.load(path, dtype=dtype, attention="eager")(IDS)
    return float((ours.float() - exact).abs().mean() / (theirs.float() - exact).abs().mean()), torch.equal(ours, theirs)


@torch.no_grad()
def figures(name: str, root: Path) -> tuple[float, float, bool, float]:
    model_type, kwargs = MODELS[name]
    stem = name.replace(" ", "-")
    model = build_model(model_type, **kwargs)
    fp32 = save_checkpoint(model, root / f"{stem}-fp32")
    delta = float((lmconvert.load(fp32, attention="eager")(IDS) - load_reference(fp32)(IDS).logits).abs().max())
    ratio, same = half(model, root / f"{stem}-bf16", torch.bfloat16)
    # a fresh model: saving rounds the one in hand (save_checkpoint casts it back to fp32)
    fp16_ratio, _ = half(build_model(model_type, **kwargs), root / f"{stem}-fp16", torch.float16)
    return delta, ratio, same, fp16_ratio


def main(names: list[str]) -> None:
    print(f"{'family':<16} {'fp32 max |d|':>13} {'bf16 ratio':>11}  bf16 bit-exact  {'fp16 ratio':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(MODELS):
            delta, ratio, same, fp16_ratio = figures(name, Path(tmp))
            print(f"{name:<16} {delta:>13.3g} {ratio:>11.4f}  {'yes' if same else 'no':<14}  {fp16_ratio:>10.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
