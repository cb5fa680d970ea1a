"""lmconvert: move decoder-only LM checkpoints between implementations and formats, with proof."""

from .convert.load import load

__all__ = ["load"]
__version__ = "0.1.0"
