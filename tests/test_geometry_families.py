"""MiMo-V2-Flash's and Laguna's per-layer attention geometry over a long cached decode: the family tests
decode 22 tokens; here 34 more tokens one at a time after a prefill of 6, every sliding layer's window
(4) long past, so that the sliding layers' own KV heads (MiMo: twice the full layers'; with their values
narrower than their keys and a sink per head) and each layer's own query heads (Laguna) are cached and
read back many windows over. Equal to transformers' cached decoding (fp32, eager: MiMo has no SDPA) and,
in float64, to our full forward (tests/hf_models.py's check_cached_decoding). And Laguna's other gate,
softplus per element (`gating: false`), which the family's test model (a gate per head) does not run: fp32
parity and bf16 bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from family_specs import FP32_TOL, SPECS
from family_specs import IDS as SHORT
from hf_models import build_model, check_cached_decoding, check_parity, save_checkpoint, token_batch
from transformers import AutoModelForCausalLM

import lmconvert

FAMILIES = ("mimo_v2_flash", "laguna")
IDS = token_batch(seq=40)  # a prefill of 6, then 34 steps


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            spec = SPECS[name]
            made[name] = save_checkpoint(build_model(spec.model_type, **spec.kwargs),
                                         tmp_path_factory.mktemp(f"{name}-long"), torch.float32)
        return made[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_long_cached_decoding_equals_transformers_and_the_full_forward(name: str,
                                                                       checkpoint: Callable[[str], Path]) -> None:
    check_cached_decoding(checkpoint(name), IDS, 6, "eager", "eager", FP32_TOL)


@pytest.mark.slow
def test_per_element_softplus_gate_is_transformers(tmp_path: Path) -> None:
    spec = SPECS["laguna"]
    model = build_model(spec.model_type, **{**spec.kwargs, "gating": False})
    src = save_checkpoint(model, tmp_path / "fp32", torch.float32)
    assert lmconvert.load(src).cfg.attn_output_gate == "projection"
    check_parity(src, SHORT, tmp_path, "eager", FP32_TOL)
    half = save_checkpoint(model, tmp_path / "bf16", torch.bfloat16)
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(half, attn_implementation="eager", dtype=torch.bfloat16)
        ours = lmconvert.load(half, dtype=torch.bfloat16, attention="eager")
        assert torch.equal(ours(SHORT), theirs(SHORT).logits)
