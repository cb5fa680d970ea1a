"""The canonical decoder. Imports nothing from the rest of lmconvert and nothing from transformers.

The config classes are torch-free; the modules (Decoder, KVCache) load torch when first asked
for, so that reading or checking a config never pays for importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ArchConfig, MoeConfig, NormConfig, RopeConfig
from .errors import ConfigError

if TYPE_CHECKING:
    from .cache import KVCache
    from .decoder import Decoder

__all__ = ["ArchConfig", "ConfigError", "Decoder", "KVCache", "MoeConfig", "NormConfig", "RopeConfig"]
_MODULES = {"Decoder": "decoder", "KVCache": "cache"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        from importlib import import_module

        return getattr(import_module(f".{_MODULES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
