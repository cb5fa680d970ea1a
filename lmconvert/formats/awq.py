"""AWQ checkpoints in AutoAWQ's GEMM packing (`quantization_config.quant_method = "awq"`,
`version`/`format` "gemm"): each quantized linear `X` is `X.qweight`, `X.qzeros` and `X.scales` in
place of `X.weight`.

    qweight  int32 [in, out / 8]   output columns packed 8 to a word, in AWQ's order
    qzeros   int32 [groups, out / 8]   the same packing
    scales   float16 [groups, out]

Dequantized as AutoAWQ's `dequantize_gemm` (casper-hansen/AutoAWQ, awq/utils/packing_utils.py;
the same function is gptqmodel's, gptqmodel/quantization/awq/utils/packing_utils.py, which
transformers 5.25 runs through gptqmodel's `TorchAwqQuantLinear`): `unpack_awq` takes the eight 4-bit
fields of each word (field j at bit 4j) as int8, `reverse_awq_order` puts field `[0, 4, 1, 5, 2, 6, 3, 7][k]`
at column 8c + k (the packer, `WQLinear_GEMM.from_linear`, wrote column 8c + [0, 2, 4, 6, 1, 3, 5, 7][j]
into field j), both are masked with 15, then `(iweight - izeros) * scales`, zeros and scales repeated over
each group's input rows: one product in the scales' dtype, an [in, out] matrix whose transpose is the weight.

Handled: 4 bits, zero points, any group size dividing in_features (-1: one group per row). Refused
by name: GEMV, GEMV_FAST and llm-awq packings, no zero point, other bit widths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import gptq
from .errors import InputError
from .quantized_linear import FLOATS, Headers, Part, check_options, check_parts, count, finite, grouping, unpack_words

if TYPE_CHECKING:
    import torch

METHOD = "awq"
PARTS = ("qweight", "qzeros", "scales")
MARKERS = ("qweight",)
BITS = 4
PACK = 32 // BITS
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # AutoAWQ's AWQ_REVERSE_ORDER
HANDLED: dict[str, tuple[Any, ...]] = {
    "quant_method": ("awq",), "bits": (4,), "zero_point": (True,), "desc_act": (False,),
    # AutoAWQ writes "GEMM", transformers "gemm"; AutoAWQ's own "backend" is its packing method
    "version": ("gemm", "GEMM"), "format": ("gemm", "GEMM"), "backend": ("autoawq", "auto", None),
}
FREE = ("group_size",)
# calibration, kernel and fusing settings (AutoAWQ, transformers' AwqConfig and the GPTQConfig it extends)
INERT = ("modules_to_not_convert", "sym", "do_fuse", "fuse_max_seq_len", "modules_to_fuse", "exllama_config",
         *(key for key in gptq.INERT if key != "backend"))


@dataclass(frozen=True)
class AwqRecipe:
    group_size: int  # -1: one group per row
    bits: int = BITS

    def describe(self) -> str:
        return f"AWQ GEMM 4-bit, {grouping(self.group_size)}"


def recipe(quant: Mapping[str, Any], config_file: Path | str) -> AwqRecipe:
    """config.json's `quantization_config` of an AWQ checkpoint; an option or value not handled is
    refused by name."""
    return read(quant, f"{config_file}: quantization_config")


def read(quant: Mapping[str, Any], where: str) -> AwqRecipe:
    """`recipe`, `where` naming quantization_config in messages."""
    check_options(quant, where, HANDLED, (*FREE, *INERT))
    packings = {str(quant[k]).lower() for k in ("version", "format") if k in quant}
    if len(packings) > 1:
        raise InputError(f"{where}: version and format disagree; fix config.json")
    return AwqRecipe(group_size=count(quant.get("group_size", 128), f"{where}.group_size", True))


def module_of(name: str) -> str | None:
    """The linear `X` a tensor name `X.qweight` stands for, None for any other name."""
    return gptq.module_of(name)


def parts(recipe: AwqRecipe, out_features: int, in_features: int, module: str = "?") -> list[Part]:
    """The tensors of one quantized linear of `out_features` x `in_features`, with their shapes."""
    if out_features <= 0 or out_features % PACK or in_features <= 0:
        raise InputError(f"quantized linear {module!r}: {out_features} output features is not a multiple of "
                         f"{PACK} (4-bit fields per int32 word); the checkpoint is inconsistent")
    group = in_features if recipe.group_size == -1 else recipe.group_size
    if in_features % group:
        raise InputError(f"quantized linear {module!r}: group_size {group} does not divide its {in_features} input "
                         "features; AutoAWQ packs whole groups only")
    n = in_features // group
    return [Part("qweight", (in_features, out_features // PACK), ("I32",)),
            Part("qzeros", (n, out_features // PACK), ("I32",)),
            Part("scales", (n, out_features), FLOATS)]


def features(module: str, headers: Headers) -> tuple[int, int]:
    """(out_features, in_features) as the qweight header claims them."""
    name = f"{module}.{MARKERS[0]}"
    shape = headers.shape(name)
    if len(shape) != 2:
        raise InputError(f"{headers.where(name)}: tensor {name!r} has shape {list(shape)}, not a matrix; "
                         "the checkpoint is inconsistent")
    return shape[1] * PACK, shape[0]


def check_linear(recipe: AwqRecipe, module: str, headers: Headers,
                 out_features: int | None = None, in_features: int | None = None) -> tuple[int, int]:
    """That `module`'s tensors are one complete, consistent AWQ GEMM linear (of the given features, or
    of those its qweight claims), from the headers alone; returns (out_features, in_features)."""
    if out_features is None or in_features is None:
        out_features, in_features = features(module, headers)
    check_parts(module, parts(recipe, out_features, in_features, module), headers, recipe.describe())
    return out_features, in_features


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's `unpack_awq` then `reverse_awq_order` and the mask: [rows, out / 8] int32 words to
    [rows, out] values 0..15 (uint8) in column order."""
    import torch

    fields = unpack_words(packed, BITS)  # [rows, out/8, 8], field j at bit 4j
    order = torch.tensor(REVERSE_ORDER)
    return fields.index_select(-1, order).flatten(-2)


def dequantize(recipe: AwqRecipe, module: str, tensors: Mapping[str, torch.Tensor], where: str,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """`module`'s float weight [out, in] from its parts (by suffix; shapes already checked by
    `check_linear`), as AutoAWQ's `dequantize_gemm`: in the scales' dtype, or with the scales cast
    to `dtype` first (gptqmodel's `TorchAwqQuantLinear` casts them to the activations' dtype)."""
    import torch

    scales = tensors["scales"]
    finite(scales, f"{module}.scales", where)
    weight = unpack(tensors["qweight"])  # [in, out]
    in_features, out_features = weight.shape
    n = scales.shape[0]
    group = in_features // n
    zeros = unpack(tensors["qzeros"]).to(torch.int8)  # [groups, out]
    scale = scales if dtype is None else scales.to(dtype)
    # (iweight - izeros) * scales with zeros and scales repeat_interleave'd over the group's rows: the
    # same products, broadcast
    diff = weight.to(torch.int8).view(n, group, out_features) - zeros.unsqueeze(1)
    return (diff * scale.unsqueeze(1)).view(in_features, out_features).t().contiguous()
