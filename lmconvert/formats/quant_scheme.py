"""The parts of the quantization table (`quantized.py`) that each scheme module (fp8.py, mxfp4.py,
linear_schemes.py) fills in: what a scheme is, what a checkpoint's recipe holds,
and the checks they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .source import TensorReader

if TYPE_CHECKING:
    import torch

    from .quant_bands import Banded


@dataclass(frozen=True)
class Scheme:
    """One way of storing a quantized weight. `parts`: role -> suffix of the stored tensor, put in
    place of `replaces` at the end of the weight's name ("" is the weight's own name; GPTQ's
    `replaces` ".weight" and part ".qweight": `X.weight` is stored as `X.qweight`, no `X.weight` at
    all); `anchor` is the role whose presence makes a weight quantized, `optional` the roles that may
    be absent (GPTQ's `g_idx`; `check` says when one must be there). `check(reader, weight, parts,
    settings)` refuses, from the headers only, parts that do not fit together and returns the
    weight's shape; `dequantize({role: tensor}, settings, weight, where)` is the float32 weight as
    transformers computes it on CPU (`where`: the anchor's file, for messages); `finite` are the
    roles read as scales that must be finite (per role: the tensor -> whether every value is usable).

    `own_dims` (role -> how many trailing dimensions each part holds per row of the weight), where
    every part has one row per row of the weight: such parts move with the rows when a family's
    table moves rows (`Packed`), so the weight is kept as it is through it; None: a part's rows
    cover several of the weight's (FP8's 128-row blocks), and only a renaming keeps it.
    `transposed`: in the layout the format stores (config.json's checkpoint), the weight is the
    transpose of what its parts' rows say (transformers reads gpt-oss's MXFP4 experts [experts,
    inputs, outputs]); `check` and `dequantize` give the untransposed weight, [*rows, inputs],
    which is the layout a canonical checkpoint keeps them in.

    `banded({role: tensor}, settings, weight, where)`: the same weight as bands of rows in the
    format's own dtype (quant_bands.py), for a conversion that casts it (`--dtype`): each band cast
    straight into the output, with the same bits as `dequantize` then the cast; None (the field, or
    what it returns for a weight): `dequantize` whole."""

    name: str
    parts: dict[str, str]
    anchor: str
    check: Callable[[TensorReader, str, dict[str, str], dict[str, Any]], tuple[int, ...]]
    dequantize: Callable[[dict[str, torch.Tensor], dict[str, Any], str, str], torch.Tensor]
    stored_type: Callable[[dict[str, Any]], str]
    finite: dict[str, Callable[[torch.Tensor], bool]] = field(default_factory=dict)
    # a stored tensor of one of these dtypes without the anchor beside it is a part without its scale
    quantized_dtypes: tuple[str, ...] = ()
    own_dims: dict[str, int] | None = None
    transposed: bool = False
    replaces: str = ""
    optional: tuple[str, ...] = ()
    banded: Callable[[dict[str, torch.Tensor], dict[str, Any], str, str], Banded | None] | None = None

    def part_name(self, weight: str, role: str) -> str:
        return weight.removesuffix(self.replaces) + self.parts[role]

    def weight_of(self, anchor: str) -> str:
        """The weight's name of its anchor part's stored name."""
        return anchor.removesuffix(self.parts[self.anchor]) + self.replaces


@dataclass(frozen=True)
class QuantizedWeight:
    """One quantized weight as a reader holds it: its stored parts (role -> name in `reader`),
    whether the weight reads them transposed, and `move`, the packed forward of a transform a view
    applies on reading (a one-step export's canonical view of a fused experts tensor; None: none)."""

    reader: TensorReader
    parts: dict[str, str]
    scheme: Scheme
    transposed: bool = False
    move: Callable[[Any], Any] | None = None

    def row_dims(self, role: str) -> int:
        assert self.scheme.own_dims is not None
        return len(self.reader.shape(self.parts[role])) - self.scheme.own_dims[role]


@dataclass(frozen=True)
class Recipe:
    """A checkpoint's quantization: its scheme, the settings the scheme reads, and config.json's
    quantization_config as it is (kept verbatim, so that an export writes it back unchanged).

    `per_weight` (a weight's name and the reader holding its parts -> its scheme and settings, None:
    the config leaves it unquantized),
    where the config gives each module its own (compressed-tensors' config groups): `schemes` lists
    them all, whose anchors mark the quantized weights; None: every weight is `scheme`'s."""

    method: str
    scheme: Scheme
    settings: dict[str, Any]
    config: dict[str, Any]
    # transformers 5.25 loads it dequantized on CPU (the reference of verify); False: it cannot, and
    # verify's reference is our own dequantized weights run by transformers (formats/source.py)
    transformers_loads: bool = True
    per_weight: Callable[[str, TensorReader], tuple[Scheme, dict[str, Any]] | None] | None = None
    schemes: tuple[Scheme, ...] = ()
    describe: str = ""  # for the card: what the weights are, and any activation scheme declared

    def of(self, weight: str, reader: TensorReader) -> tuple[Scheme, dict[str, Any]] | None:
        return (self.scheme, self.settings) if self.per_weight is None else self.per_weight(weight, reader)

    def anchored(self) -> tuple[Scheme, ...]:
        return self.schemes or (self.scheme,)


def finite_float(t: torch.Tensor) -> bool:
    import torch

    return bool(torch.isfinite(t).all())
