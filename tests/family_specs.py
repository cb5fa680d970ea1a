"""The tiny perturbed model of each family that the family, verify and GPU tests share: every module
of tests/specs/ defining `SPEC` (see tests/specs/__init__.py), found without a list to edit."""

from __future__ import annotations

import importlib
import pkgutil

import specs
from hf_models import token_batch
from specs import ATTN_CAP, FINAL_CAP, LLAMA3, LONGROPE, SEQ, WINDOW, YARN, F, GgufNaming, S, Spec

__all__ = ["ATTN_CAP", "FAITHFULNESS", "FINAL_CAP", "FP32_TOL", "IDS", "LLAMA3", "LONGROPE", "NAMES", "SEQ", "SPECS",
           "TEXT", "VISION", "WINDOW", "YARN", "F", "GgufNaming", "S", "Spec", "family_of"]

IDS = token_batch(seq=SEQ)
FP32_TOL = 1e-5
FAITHFULNESS = 1.25


def _scan() -> dict[str, Spec]:
    return {module.name: importlib.import_module(f"specs.{module.name}").SPEC
            for module in sorted(pkgutil.iter_modules(specs.__path__), key=lambda m: m.name)}


SPECS: dict[str, Spec] = _scan()
NAMES = list(SPECS)


def family_of(name: str) -> str:
    """The lmconvert family of a SPECS entry."""
    return SPECS[name].family or name


TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, head_dim=16, sliding_window=WINDOW,
            query_pre_attn_scalar=24, sliding_window_pattern=2, pad_token_id=0,
            final_logit_softcapping=FINAL_CAP)  # Gemma3ForConditionalGeneration never applies it
VISION = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
