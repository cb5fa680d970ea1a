"""Every family, found by scanning `families/`: a module there that defines `FAMILY` is a family,
with no list to edit. Its model_types, its llama.cpp architectures and its names are checked here
to belong to it alone."""

from __future__ import annotations

import importlib
import pkgutil

from . import families
from .family import Family
from .tables.gguf import GgufArch


def _scan() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(families.__path__)):
        family = getattr(importlib.import_module(f"{families.__name__}.{module}"), "FAMILY", None)
        if family is None:
            continue
        if family.name in found:
            raise ValueError(f"families/{module}.py: family {family.name!r} is defined twice")
        found[family.name] = family
    return found


def _unique(pairs: list[tuple[str, object]], what: str) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"{what} {key!r} is claimed by two families")
        seen[key] = value
    return seen


FAMILIES: dict[str, Family] = _scan()
BY_MODEL_TYPE: dict[str, Family] = _unique([(t, f) for f in FAMILIES.values() for t in f.model_types], "model_type")
# (wrapper model_type, its text_config's model_type) -> the family that reads it where it is not the wrapper's own
WRAPPED: dict[tuple[str, str], Family] = _unique([((w, t), f) for f in FAMILIES.values() for w, texts in f.wraps.items()
                                                  for t in texts], "wrapped text model_type")
# llama.cpp's architecture name -> its entry; and (architecture, general.name word, entry) for the models
# llama.cpp writes under another's architecture (Mistral and Mixtral as llama). An entry that is another's
# variant (granitemoeshared: granitemoe with shared experts' tensors) is reached through that one
_VARIANTS = {id(v) for f in FAMILIES.values() for e in f.gguf for _, v in e.variants}
ARCHS: dict[str, GgufArch] = _unique([(e.arch, e) for f in FAMILIES.values() for e in f.gguf
                                      if not e.named and id(e) not in _VARIANTS], "llama.cpp architecture")
BY_NAME: tuple[tuple[str, str, GgufArch], ...] = tuple((e.arch, e.named, e) for f in FAMILIES.values()
                                                       for e in f.gguf if e.named)
