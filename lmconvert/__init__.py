"""lmconvert: move decoder-only LM checkpoints between implementations and formats, with proof."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmconvert.runtime.load import load

__all__ = ["load"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`load` imports torch; importing the package (as the CLI and conversions do) must not."""
    if name == "load":
        from lmconvert.runtime.load import load

        return load
    raise AttributeError(f"module 'lmconvert' has no attribute {name!r}")
