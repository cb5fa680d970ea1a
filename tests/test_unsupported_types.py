"""Model types transformers ships that lmconvert does not read yet are refused in one line naming
what the decoder lacks for them (mappings/unsupported.py), not only their name."""

from __future__ import annotations

import pytest

from lmconvert.mappings import BY_MODEL_TYPE, MappingError, family_for
from lmconvert.mappings.unsupported import NEEDS, WHAT


def test_a_type_is_either_read_or_named_as_lacking_something() -> None:
    assert not set(NEEDS) & set(BY_MODEL_TYPE)
    assert all(needs and set(needs) <= set(WHAT) for needs in NEEDS.values())


@pytest.mark.parametrize(("model_type", "lacking"), [
    ("minimax", "a linear-attention token mixer (gated delta-net, lightning attention)"),
    ("glm_moe_dsa", "'shared' layers reuse the previous layer's top-k"),
])
def test_the_refusal_names_what_is_missing(model_type: str, lacking: str) -> None:
    with pytest.raises(MappingError) as refused:
        family_for(model_type)
    message = str(refused.value)
    assert lacking in message and f"{model_type!r}" in message and "\n" not in message


def test_an_unknown_type_lists_the_supported_ones() -> None:
    with pytest.raises(MappingError, match="supported: .*llama"):
        family_for("no_such_model")
