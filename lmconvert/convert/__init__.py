"""Conversion between formats: any input -> canonical, canonical -> HF, Meta or GGUF (`convert`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.errors import InputError

from .export_hf import to_hf
from .exports import canonical_meta
from .ingest import to_canonical

__all__ = ["convert", "to_canonical", "to_hf"]


def _to_meta(src: Any, out: Path, **kwargs: Any) -> dict[str, Any]:
    from .export_meta import to_meta  # loads torch: Meta's files are pickles

    return to_meta(src, canonical_meta(src, "meta"), out, **kwargs)


def _to_gguf(src: Any, out: Path, **kwargs: Any) -> dict[str, Any]:
    from .export_gguf import to_gguf  # loads gguf and torch

    return to_gguf(src, out, **kwargs)


# --to name -> (whether SRC must be canonical, the conversion)
TARGETS = {"canonical": (False, to_canonical), "hf": (True, to_hf), "meta": (True, _to_meta), "gguf": (True, _to_gguf)}


def convert(src: Path, out: Path, to: str, **kwargs: Any) -> str:
    """`dtype` is a --dtype name ("bfloat16", ...) or None to keep the checkpoint's own. Returns what
    the family says of the source (a multimodal wrapper's towers left out), or ""."""
    needs_canonical, fn = TARGETS[to]
    with open_checkpoint(src) as checkpoint:
        if (checkpoint.meta is not None) != needs_canonical:
            want = "a canonical checkpoint (with lmconvert.json)" if needs_canonical else "an HF checkpoint"
            raise InputError(f"{src}: --to {to} needs {want} as SRC")
        if not needs_canonical:
            kwargs.pop("family", None)
        fn(checkpoint, out, **kwargs)
        return checkpoint.note
