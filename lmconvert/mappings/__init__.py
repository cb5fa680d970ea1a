"""Per-family mappings, found by looking up config.json's model_type (`registry` finds every module of
`families/`). No file I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import Inexpressible, MappingError
from .family import Family
from .registry import BY_MODEL_TYPE, FAMILIES, WRAPPED
from .unsupported import missing


def family_for(model_type: object, config: Mapping[str, Any] | None = None) -> Family:
    """The family of a config.json's model_type; for a wrapper whose text decoder another family reads
    (`Family.wraps`), the one `config`'s text_config names."""
    text = config.get("text_config") if config is not None else None
    kind = text.get("model_type") if isinstance(text, Mapping) else None
    if isinstance(model_type, str) and isinstance(kind, str) and (model_type, kind) in WRAPPED:
        return WRAPPED[model_type, kind]
    try:
        return BY_MODEL_TYPE[model_type]  # type: ignore[index]
    except (KeyError, TypeError):
        lacking = missing(model_type) if isinstance(model_type, str) else None
        if lacking is not None:
            raise MappingError(f"config.json: model_type {model_type!r} is not supported yet: it needs {lacking}, "
                               "which lmconvert's decoder does not have") from None
        raise MappingError(f"config.json: model_type {model_type!r} is not supported; "
                           f"supported: {', '.join(sorted(BY_MODEL_TYPE))}") from None


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise MappingError(f"--family {name!r} is not known; choose one of {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


__all__ = ["BY_MODEL_TYPE", "FAMILIES", "Family", "Inexpressible", "MappingError", "family_for", "family_named"]
