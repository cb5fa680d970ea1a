"""FP8 checkpoints as the Hub ships them, as schemes of `quantized.py`:

- `quant_method: "fp8"` with `weight_block_size: [m, n]` (DeepSeek-V3, Qwen3's -FP8 repos): e4m3
  weights `X.weight` beside a `X.weight_scale_inv` per m x n block;
- `quant_method: "fp8"` with `weight_block_size: null` (per-tensor): one `X.weight_scale_inv` per
  weight (shape [], [1] or [1, 1], as transformers' `Fp8Quantize` writes [1, 1]);
- `quant_method: "fbgemm_fp8"` (Llama 3.1 405B FP8): e4m3 `X.weight` [out, in] beside a float32
  `X.weight_scale` [out, 1], one scale per output row.

`fp8` dequantizes as transformers 5.25 does on CPU (`Fp8Dequantize._dequantize_one` in
transformers/integrations/finegrained_fp8.py, per-tensor included: a scale grid of one block):
both sides to float32, the weight times its block's scale in float32; a cast to the model's dtype
comes after, as transformers casts the product to the parameter's dtype. transformers cannot load
`fbgemm_fp8` on CPU at all (its quantizer requires a GPU and fbgemm-gpu); its weights are the
product its integration computes (`FbgemmFp8Linear.forward`'s `torch._scaled_mm` path: the e4m3
weight times `weight_scale` per row, in float32), and verify's reference is transformers running
those dequantized weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dtypes import DTYPES
from .errors import InputError
from .quant_scheme import Recipe, Scheme, finite_float
from .quantized_linear import check_options
from .source import TensorReader, dtype_name

if TYPE_CHECKING:
    import torch

    from .quant_bands import Banded

SCALE_DTYPES = ("F32", "BF16")  # DeepSeek-V3 ships float32 scales, some requantized repos bfloat16
# quantization_config's options: the values read here; `dequantize` and the skip list are load-time
# settings of transformers (a module it skips simply has no scale beside its weight)
OPTIONS: dict[str, tuple[Any, ...]] = {
    "fmt": ("e4m3",), "activation_scheme": ("dynamic",), "scale_fmt": ("float",), "expert_dtype": ("fp8",),
    "modules_to_convert": (None, []),
}
IGNORED = ("quant_method", "weight_block_size", "dequantize", "modules_to_not_convert", "ignored_layers")
# fbgemm_fp8: the activation bound only clamps the activations' dynamic scale at run time (lmconvert
# dequantizes weights only, as converters do)
FBGEMM_IGNORED = ("quant_method", "activation_scale_ub", "modules_to_not_convert")


def _e4m3(source: TensorReader, weight: str, scale: str, scale_dtypes: tuple[str, ...]) -> tuple[int, ...]:
    """The weight is float8_e4m3fn and its scale a float type read as a scale; its shape."""
    kind, scale_kind = dtype_name(source, weight), dtype_name(source, scale)
    if kind != "F8_E4M3":
        raise InputError(f"{source.where(weight)}: tensor {weight!r} has a {scale!r} but is "
                         f"{DTYPES[kind].torch_name}, not float8_e4m3fn; the checkpoint is inconsistent")
    if scale_kind not in scale_dtypes:
        names = " or ".join(DTYPES[d].torch_name for d in scale_dtypes)
        raise InputError(f"{source.where(scale)}: tensor {scale!r} is {DTYPES[scale_kind].torch_name}; "
                         f"FP8 scales are read as {names} only")
    shape = source.shape(weight)
    if len(shape) < 2:
        raise InputError(f"{source.where(weight)}: tensor {weight!r} has shape {list(shape)}; FP8 weights are "
                         "matrices; the checkpoint is inconsistent")
    return shape


def _module_weight(source: TensorReader, weight: str, scale: str) -> None:
    if not weight.endswith(".weight"):  # transformers 5's fused experts, requantized on save
        raise InputError(f"{source.where(scale)}: tensor {scale!r} scales {weight!r}, which is not a module's "
                         ".weight: transformers 5.25 dequantizes only X.weight / X.weight_scale_inv pairs (the Hub's "
                         "per-expert layout), so this is not read")


def check_blocks(source: TensorReader, weight: str, parts: dict[str, str], settings: dict[str, Any]) -> tuple[int, ...]:
    """A block-wise pair as its headers describe it: an e4m3 matrix (or a stack of them) whose blocks
    the scale covers one to one; per-tensor, one scale for the whole matrix."""
    scale = parts["scale"]
    _module_weight(source, weight, scale)
    shape = _e4m3(source, weight, scale, SCALE_DTYPES)
    scale_shape = source.shape(scale)
    block = settings["block"]
    if block is None:  # per-tensor: transformers reads [] and [1] as one block, and [..., 1, 1]
        if scale_shape in ((), (1,)) and len(shape) == 2 or scale_shape == (*shape[:-2], 1, 1):
            return shape
        raise InputError(f"{source.where(scale)}: tensor {scale!r} has shape {list(scale_shape)}, but per-tensor FP8 "
                         f"(weight_block_size null) needs one scale for {weight!r} {list(shape)}: "
                         f"{list((*shape[:-2], 1, 1))}; the checkpoint is inconsistent")
    rows_block, cols_block = block
    rows, cols = shape[-2:]
    if rows % rows_block or cols % cols_block:
        raise InputError(f"{source.where(weight)}: tensor {weight!r} has shape {list(shape)}, which weight_block_size "
                         f"[{rows_block}, {cols_block}] does not divide; transformers cannot dequantize it either")
    want = (*shape[:-2], rows // rows_block, cols // cols_block)
    if scale_shape != want:
        raise InputError(f"{source.where(scale)}: tensor {scale!r} has shape {list(scale_shape)}, but {weight!r} "
                         f"{list(shape)} in blocks of [{rows_block}, {cols_block}] needs {list(want)}; "
                         "the checkpoint is inconsistent")
    return shape


def dequantize(quantized: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' `Fp8Dequantize._dequantize_one` for e4m3 weights, its output dtype float32:
    the block size is the weight's over the scale grid (one block for a scale of fewer than two
    dimensions), both sides float32, one float32 product (made in place: the same products, one
    weight-sized float32 tensor fewer)."""
    import torch

    rows, cols = quantized.shape[-2:]
    scale_rows, scale_cols = scales.shape[-2:] if scales.dim() >= 2 else (1, 1)
    q = e4m3_to_float32(quantized).reshape(-1, scale_rows, rows // scale_rows, scale_cols, cols // scale_cols)
    s = scales.to(torch.float32).reshape(-1, scale_rows, scale_cols).unsqueeze(-1).unsqueeze(2)
    return q.mul_(s).reshape(quantized.shape)


def banded(quantized: torch.Tensor, scales: torch.Tensor) -> Banded:
    """`dequantize` as bands of rows (quant_bands.py), the weight's leading dimensions (a stack of
    matrices) flattened into its rows: each band's codes looked up into the band's float32 rows and
    multiplied in place by its blocks' float32 scales, the same products. Bands hold whole blocks of
    rows (a stack's matrices are whole blocks too); one scale for the whole weight: any rows."""
    import numpy as np
    import torch

    from .quant_bands import Banded

    rows, cols = quantized.shape[-2:]
    scale_rows, scale_cols = scales.shape[-2:] if scales.dim() >= 2 else (1, 1)
    block_rows, block_cols = rows // scale_rows, cols // scale_cols
    codes = quantized.contiguous().view(torch.uint8).reshape(-1, cols).numpy()
    grid = scales.to(torch.float32).reshape(-1, scale_cols)  # [all blocks' rows, scale_cols]
    table = _table()
    single = grid.shape[0] == 1

    def fill(start: int, stop: int, into: torch.Tensor) -> None:
        np.take(table, codes[start:stop], out=into.numpy())
        if single:
            into.view(stop - start, scale_cols, block_cols).mul_(grid[0].unsqueeze(-1))
        else:
            into.view(-1, block_rows, scale_cols, block_cols).mul_(
                grid[start // block_rows:stop // block_rows].unsqueeze(-1).unsqueeze(1))

    return Banded(codes.shape[0], cols, torch.float32, fill, 1 if single else block_rows, tuple(quantized.shape))


def banded_rows(quantized: torch.Tensor, scales: torch.Tensor) -> Banded:
    """`dequantize_rows` as bands of rows: each band's codes looked up, times its rows' scales."""
    import numpy as np
    import torch

    from .quant_bands import Banded

    codes = quantized.contiguous().view(torch.uint8).numpy()
    per_row = scales.to(torch.float32)
    table = _table()

    def fill(start: int, stop: int, into: torch.Tensor) -> None:
        np.take(table, codes[start:stop], out=into.numpy())
        into.mul_(per_row[start:stop])

    return Banded(codes.shape[0], codes.shape[1], torch.float32, fill)


def e4m3_to_float32(quantized: torch.Tensor) -> torch.Tensor:
    """`quantized.to(torch.float32)`, bit for bit (NaN codes included: the table is torch's own cast
    of every one of the 256 codes), by a table lookup of each byte: numpy indexing by the uint8 codes runs
    about 3x faster than torch's cast on CPU, the step that dominated dequantizing FP8 (bench/fp8_import.py)."""
    import torch

    codes = quantized.contiguous().view(torch.uint8).numpy()
    return torch.from_numpy(_table()[codes]).reshape(quantized.shape)


_TABLE: list[Any] = []


def _table() -> Any:  # noqa: ANN401 - a numpy array
    if not _TABLE:
        import torch

        _TABLE.append(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).numpy())
    return _TABLE[0]


def _blocks_type(settings: dict[str, Any]) -> str:
    block = settings["block"]
    return "float8_e4m3fn, per-tensor scale" if block is None else f"float8_e4m3fn, {block[0]}x{block[1]} blocks"


FP8 = Scheme("fp8", parts={"weight": "", "scale": "_scale_inv"}, anchor="scale", check=check_blocks,
             dequantize=lambda t, *_: dequantize(t["weight"], t["scale"]), stored_type=_blocks_type,
             finite={"scale": finite_float}, quantized_dtypes=("F8_E4M3",),
             banded=lambda t, *_: banded(t["weight"], t["scale"]))


def read_fp8(where: str, quant: dict[str, Any]) -> Recipe:
    check_options(quant, where, OPTIONS, IGNORED)
    block = quant.get("weight_block_size")
    if block is not None and (not isinstance(block, list) or len(block) != 2
                              or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise InputError(f"{where}.weight_block_size {block!r} is not two positive integers (or null: "
                         "per-tensor); fix config.json")
    return Recipe("fp8", FP8, {"block": None if block is None else tuple(block)}, quant)


def check_rows(source: TensorReader, weight: str, parts: dict[str, str], settings: dict[str, Any]) -> tuple[int, ...]:
    """fbgemm's pair: an e4m3 matrix [out, in] and a float32 scale [out, 1] (`FbgemmFp8Linear`)."""
    scale = parts["scale"]
    _module_weight(source, weight, scale)
    shape = _e4m3(source, weight, scale, ("F32",))
    if len(shape) != 2:
        raise InputError(f"{source.where(weight)}: tensor {weight!r} has shape {list(shape)}; fbgemm FP8 is read "
                         "for linear layers [out, in] only (Llama 4's fused experts are not handled)")
    if source.shape(scale) != (shape[0], 1):
        raise InputError(f"{source.where(scale)}: tensor {scale!r} has shape {list(source.shape(scale))}, but "
                         f"{weight!r} {list(shape)} needs one scale per row: {[shape[0], 1]}; "
                         "the checkpoint is inconsistent")
    return shape


def dequantize_rows(quantized: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`FbgemmFp8Linear`'s weight: the e4m3 weight times its row's float32 `weight_scale`, in float32
    (its `_scaled_mm` path scales `weight.t()` by `weight_scale.to(float32).t()`)."""
    import torch

    return e4m3_to_float32(quantized).mul_(scales.to(torch.float32))


FBGEMM = Scheme("fbgemm_fp8", parts={"weight": "", "scale": "_scale"}, anchor="scale", check=check_rows,
                dequantize=lambda t, *_: dequantize_rows(t["weight"], t["scale"]),
                stored_type=lambda _: "float8_e4m3fn, per-row scale", finite={"scale": finite_float},
                quantized_dtypes=("F8_E4M3",), own_dims={"weight": 1, "scale": 1},
                banded=lambda t, *_: banded_rows(t["weight"], t["scale"]))


def read_fbgemm(where: str, quant: dict[str, Any]) -> Recipe:
    check_options(quant, where, {}, FBGEMM_IGNORED)
    bound = quant.get("activation_scale_ub", 1200.0)
    if not isinstance(bound, int | float) or isinstance(bound, bool):
        raise InputError(f"{where}.activation_scale_ub {bound!r} is not a number; fix config.json")
    return Recipe("fbgemm_fp8", FBGEMM, {}, quant, transformers_loads=False)
