"""Quantized checkpoints as the Hub ships them, in one place: which quantization config.json's
`quantization_config` names (`recipe`), which tensors each scheme stores beside a weight, how they
are checked from the headers and how they dequantize.

A scheme (`Scheme`, one row of `METHODS` per `quant_method`) names the parts of one quantized
weight by suffix (block-wise FP8: the weight itself and `X.weight_scale_inv`; MXFP4: `X_blocks` and
`X_scales`, with no `X` stored at all). The source's tensors are seen through `QuantizedTensors`:
each quantized weight is one float32 tensor under the weight's name, so the family tables map names
as for any float checkpoint and never see a part; the parts themselves stay reachable
(`quantized_parts`), so a conversion that keeps the quantization (`convert` without --dtype) copies
them as they are, each under its weight's new name with the part's suffix (`kept`). A canonical
checkpoint holding them records the quantization_config as it was (lmconvert.json's
`quantization`) and is read through the same view, so `lmconvert.load` and `verify` dequantize it
as they dequantize the source.

Everything the headers can show is checked when the checkpoint is opened, before a tensor is read;
scales are checked for NaN/Inf (or a NaN exponent) when they are read, before anything is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import fp8, mxfp4
from .dtypes import DTYPES
from .errors import InputError
from .quant_scheme import Recipe, Scheme
from .source import Loadable, TensorReader, dtype_name

if TYPE_CHECKING:
    import torch

# quant_method -> reads quantization_config (where, config) into a Recipe, refusing by name what it
# does not handle
METHODS: dict[str, Callable[[str, dict[str, Any]], Recipe]] = {
    "fp8": fp8.read_fp8, "fbgemm_fp8": fp8.read_fbgemm, "mxfp4": mxfp4.read_mxfp4,
}
# methods a family's config table reads itself (mappings/families/bitnet.py refuses its own by name)
FAMILY_READS = ("bitnet",)


def recipe(config: dict[str, Any], config_file: Path | str) -> Recipe | None:
    """The quantization of a checkpoint whose config.json is `config`, None for an unquantized one;
    any other quantization (or an option not handled) is refused by name."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    where = f"{config_file}: quantization_config"
    if not isinstance(quant, dict):
        raise InputError(f"{where} is {type(quant).__name__}, not an object; fix config.json")
    method = quant.get("quant_method")
    if method in FAMILY_READS:
        return None
    reader = METHODS.get(method) if isinstance(method, str) else None
    if reader is None:
        read = ", ".join(repr(m) for m in METHODS)
        raise InputError(f"{where}.quant_method {method!r} is not read (lmconvert reads {read}); "
                         "convert an unquantized copy of the model")
    return reader(where, quant)


