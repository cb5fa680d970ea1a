import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# `make test-fast` runs the per-family cases of the parametrized tests for these families only (every
# family's in `make test`): together they exercise every variant the decoder has (norm kinds and
# placements, RoPE layouts and scalings, windows, soft-caps, QK norms, fused and Conv1D layouts,
# ALiBi, positions, latent and sparse attention, mixtures of experts), so an everyday run stays
# under two minutes as the families grow to a hundred. The families a change touches are added
# by the Makefile (`tools/changed_families.py`).
CORE_FAMILIES = ("llama", "mistral", "gemma2", "gemma3", "qwen3", "olmo2", "phi3", "cohere2", "gpt2", "gpt_neo",
                 "opt", "stablelm_qk", "falcon", "bloom", "mpt", "minicpm3", "mixtral", "qwen2_moe", "deepseek_v3",
                 "deepseek_v32")


def _family_names() -> set[str]:
    """Every name a per-family case can carry: the spec names and the families' model_types."""
    from family_specs import SPECS

    from lmconvert.mappings import BY_MODEL_TYPE, FAMILIES

    return set(SPECS) | set(FAMILIES) | set(BY_MODEL_TYPE)


def _kept(selected: set[str], names: set[str], item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    named = {value.split(":")[0] for value in params.values() if isinstance(value, str)} & names
    return not named or bool(named & selected)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = os.environ.get("LMCONVERT_FAMILIES")
    if not chosen:
        return
    names = _family_names()
    selected = {*CORE_FAMILIES, *chosen.split(",")} if chosen != "core" else set(CORE_FAMILIES)
    kept = [item for item in items if _kept(selected, names, item)]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept
