"""The state-space families' cached decoding over more steps than the family harness takes (its
sequences are 28 tokens): a prefill of 13 tokens (one chunk of 8 and 5 more, past the conv width of
4), then 35 one-token steps, each family's own tiny model (tests/specs). Ours equals transformers'
cached decoding element by element (fp32, within the family harness's 1e-5), and, in float64 where
rounding cannot hide a wrong state, our own full forward: the recurrent step carries the state the
chunked prefill left. Each spec leaves dt unclamped, where transformers' two paths agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from family_specs import SPECS
from hf_models import build_model, check_cached_decoding, save_checkpoint, token_batch

FAMILIES = ("mamba2", "mamba", "falcon_mamba", "bamba", "granitemoehybrid", "granitemoehybrid_dense", "jamba",
            "nemotron_h", "nemotron_h_moe", "falcon_h1", "zamba2", "zamba")
PREFILL, STEPS = 13, 35


@pytest.mark.slow  # over 1.2 s each on 2 cores
@pytest.mark.parametrize("name", FAMILIES)
def test_cached_decoding_over_35_steps(name: str, tmp_path: Path) -> None:
    spec = SPECS[name]
    src = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path / "hf")
    check_cached_decoding(src, token_batch(seq=PREFILL + STEPS), PREFILL, "eager")
