"""The transformers side of a comparison. transformers is imported here and nowhere else, and
only when a comparison needs it."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import InputError


def load_reference(directory: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """transformers' own model with eager attention: the ground truth for parity."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager")
    except (OSError, ValueError) as exc:
        raise InputError(f"{directory}: transformers cannot load this reference ({exc})") from None
    return model.to(device).eval()


@torch.no_grad()
def reference_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits
