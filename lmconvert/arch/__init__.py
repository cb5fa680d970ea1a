"""The canonical decoder. Imports nothing from the rest of lmconvert and nothing from transformers."""

from .cache import KVCache
from .config import ArchConfig, NormConfig, RopeConfig
from .decoder import Decoder
from .errors import ConfigError

__all__ = ["ArchConfig", "ConfigError", "Decoder", "KVCache", "NormConfig", "RopeConfig"]