class QuantizedTensors:
    """A checkpoint's tensors with each quantized weight read as one dequantized float32 tensor under
    the weight's name; its parts are not listed, but `quantized_parts` gives them."""

    def __init__(self, source: TensorReader, found: Recipe) -> None:
        self.source = source
        self.recipe = found
        scheme = found.scheme
        names = source.names()
        present = set(names)
        anchor = scheme.parts[found.scheme.anchor]
        self.parts: dict[str, dict[str, str]] = {}  # weight -> {role: stored name}
        for name in names:
            if not name.endswith(anchor):
                continue
            weight = name.removesuffix(anchor)
            parts = {role: scheme.part_name(weight, role) for role in scheme.parts}
            for role, part in parts.items():
                if part not in present:
                    raise InputError(f"{source.where(name)}: tensor {name!r} has no {part!r} beside it "
                                     f"({scheme.name}'s {role}); the checkpoint is incomplete")
            self._shapes_checked(weight, parts)
            self.parts[weight] = parts
        hidden = {part for weight, parts in self.parts.items() for part in parts.values() if part != weight}
        for name in names:
            kind = dtype_name(source, name)
            if name not in hidden and name not in self.parts and kind in scheme.quantized_dtypes:
                raise InputError(f"{source.where(name)}: tensor {name!r} is {DTYPES[kind].torch_name} but has no "
                                 f"{name + anchor!r} beside it; the checkpoint is incomplete")
        self._names = [n for n in names if n not in hidden] + [w for w in self.parts if w not in present]
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._digests: tuple[Mapping[str, str], str] | None = None
        for weight, parts in self.parts.items():
            self._shapes[weight] = scheme.check(source, weight, parts, found.settings)

    def _shapes_checked(self, weight: str, parts: dict[str, str]) -> None:
        """Each part at most 8 dimensions: what `check` multiplies stays small."""
        for part in parts.values():
            if len(self.source.shape(part)) > 8:
                raise InputError(f"{self.source.where(part)}: tensor {part!r} has {len(self.source.shape(part))} "
                                 "dimensions; the checkpoint is inconsistent")

    def names(self) -> list[str]:
        return self._names

    def every_name(self) -> list[str]:
        """The stored tensors, parts included."""
        return self.source.names()

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name] if name in self.parts else self.source.shape(name)

    def where(self, name: str) -> Path:
        parts = self.parts.get(name)
        return self.source.where(name if parts is None else parts[self.recipe.scheme.anchor])

    def dtype_name(self, name: str) -> str:
        """A quantized weight is read as float32, the dtype transformers multiplies in."""
        return "F32" if name in self.parts else dtype_name(self.source, name)

    def stored_type(self, name: str) -> str:
        if name in self.parts:
            return self.recipe.scheme.stored_type(self.recipe.settings)
        return DTYPES[dtype_name(self.source, name)].torch_name

    def raw_location(self, name: str) -> tuple[Path, int, int] | None:
        """A quantized weight is never a byte copy."""
        located = getattr(self.source, "raw_location", None)
        return None if name in self.parts or located is None else located(name)

    def position(self, name: str) -> tuple[Path, int] | None:
        """Where the tensor's bytes start, for the writer's order (a quantized weight's: its anchor's)."""
        located = getattr(self.source, "raw_location", None)
        if located is None:
            return None
        parts = self.parts.get(name)
        file, start, _ = located(name if parts is None else parts[self.recipe.scheme.anchor])
        return file, start

    def quantized_parts(self, name: str) -> tuple[TensorReader, dict[str, str], Scheme] | None:
        """The stored parts of a quantized weight (role -> name in `self.source`), else None."""
        parts = self.parts.get(name)
        return None if parts is None else (self.source, parts, self.recipe.scheme)

    def checking(self, digests: Mapping[str, str], algorithm: str) -> dict[str, str]:
        """Check each part read against `digests` (lmconvert.json's, by stored name) from now on; the
        digests left for the caller to check: those of every tensor not a quantized weight."""
        self._digests = (digests, algorithm)
        return {name: digest for name, digest in digests.items() if name not in self.parts}

    def _read(self, part: str) -> torch.Tensor:
        t = self.source.get(part)
        if self._digests is not None:
            from .digest import DigestCheck, check_tensor

            digests, algorithm = self._digests
            check_tensor(t, None, DigestCheck(part, self.source.where(part), digests[part], algorithm))
        return t

    def get(self, name: str) -> torch.Tensor:
        parts = self.parts.get(name)
        if parts is None:
            return self.source.get(name)
        scheme = self.recipe.scheme
        read = {role: self._read(part) for role, part in parts.items()}
        for role, usable in scheme.finite.items():
            if not usable(read[role]):
                raise InputError(f"{self.source.where(parts[role])}: tensor {parts[role]!r} holds NaN or Inf scales; "
                                 "re-download or re-quantize the checkpoint")
        return scheme.dequantize(read, self.recipe.settings)

    def close(self) -> None:
        self.source.close()


def description(found: Recipe) -> dict[str, Any]:
    """What lmconvert.json's "source" records of a quantized source."""
    return {"quantization": {"quant_method": found.method, "scheme": found.scheme.name,
                             "config": found.config}}


def quantized_view(config: dict[str, Any], config_file: Path | str,
                   tensors: TensorReader) -> tuple[TensorReader, dict[str, Any]]:
    """An HF checkpoint's tensors as the family tables read them, and what lmconvert.json's "source"
    records of its quantization: a quantized one's weights as float tensors (`QuantizedTensors`)."""
    found = recipe(config, config_file)
    if found is None:
        return tensors, {}
    return QuantizedTensors(tensors, found), description(found)


