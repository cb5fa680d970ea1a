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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmconvert.mappings.tables.transforms import IDENTITY

from . import fp8, linear_schemes, mxfp4
from .dtypes import DTYPES
from .errors import InputError
from .quant_scheme import QuantizedWeight, Recipe, Scheme
from .source import Loadable, TensorReader, dtype_name

IDENTITY_FN = IDENTITY.forward  # a renaming's function, both ways

if TYPE_CHECKING:
    import torch

    from lmconvert.mappings.tables.transforms import Packed

    from .digest import FiniteCheck
    from .quant_bands import Banded

# quant_method -> reads quantization_config (where, config) into a Recipe, refusing by name what it
# does not handle
METHODS: dict[str, Callable[[str, dict[str, Any]], Recipe]] = {
    "fp8": fp8.read_fp8, "fbgemm_fp8": fp8.read_fbgemm, "mxfp4": mxfp4.read_mxfp4, "gptq": linear_schemes.read_gptq,
    "awq": linear_schemes.read_awq, "compressed-tensors": linear_schemes.read_compressed_tensors,
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

    def __init__(self, source: TensorReader, found: Recipe, canonical: bool = False) -> None:
        self.source = source
        self.recipe = found
        # the format's own layout reads a `transposed` scheme's weights transposed; a canonical
        # checkpoint keeps them as their parts' rows say
        self.canonical = canonical
        names = source.names()
        present = set(names)
        self.parts: dict[str, dict[str, str]] = {}  # weight -> {role: stored name}
        self.schemes: dict[str, tuple[Scheme, dict[str, Any]]] = {}  # weight -> its scheme and settings
        for name in names:
            marked = next((s for s in found.anchored() if name.endswith(s.parts[s.anchor])), None)
            if marked is None:
                continue
            weight = marked.weight_of(name)
            got = found.of(weight, source)
            if got is None or got[0].part_name(weight, got[0].anchor) != name:
                raise InputError(f"{source.where(name)}: tensor {name!r} is a quantized weight's part, but "
                                 f"quantization_config does not quantize {weight!r} so; the checkpoint is inconsistent")
            scheme = got[0]
            parts = {role: scheme.part_name(weight, role) for role in scheme.parts}
            for role, part in parts.items():
                if part not in present and role not in scheme.optional:
                    raise InputError(f"{source.where(name)}: tensor {name!r} has no {part!r} beside it "
                                     f"({scheme.name}'s {role}); the checkpoint is incomplete")
            parts = {role: part for role, part in parts.items() if part in present}
            self._shapes_checked(weight, parts)
            self.parts[weight] = parts
            self.schemes[weight] = got
        hidden = {part for weight, parts in self.parts.items() for part in parts.values() if part != weight}
        for name in names:
            kind = dtype_name(source, name)
            scheme = next((s for s in found.anchored() if kind in s.quantized_dtypes), None)
            if name not in hidden and name not in self.parts and scheme is not None:
                raise InputError(f"{source.where(name)}: tensor {name!r} is {DTYPES[kind].torch_name} but has no "
                                 f"{_anchor_of(scheme, name)!r} beside it; the checkpoint is incomplete")
        self._names = [n for n in names if n not in hidden] + [w for w in self.parts if w not in present]
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._digests: tuple[Mapping[str, str], str] | None = None
        for weight, parts in self.parts.items():
            scheme, settings = self.schemes[weight]
            shape = scheme.check(source, weight, parts, settings)
            self._shapes[weight] = (*shape[:-2], shape[-1], shape[-2]) if self.transposed(weight) else shape

    def transposed(self, weight: str) -> bool:
        """Whether the stored parts hold the weight transposed as this view reads them."""
        return self.schemes[weight][0].transposed and not self.canonical

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
        return self.source.where(name if parts is None else parts[self.schemes[name][0].anchor])

    def dtype_name(self, name: str) -> str:
        """A quantized weight is read as float32, the dtype transformers multiplies in."""
        return "F32" if name in self.parts else dtype_name(self.source, name)

    def stored_type(self, name: str) -> str:
        if name in self.parts:
            scheme, settings = self.schemes[name]
            return scheme.stored_type(settings)
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
        file, start, _ = located(name if parts is None else parts[self.schemes[name][0].anchor])
        return file, start

    def quantized_parts(self, name: str) -> QuantizedWeight | None:
        """The stored parts of a quantized weight (role -> name in `self.source`), else None."""
        parts = self.parts.get(name)
        if parts is None:
            return None
        return QuantizedWeight(self.source, parts, self.schemes[name][0], self.transposed(name))

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

    def _parts_read(self, name: str, parts: dict[str, str]) -> dict[str, torch.Tensor]:
        """A quantized weight's parts, read (digests checked) and their scales found finite."""
        scheme = self.schemes[name][0]
        read = {role: self._read(part) for role, part in parts.items()}
        for role, usable in scheme.finite.items():
            if not usable(read[role]):
                raise InputError(f"{self.source.where(parts[role])}: tensor {parts[role]!r} holds NaN or Inf scales; "
                                 "re-download or re-quantize the checkpoint")
        return read

    def get(self, name: str) -> torch.Tensor:
        parts = self.parts.get(name)
        if parts is None:
            return self.source.get(name)
        scheme, settings = self.schemes[name]
        read = self._parts_read(name, parts)
        weight = scheme.dequantize(read, settings, name, str(self.source.where(parts[scheme.anchor])))
        return weight.transpose(-1, -2).contiguous() if self.transposed(name) else weight

    def banded(self, name: str) -> Banded | None:
        """A tensor that is not a quantized weight as bands of rows read on demand, where the source
        offers them (a quantized weight's bands are `get_as`'s)."""
        bands = getattr(self.source, "banded", None)
        return None if name in self.parts or bands is None else bands(name)

    def casts_straight(self, name: str) -> bool:
        """Whether `get_as` dequantizes the weight `name` band by band straight into another dtype."""
        return name in self.parts and self.schemes[name][0].banded is not None and not self.transposed(name)

    def get_as(self, name: str, dtype: torch.dtype, finite: FiniteCheck | None) -> torch.Tensor:
        """`get(name).to(dtype)`, bit for bit, refused as `check_tensor(get(name), finite)` refuses
        it (NaN/Inf counted over the float32 weight), without the float32 weight: each band of rows
        dequantized and cast on its own (quant_bands.py). For a weight `casts_straight` says so of;
        a scheme that has no bands for this one dequantizes it whole."""
        from .digest import check_tensor
        from .quant_bands import dequantize_into, one_torch_thread

        parts = self.parts[name]
        scheme, settings = self.schemes[name]
        where = str(self.source.where(parts[scheme.anchor]))
        assert scheme.banded is not None
        # the parts' small whole-tensor steps (a transpose, the zeros) on one thread too: torch's
        # OpenMP workers spin after each, which cost more CPU than the work on a loaded machine
        with one_torch_thread():
            read = self._parts_read(name, parts)
            banded = scheme.banded(read, settings, name, where)
            if banded is None:
                weight = scheme.dequantize(read, settings, name, where)
                check_tensor(weight, finite)
                return weight.to(dtype)
            weight, nonfinite = dequantize_into(banded, dtype, finite is not None)
        if finite is not None:
            finite.require(nonfinite)
        return weight

    def close(self) -> None:
        self.source.close()


def _anchor_of(scheme: Scheme, name: str) -> str:
    """The anchor a stored quantized tensor `name` (a weight, or another part) would have beside it."""
    if name.endswith(scheme.replaces):
        return scheme.part_name(name, scheme.anchor)
    return name.rpartition(".")[0] + scheme.parts[scheme.anchor]


def description(found: Recipe) -> dict[str, Any]:
    """What lmconvert.json's "source" records of a quantized source."""
    return {"quantization": {"quant_method": found.method, "scheme": found.scheme.name,
                             "config": found.config, **({"weights": found.describe} if found.describe else {})}}


def quantized_view(config: dict[str, Any], config_file: Path | str, tensors: TensorReader,
                   canonical: bool = False) -> tuple[TensorReader, dict[str, Any]]:
    """An HF checkpoint's tensors as the family tables read them, and what lmconvert.json's "source"
    records of its quantization: a quantized one's weights as float tensors (`QuantizedTensors`).
    `canonical`: a canonical checkpoint's, whose parts are kept untransposed."""
    found = recipe(config, config_file)
    if found is None:
        return tensors, {}
    return QuantizedTensors(tensors, found, canonical), description(found)


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


def quantization_line(reader: TensorReader) -> str | None:
    """What the card says of a quantized checkpoint: its method, what its weights are (any activation
    scheme declared, which lmconvert does not run: weights are dequantized alone), and verify's reference."""
    found = recipe_of(reader)
    if found is None:
        return None
    weights = found.describe or found.scheme.stored_type(found.settings)
    reference = ("transformers' own dequantizing load" if found.transformers_loads else
                 "transformers running lmconvert's dequantized weights (it cannot load this on CPU)")
    return f"{found.method}: {weights}; verify's reference: {reference}"


class KeptParts:
    """A reader over `base` that also reads, under new names, the stored parts of quantized weights
    as a conversion keeping them copies them: `raw` (new name -> (reader, stored name, the weight's
    name in base)), each part as stored; `moved` (new name -> `Moved`), each part of a weight a
    table transform moved (`Packed`), gathered when it is read."""

    def __init__(self, base: TensorReader, raw: dict[str, tuple[TensorReader, str, str]],
                 moved: dict[str, Moved] | None = None) -> None:
        import threading

        self.base = base
        self.raw = raw  # new name -> (reader, stored name, the weight's name in base)
        self.moved = moved or {}
        self.digests: tuple[Mapping[str, str], str] | None = None  # of the stored parts a move reads
        self._lock = threading.Lock()
        self._last: tuple[Any, dict[str, torch.Tensor] | None] = (None, None)  # the last move's parts
        self._stored: tuple[Any, Any] = (None, None)  # the last stored weight read, for the next expert

    def names(self) -> list[str]:
        return [*self.base.names(), *self.raw, *self.moved]

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.moved:
            return self.moved[name].shape
        got = self.raw.get(name)
        return self.base.shape(name) if got is None else got[0].shape(got[1])

    def dtype_name(self, name: str) -> str:
        if name in self.moved:
            weight, role = self.moved[name].sources[0], self.moved[name].role
            return dtype_name(weight.reader, weight.parts[role])
        got = self.raw.get(name)
        return dtype_name(self.base, name) if got is None else dtype_name(got[0], got[1])

    def get(self, name: str) -> torch.Tensor:
        if name in self.moved:
            return self._moved(self.moved[name])
        got = self.raw.get(name)
        return self.base.get(name) if got is None else got[0].get(got[1])

    def _moved(self, moved: Moved) -> torch.Tensor:
        """A moved part: its weight's move made once for all its parts (kept until the next weight's)."""
        with self._lock:
            if self._last[0] is not moved.key:
                self._last = (None, None)
                self._last = (moved.key, moved.run(self._packed))
            parts = self._last[1]
            assert parts is not None
            return parts[moved.role]

    def _packed(self, weight: QuantizedWeight) -> Packed:
        """A stored weight's parts as a Packed weight; the last one read is kept (every expert of a fused
        tensor moves the same stored parts)."""
        from lmconvert.mappings.tables.transforms import Packed

        key = (id(weight.reader), tuple(weight.parts.values()))
        if self._stored[0] != key:
            self._stored = (None, None)
            self._stored = (key, {role: self._read(weight.reader, part) for role, part in weight.parts.items()})
        read = self._stored[1]
        packed = Packed.of(read, weight.row_dims(next(iter(read))), weight.transposed)
        return weight.move(packed) if weight.move is not None else packed

    def _read(self, reader: TensorReader, part: str) -> torch.Tensor:
        t = reader.get(part)
        if self.digests is not None:
            from .digest import DigestCheck, check_tensor

            digests, algorithm = self.digests
            check_tensor(t, None, DigestCheck(part, reader.where(part), digests[part], algorithm))
        return t

    def where(self, name: str) -> Path:
        if name in self.moved:
            weight = self.moved[name].sources[0]
            return weight.reader.where(weight.parts[self.moved[name].role])
        got = self.raw.get(name)
        return self.base.where(name) if got is None else got[0].where(got[1])

    def raw_location(self, name: str) -> tuple[Path, int, int] | None:
        if name in self.moved:
            return None
        got = self.raw.get(name)
        reader, stored = (self.base, name) if got is None else got[:2]
        located = getattr(reader, "raw_location", None)
        return None if located is None else located(stored)

    def position(self, name: str) -> tuple[Path, int] | None:
        """The base's order; a part's is its weight's (stable sorting keeps the parts in their order)."""
        placed = getattr(self.base, "position", None)
        got = self.raw.get(name)
        weight = self.moved[name].weight if name in self.moved else None if got is None else got[2]
        if placed is not None:
            return placed(name if weight is None else weight)
        if name in self.moved:
            first = self.moved[name].sources[0]
            located = getattr(first.reader, "raw_location", None)
            where = None if located is None else located(first.parts[first.scheme.anchor])
            return None if where is None else (where[0], where[1])
        located = self.raw_location(name)
        return None if located is None else (located[0], located[1])

    def close(self) -> None:
        """The base's owner closes it."""


class Moved:
    """One part of a quantized weight that a table transform moves: the Packed transform `move`
    applied to its source weights (one, or the pieces it joins), the part `role` taken out."""

    def __init__(self, weight: Any, sources: list[QuantizedWeight], move: Callable[[Any], Any],  # noqa: ANN401
                 joins: bool, role: str, shape: tuple[int, ...], key: object) -> None:
        self.weight, self.sources, self.move, self.joins = weight, sources, move, joins
        self.role, self.shape, self.key = role, shape, key

    def run(self, packed: Callable[[QuantizedWeight], Packed]) -> dict[str, torch.Tensor]:
        got = [packed(one) for one in self.sources]
        return self.move(got if self.joins else got[0]).parts()


Item = tuple[str, Any, Any]  # (output name, source name(s), a bound Transform)


def kept(reader: TensorReader, items: Iterable[Item], direction: str, stored_layout: bool,
         refusal: Callable[[str], str]) -> tuple[TensorReader, list[tuple[str, Any, Callable[..., Any]]]]:
    """(output name, source name, bound Transform) items, as (output name, source name, function)
    items that copy each quantized weight's parts as they are: each part named after the output
    weight with its part's suffix. A renamed weight's parts are copied as stored; a weight the
    transform moves by rows (`Packed`: gpt-oss's experts split out of their fused tensor) has its
    parts moved alike, every group whole. `direction`: "forward" (import) or "inverse" (export);
    `stored_layout`: the output is the format's own layout (a transposed scheme's weights
    transposed), not a canonical checkpoint. A transform that cannot act on parts, or that leaves
    a weight transposed where the output cannot hold it, is refused: `refusal(name)` says so."""
    read, grouped = kept_weights(reader, items, direction, stored_layout, refusal)
    out: list[tuple[str, Any, Callable[..., Any]]] = []
    for one in grouped:
        if isinstance(one, KeptWeight):
            out += [(one.scheme.part_name(one.name, role), key, IDENTITY_FN) for role, key in one.parts.items()]
        else:
            out.append(one)
    return read, out


@dataclass(frozen=True)
class KeptWeight:
    """One quantized weight of a conversion keeping them: output `name`, its `scheme`, and each
    part's name in `kept`'s reader (role -> name)."""

    name: str
    scheme: Scheme
    parts: dict[str, str]


def kept_weights(reader: TensorReader, items: Iterable[Item], direction: str, stored_layout: bool,
                 refusal: Callable[[str], str], keep: Callable[[Scheme], bool] = lambda _: True,
                 ) -> tuple[TensorReader, list[tuple[str, Any, Callable[..., Any]] | KeptWeight]]:
    """`kept`, each quantized weight one `KeptWeight` (the parts together) rather than one item per
    part; `keep(scheme)` False: that weight is an ordinary item, dequantized when read."""
    parts_of = getattr(reader, "quantized_parts", None)
    if parts_of is None:
        return reader, [(name, src, getattr(t, direction)) for name, src, t in items]
    raw: dict[str, tuple[TensorReader, str, str]] = {}
    moved: dict[str, Moved] = {}
    out: list[tuple[str, Any, Callable[..., Any]] | KeptWeight] = []
    for name, src, t in items:
        sources = list(src) if isinstance(src, tuple) else [src]
        found = [parts_of(one) for one in sources]
        if all(f is None for f in found) or not keep(next(f for f in found if f is not None).scheme):
            out.append((name, src, getattr(t, direction)))
            continue
        if any(f is None for f in found):
            raise InputError(refusal(sources[0]))
        weights: list[QuantizedWeight] = found  # type: ignore[assignment]
        scheme = weights[0].scheme
        renamed = getattr(t, direction) is IDENTITY_FN and len(weights) == 1 and weights[0].move is None
        if renamed and weights[0].transposed == (stored_layout and scheme.transposed):
            for role, part in weights[0].parts.items():
                raw["\0" + scheme.part_name(src, role)] = (weights[0].reader, part, src)  # never a stored name
            out.append(KeptWeight(name, scheme, {role: "\0" + scheme.part_name(src, role)
                                                 for role in weights[0].parts}))
            continue
        move = getattr(t, "packed_" + direction)
        joins = isinstance(src, tuple)
        shapes = _moved_shapes(weights, move, joins, stored_layout)
        if shapes is None:
            raise InputError(refusal(sources[0]))
        key = object()
        for role, shape in shapes.items():
            moved["\0" + scheme.part_name(name, role)] = Moved(sources[0], weights, move, joins, role, shape, key)
        out.append(KeptWeight(name, scheme, {role: "\0" + scheme.part_name(name, role) for role in shapes}))
    return KeptParts(reader, raw, moved), out


def _moved_shapes(weights: list[QuantizedWeight], move: Callable[[Any], Any] | None, joins: bool,
                  stored_layout: bool) -> dict[str, tuple[int, ...]] | None:
    """Each part's shape once `move` has moved it (found on the meta device, nothing read), or None
    where it cannot: no counterpart, a move of the inputs, or a result transposed where it cannot be."""
    import torch

    from lmconvert.mappings.tables.transforms import CannotMoveGroups, Packed

    scheme = weights[0].scheme
    if move is None or scheme.own_dims is None:
        return None
    packed = []
    for weight in weights:
        meta = {role: torch.empty(weight.reader.shape(part), device="meta") for role, part in weight.parts.items()}
        one = Packed.of(meta, weight.row_dims(next(iter(meta))), weight.transposed)
        packed.append(one if weight.move is None else weight.move(one))
    try:
        result = move(packed if joins else packed[0])
    except CannotMoveGroups:
        return None
    if result.transposed != (stored_layout and scheme.transposed):
        return None
    return {role: tuple(t.shape) for role, t in result.parts().items()}


def kept_digests(digests: Mapping[str, str] | None, reader: TensorReader,
                 algorithm: str) -> Mapping[str, str] | None:
    """lmconvert.json's digests (by stored name) as `kept`'s reader names the parts it copies; the
    parts it moves are checked as it reads them."""
    raw = getattr(reader, "raw", None)
    if digests is None or raw is None:
        return digests
    if getattr(reader, "moved", None):
        reader.digests = (digests, algorithm)  # type: ignore[attr-defined]
    return {**digests, **{key: digests[stored] for key, (_, stored, _) in raw.items()}}
