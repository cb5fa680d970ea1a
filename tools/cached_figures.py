"""Cached-decoding figures for the families with a recurrent mixer, for the family table: a prefill of
13 tokens, then 35 one-token steps, each family's tiny perturbed model (tests/family_specs.py, eager
attention). Printed: our cached logits against transformers' cached logits (fp32 max |Δ|),
transformers' own cached decoding against its full forward (fp32: where its recurrent and chunked
paths round apart), and ours in float64, cached against the full forward.

    PYTHONPATH=$PWD:tests python tools/cached_figures.py family [family ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from family_specs import SPECS
from hf_models import build_model, cached_logits, incremental, save_checkpoint, token_batch
from transformers import AutoModelForCausalLM

import lmconvert

PREFILL, STEPS = 13, 35


def worst(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


@torch.no_grad()
def figures(name: str, directory: Path) -> tuple[float, float, float]:
    spec = SPECS[name]
    src = save_checkpoint(build_model(spec.model_type, **spec.kwargs), directory / name)
    ids = token_batch(seq=PREFILL + STEPS)
    ours, exact = lmconvert.load(src, attention="eager"), lmconvert.load(src, dtype=torch.float64, attention="eager")
    theirs = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager")
    cache, exact_cache = ours.new_cache(), exact.new_cache()
    stepped = incremental(lambda chunk: ours(chunk, cache=cache), ids, PREFILL)
    reference = cached_logits(theirs, ids, PREFILL)
    stepped64 = incremental(lambda chunk: exact(chunk, cache=exact_cache), ids, PREFILL)
    return worst(stepped, reference), worst(reference, theirs(ids).logits), worst(stepped64, exact(ids))


def main(names: list[str]) -> None:
    print(f"{'family':18s}{'ours vs transformers, cached':>30s}{'transformers cached vs full':>30s}"
          f"{'ours float64 cached vs full':>30s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            a, b, c = figures(name, Path(tmp))
            print(f"{name:18s}{a:30.2e}{b:30.2e}{c:30.2e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
