"""config.json keys that transformers reads under two names.

The GPT-2-era config classes (GPT-2, GPT-Neo, XGLM) declare their own key names (`n_embd`,
`num_layers`, `d_model`) and an `attribute_map` from the llama-era names (`hidden_size`,
`num_hidden_layers`) to them, so a config.json written with either spelling loads the same model.
An aliased row reads the family's own key, else the alias, and writes the family's own key only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config_table import Entry
from .hf_config import Key


def _same(value: Any) -> Any:  # noqa: ANN401 - passes whatever it gets
    return value


def aliased(key: str, alias: str, field: str, kind: type, default: Any, *,  # noqa: ANN401
            read: Callable[[Any], Any] = _same, write: Callable[[Any], Any] = _same, **options: Any) -> Entry:
    """`key` (written) or its `attribute_map` alias `alias` (read only) <-> one ArchConfig field."""
    keys = (Key(key, kind, default, **options), Key(alias, kind, default, legacy=True, **options))
    return Entry(key, keys,
                 lambda hf, _: {field: read(hf.get(key) if hf.stated(key) else hf.get(alias))},
                 lambda cfg: {key: write(getattr(cfg, field))})
