"""Conversion between formats (`convert`): any input -> canonical, HF, Meta or GGUF, in one step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.errors import InputError
from lmconvert.formats.quantized import recipe_of

from .export_hf import to_hf
from .ingest import to_canonical

__all__ = ["convert", "target_for", "to_canonical", "to_hf"]


def _to_meta(src: Any, out: Path, **kwargs: Any) -> dict[str, Any]:
    from .export_meta import to_meta  # loads torch: Meta's files are pickles

    return to_meta(src, out, **kwargs)


def _to_gguf(src: Any, out: Path, **kwargs: Any) -> dict[str, Any]:
    from .export_gguf import to_gguf  # loads gguf and torch

    return to_gguf(src, out, **kwargs)


# --to name -> the conversion; every one reads any format: the exports stream a non-canonical source
# through the canonical plan without writing the canonical copy (exports.export_source)
TARGETS = {"canonical": to_canonical, "hf": to_hf, "meta": _to_meta, "gguf": _to_gguf}
SUFFIXES = {".gguf": "gguf"}  # an OUT named so says what it is


def target_for(out: Path, to: str | None) -> str:
    """--to, or what OUT's suffix says (`out.gguf`: gguf), else canonical. A suffix that says
    another format than --to is refused rather than written under a misleading name."""
    said = SUFFIXES.get(out.suffix.lower())
    if to is None:
        return said or "canonical"
    if said is not None and said != to:
        raise InputError(f"{out}: its suffix {out.suffix} says {said}, but --to is {to}; drop --to, or name OUT "
                         f"without {out.suffix}")
    return to


# the targets that keep a quantized source's tensors as they are (without --dtype)
KEEPS_QUANTIZED = ("canonical", "hf")


def _quantized(src: Path, to: str, dtype: str | None, method: str) -> None:
    """A quantized source converts kept as it is (canonical, hf) or dequantized into float tensors
    with --dtype; GGUF dequantizes it, then quantizes it as --quant says (an MXFP4 weight kept as it
    is under --quant mxfp4: convert/export_gguf.py)."""
    if dtype is None and to not in (*KEEPS_QUANTIZED, "gguf"):
        raise InputError(f"{src}: is quantized ({method}), which --to {to} cannot hold; pass --dtype bfloat16 "
                         "(or float32) to dequantize it")


def convert(src: Path, out: Path, to: str | None, **kwargs: Any) -> str:
    """`to` is a --to name, or None for what OUT's suffix says (`target_for`). `dtype` is a --dtype
    name ("bfloat16", ...) or None to keep the checkpoint's own. Any format lmconvert reads goes to
    any it writes in one step (a canonical SRC is one already: refused with --to canonical).
    Returns what the family says of the source (a multimodal wrapper's towers left out), or ""."""
    to = target_for(out, to)
    with open_checkpoint(src) as checkpoint:
        if to == "canonical":
            if checkpoint.meta is not None:
                raise InputError(f"{src}: is already a canonical checkpoint; export it with --to hf, meta or gguf")
            kwargs.pop("family", None)
        found = recipe_of(checkpoint.source.tensors)
        if found is not None:
            _quantized(src, to, kwargs.get("dtype"), found.method)
        TARGETS[to](checkpoint, out, **kwargs)
        return checkpoint.note