def reference_of(path: Path, reader: TensorReader) -> Loadable | None:
    """How transformers loads a quantized checkpoint for verify: the files themselves (None) where it
    dequantizes them on CPU, else our dequantized weights written out in HF layout (`Loadable.dequantized`)."""
    found = recipe_of(reader)
    return None if found is None or found.transformers_loads else Loadable(None, origin=path, dequantized=True)


def recipe_of(reader: TensorReader) -> Recipe | None:
    """The quantization a reader dequantizes (through a `LastRead`, the reader's own), else None."""
    inner = getattr(reader, "reader", reader)
    found = getattr(inner, "recipe", None)
    return found if isinstance(found, Recipe) else None


class KeptParts:
    """A reader over `base` that also reads, under new names, the stored parts of quantized weights
    (`raw`: new name -> (reader, stored name)), as stored: what a conversion keeping them copies."""

    def __init__(self, base: TensorReader, raw: dict[str, tuple[TensorReader, str, str]]) -> None:
        self.base = base
        self.raw = raw  # new name -> (reader, stored name, the weight's name in base)

    def names(self) -> list[str]:
        return [*self.base.names(), *self.raw]

    def shape(self, name: str) -> tuple[int, ...]:
        got = self.raw.get(name)
        return self.base.shape(name) if got is None else got[0].shape(got[1])

    def dtype_name(self, name: str) -> str:
        got = self.raw.get(name)
        return dtype_name(self.base, name) if got is None else dtype_name(got[0], got[1])

    def get(self, name: str) -> torch.Tensor:
        got = self.raw.get(name)
        return self.base.get(name) if got is None else got[0].get(got[1])

    def where(self, name: str) -> Path:
        got = self.raw.get(name)
        return self.base.where(name) if got is None else got[0].where(got[1])

    def raw_location(self, name: str) -> tuple[Path, int, int] | None:
        got = self.raw.get(name)
        reader, stored = (self.base, name) if got is None else got[:2]
        located = getattr(reader, "raw_location", None)
        return None if located is None else located(stored)

    def position(self, name: str) -> tuple[Path, int] | None:
        """The base's order; a part's is its weight's (stable sorting keeps the parts in their order)."""
        placed = getattr(self.base, "position", None)
        got = self.raw.get(name)
        if placed is not None:
            return placed(name if got is None else got[2])
        located = self.raw_location(name)
        return None if located is None else (located[0], located[1])

    def close(self) -> None:
        """The base's owner closes it."""


Item = tuple[str, Any, Callable[..., Any]]


def kept(reader: TensorReader, items: Iterable[Item], identity: Callable[..., Any],
         refusal: Callable[[str], str]) -> tuple[TensorReader, list[Item]]:
    """(output name, source name, transform) items with each quantized weight's item replaced by one
    per stored part, each named after the output weight with its part's suffix and copied as stored;
    a quantized weight the plan transforms (not a renaming) cannot be kept: `refusal(name)` says so."""
    parts_of = getattr(reader, "quantized_parts", None)
    if parts_of is None:
        return reader, list(items)
    raw: dict[str, tuple[TensorReader, str, str]] = {}
    out: list[Item] = []
    for name, src, fn in items:
        found = None if isinstance(src, tuple) else parts_of(src)
        if isinstance(src, tuple) and any(parts_of(one) is not None for one in src):
            raise InputError(refusal(src[0]))
        if found is None:
            out.append((name, src, fn))
            continue
        if fn is not identity:
            raise InputError(refusal(src))
        stored, parts, scheme = found
        for role, part in parts.items():
            key = "\0" + scheme.part_name(src, role)  # never a stored name
            raw[key] = (stored, part, src)  # a canonical source's `part` is its key without the \0
            out.append((scheme.part_name(name, role), key, identity))
    return KeptParts(reader, raw), out


def kept_digests(digests: Mapping[str, str] | None, reader: TensorReader) -> Mapping[str, str] | None:
    """lmconvert.json's digests (by stored name) as `kept`'s reader names the parts it copies."""
    raw = getattr(reader, "raw", None)
    if digests is None or raw is None:
        return digests
    return {**digests, **{key: digests[stored] for key, (_, stored, _) in raw.items()}}
