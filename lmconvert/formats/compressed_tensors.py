"""compressed-tensors checkpoints (`quantization_config.quant_method = "compressed-tensors"`, as
llm-compressor writes them): each config group's scheme quantizes the linears its `targets` name (less
`ignore`), and each such linear `X` is stored by its group's `format`:

    float-quantized, int-quantized, naive-quantized   X.weight in float8_e4m3fn or int8, X.weight_scale,
                                                      X.weight_zero_point (asymmetric only)
    pack-quantized (W4A16, W8A16)                     X.weight_packed int32 [out, ceil(in * bits / 32)],
                                                      X.weight_shape int64 [2] = (out, in), X.weight_scale,
                                                      X.weight_zero_point (asymmetric: packed along dim 0)

with `weight_scale` (and a zero point) of shape [1] per tensor, [out, 1] per channel, [out, in / group]
per group, in the model's float dtype.

Dequantized exactly as the `compressed-tensors` package decompresses (version 0.20.1, the one
transformers 5.25 calls; `CompressedTensorsDequantize.convert` in transformers/integrations/
compressed_tensors.py runs the format's `decompress` on each linear's tensors and casts the result to the
model's dtype): `PackedQuantizationCompressor.decompress` (compressors/pack_quantized/base.py) unpacks with
`unpack_from_int32` (compressors/pack_quantized/helpers.py: element i of a row at bit i * bits of its words,
minus 2**(bits - 1)); `NaiveQuantizationCompressor.decompress` (compressors/naive_quantized/base.py) takes
the weight as it is; both then call `dequantize` (quantization/lifecycle/forward.py), whose `_dequantize`
casts the values (and zero point) to the scale's dtype, subtracts the zero point and multiplies by the
scale, groups unflattened to [out, groups, group] (`_process_group`). The product is in the scale's dtype;
the caller casts it to the model's dtype, as transformers does.

Handled: weights int (4 and 8 bits) or float (8 bits, e4m3), symmetric or not (float: symmetric), tensor,
channel and group strategies, actorder "weight"; input activations of any kind (weights are dequantized
alone, as converters do: a static activation scale `X.input_scale` is kept beside the weight); several
config groups, matched to modules as `apply_quantization_config` does. Refused by name: other formats
(nvfp4/mxfp4-pack-quantized, marlin-24, sparse, dense...), the block strategy, output activations,
KV-cache schemes, sparsity and transform configs, actorder "group" (compressed-tensors 0.20 refuses it too).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError
from .quantized_linear import FLOATS, Headers, Part, check_options, check_parts, count, finite, flag, unpack_words

if TYPE_CHECKING:
    import torch

METHOD = "compressed-tensors"
NAIVE = ("float-quantized", "int-quantized", "naive-quantized")  # the weight stored as it is, quantized
PACKED = "pack-quantized"
FORMATS = (*NAIVE, PACKED)
MIXED = "mixed-precision"  # the top-level format of a model whose groups name their own
HANDLED: dict[str, tuple[Any, ...]] = {
    "quant_method": (METHOD,), "format": (*FORMATS, MIXED), "quantization_status": ("compressed",),
    "kv_cache_scheme": (None,), "sparsity_config": (None, {}), "transform_config": (None, {}),
    "moe_sparsity_config": (None,),
}
# bookkeeping, and transformers' load-time settings (CompressedTensorsConfig)
INERT = ("config_groups", "ignore", "global_compression_ratio", "version", "dequantize", "run_compressed",
         "use_optimized_inference")
SCHEME_KEYS: dict[str, tuple[Any, ...]] = {"output_activations": (None,), "format": (None, *FORMATS)}
SCHEME_FREE = ("targets", "weights", "input_activations")
ARGS_HANDLED: dict[str, tuple[Any, ...]] = {
    "type": ("int", "float"), "block_structure": (None,),
    "actorder": (None, False, "weight", "static"),  # "group"/"dynamic" (weight_g_idx) are refused by 0.20 itself
}
ARGS_FREE = ("num_bits", "symmetric", "group_size", "strategy", "dynamic", "scale_dtype", "zp_dtype")
ARGS_INERT = ("observer", "observer_kwargs")  # calibration only
WEIGHT_STRATEGIES = ("tensor", "channel", "group")
ACTIVATION_STRATEGIES = ("tensor", "token", "group", "tensor_group", "attn_head")
ZERO_POINT = {"int": "I8"}  # QuantizationArgs.pytorch_dtype(): int8 for up to 8 bits
STORED = {("int", 4): "I8", ("int", 8): "I8", ("float", 8): "F8_E4M3"}  # NAIVE formats' weight


@dataclass(frozen=True)
class Args:
    """One QuantizationArgs, as read from the config."""
    num_bits: int
    type: str  # "int" or "float"
    symmetric: bool
    strategy: str
    group_size: int | None
    dynamic: bool | str

    def describe(self) -> str:
        group = f" (group_size {self.group_size})" if self.strategy == "group" else ""
        sym = "" if self.symmetric else ", asymmetric"
        kind = "dynamic" if self.dynamic else "static"
        return f"{self.type}{self.num_bits} per {self.strategy}{group}{sym}, {kind}"


@dataclass(frozen=True)
class Scheme:
    """One config group: what its targets' weights are, how they are stored, and (for the card) how
    transformers' compressed mode would quantize their inputs."""
    group: str
    targets: tuple[str, ...]
    weights: Args
    format: str
    inputs: Args | None

    def describe(self) -> str:
        return f"compressed-tensors {self.format} weights {self.weights.describe()}"


@dataclass(frozen=True)
class CtRecipe:
    format: str
    schemes: tuple[Scheme, ...]
    ignore: tuple[str, ...]


def _args(args: Any, where: str, weights: bool) -> Args:
    if not isinstance(args, dict):
        raise InputError(f"{where} is {type(args).__name__}, not an object; fix config.json")
    check_options(args, where, ARGS_HANDLED, (*ARGS_FREE, *ARGS_INERT))
    bits = count(args.get("num_bits", 8), f"{where}.num_bits")
    kind = args.get("type", "int")
    symmetric = flag(args.get("symmetric", True), f"{where}.symmetric")
    group_size = args.get("group_size")
    if group_size is not None:
        count(group_size, f"{where}.group_size", minus_one=True)
    strategy = args.get("strategy")
    if strategy is None:  # QuantizationArgs.validate_model_after
        strategy = "tensor" if group_size is None else "group" if group_size > 0 else "channel"
    allowed = WEIGHT_STRATEGIES if weights else ACTIVATION_STRATEGIES
    if strategy not in allowed:
        raise InputError(f"{where}.strategy {strategy!r} is not handled (only {', '.join(allowed)}); "
                         "convert an unquantized copy of the model")
    if strategy in ("group", "tensor_group") and (group_size is None or group_size <= 0):
        raise InputError(f"{where}: strategy {strategy!r} needs a positive group_size; fix config.json")
    if strategy not in ("group", "tensor_group") and group_size is not None and group_size > 0:
        raise InputError(f"{where}: group_size {group_size} needs strategy 'group'; fix config.json")
    dynamic = args.get("dynamic", False)
    if dynamic not in (True, False, "local"):
        raise InputError(f"{where}.dynamic {dynamic!r} is not true, false or 'local'; fix config.json")
    if weights:
        if dynamic is not False:
            raise InputError(f"{where}.dynamic {dynamic!r}: weights quantized on the fly are not handled; "
                             "convert an unquantized copy of the model")
        if (kind, bits) not in STORED:
            raise InputError(f"{where}: {kind} weights of {bits} bits are not handled (only int4, int8, float8); "
                             "convert an unquantized copy of the model")
        if kind == "float" and not symmetric:
            raise InputError(f"{where}: asymmetric float weights are not handled; convert an unquantized copy")
    return Args(bits, kind, symmetric, strategy, group_size if strategy == "group" else None, dynamic)


def _scheme(group: str, scheme: Any, top_format: str, where: str) -> Scheme:
    where = f"{where}.config_groups.{group}"
    if not isinstance(scheme, dict):
        raise InputError(f"{where} is {type(scheme).__name__} (a preset name's targets?); only schemes written out "
                         "in full are read; convert an unquantized copy of the model")
    check_options(scheme, where, SCHEME_KEYS, SCHEME_FREE)
    targets = scheme.get("targets")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise InputError(f"{where}.targets {targets!r} is not a list of module names or patterns; fix config.json")
    for target in targets:
        if target.startswith("re:"):
            try:
                re.compile(target.removeprefix("re:"))
            except re.error as exc:
                raise InputError(f"{where}.targets: {target!r} is not a regular expression ({exc}); "
                                 "fix config.json") from None
    if scheme.get("weights") is None:
        raise InputError(f"{where}.weights is null: a scheme that quantizes activations alone is not handled; "
                         "convert an unquantized copy of the model")
    weights = _args(scheme["weights"], f"{where}.weights", weights=True)
    inputs = scheme.get("input_activations")
    inputs = None if inputs is None else _args(inputs, f"{where}.input_activations", weights=False)
    if inputs is not None and not inputs.dynamic and inputs.strategy != "tensor":
        raise InputError(f"{where}.input_activations: static {inputs.strategy} activation scales are not handled "
                         "(only per tensor); convert an unquantized copy of the model")
    fmt = scheme.get("format") or top_format
    if fmt == MIXED:
        raise InputError(f"{where}.format is missing while the model's format is {MIXED!r}; fix config.json")
    if fmt == PACKED and weights.type != "int":
        raise InputError(f"{where}: {PACKED} stores int weights, not {weights.type}; fix config.json")
    if fmt == "float-quantized" and weights.type != "float" or fmt == "int-quantized" and weights.type != "int":
        raise InputError(f"{where}: format {fmt!r} does not store {weights.type} weights; fix config.json")
    return Scheme(group, tuple(targets), weights, fmt, inputs)


def recipe(quant: Mapping[str, Any], config_file: Path | str) -> CtRecipe:
    """config.json's `quantization_config` of a compressed-tensors checkpoint; an option or value not
    handled is refused by name."""
    return read(quant, f"{config_file}: quantization_config")


def read(quant: Mapping[str, Any], where: str) -> CtRecipe:
    """`recipe`, `where` naming quantization_config in messages."""
    check_options(quant, where, HANDLED, INERT)
    top = quant.get("format", "dense")
    if top not in HANDLED["format"]:
        raise InputError(f"{where}.format {top!r} is not handled (only {', '.join(HANDLED['format'])}); "
                         "convert an unquantized copy of the model")
    if "quantization_status" not in quant:
        raise InputError(f"{where}.quantization_status is missing (only 'compressed' is read); fix config.json")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise InputError(f"{where}.config_groups {groups!r} is not a non-empty object; fix config.json")
    ignore = quant.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise InputError(f"{where}.ignore {ignore!r} is not a list of module names or patterns; fix config.json")
    return CtRecipe(top, tuple(_scheme(name, scheme, top, where) for name, scheme in groups.items()), tuple(ignore))


def _matches(name: str, target: str) -> bool:
    """compressed-tensors' `match_name`, and `_match_class` for the one class a quantized tensor set can
    be: a Linear."""
    if target.startswith("re:"):
        return re.match(target.removeprefix("re:"), name) is not None
    return target in (name, "Linear")


def scheme_for(recipe: CtRecipe, module: str) -> Scheme | None:
    """The scheme `apply_quantization_config` gives the Linear `module` (None: not quantized): among
    the targets it matches and `ignore` does not, exact names first, then patterns, then the class, the
    last group to list a target owning it."""
    owner: dict[str, Scheme] = {}
    for scheme in recipe.schemes:
        for target in scheme.targets:
            owner[target] = scheme
    if not any(_matches(module, t) for t in owner) or any(_matches(module, i) for i in recipe.ignore):
        return None
    ordered = sorted(owner, key=lambda t: ("re:" in t, t))
    named = [t for t in ordered if t.startswith("re:") and _matches(module, t) or t == module]
    return owner[(named or ["Linear"])[0]]


MARKERS = ("weight_packed", "weight_scale")  # a linear stored compressed has one of these
PARTS = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point")  # and "weight", as any linear


def module_of(name: str) -> str | None:
    """The linear `X` a tensor name `X.weight_packed` or `X.weight_scale` stands for."""
    module, _, suffix = name.rpartition(".")
    return module if suffix in MARKERS else None


def _scale_shape(args: Args, out_features: int, in_features: int, module: str) -> tuple[int, ...]:
    if args.strategy == "tensor":
        return (1,)
    if args.strategy == "channel":
        return (out_features, 1)
    if in_features % args.group_size:
        raise InputError(f"quantized linear {module!r}: group_size {args.group_size} does not divide its "
                         f"{in_features} input features; compressed-tensors cannot dequantize it either")
    return (out_features, in_features // args.group_size)


def parts(scheme: Scheme, out_features: int, in_features: int, module: str = "?") -> list[Part]:
    """The tensors of one quantized linear of `out_features` x `in_features`, with their shapes."""
    args = scheme.weights
    if out_features <= 0 or in_features <= 0:
        raise InputError(f"quantized linear {module!r}: shape [{out_features}, {in_features}] is empty; "
                         "the checkpoint is inconsistent")
    scale = _scale_shape(args, out_features, in_features, module)
    if scheme.format == PACKED:
        words = -(-in_features * args.num_bits // 32)
        found = [Part("weight_packed", (out_features, words), ("I32",)), Part("weight_shape", (2,), ("I64", "I32")),
                 Part("weight_scale", scale, FLOATS)]
        if not args.symmetric:
            packed = args.strategy != "tensor"  # PACK_ZP_STRATS: group and channel zero points are packed
            zero = (-(-out_features * args.num_bits // 32), scale[1]) if packed else scale
            found.append(Part("weight_zero_point", zero, ("I32",) if packed else ("I8",)))
    else:
        found = [Part("weight", (out_features, in_features), (STORED[args.type, args.num_bits],)),
                 Part("weight_scale", scale, FLOATS)]
        if not args.symmetric:
            found.append(Part("weight_zero_point", scale, (ZERO_POINT[args.type],)))
    if scheme.inputs is not None and not scheme.inputs.dynamic:
        found.append(Part("input_scale", (1,), FLOATS))
        if not scheme.inputs.symmetric:
            found.append(Part("input_zero_point", (1,), ("I8", "F8_E4M3")))
    return found


def claimed_shape(module: str, weight_shape: torch.Tensor, where: str) -> tuple[int, int]:
    """A pack-quantized linear's (out_features, in_features) from its `weight_shape` tensor (16 bytes,
    read after `check_linear` has seen its header)."""
    values = [int(v) for v in weight_shape.reshape(-1).tolist()]
    if len(values) != 2 or min(values) <= 0:
        raise InputError(f"{where}: tensor {module + '.weight_shape'!r} holds {values}, not two positive sizes; "
                         "the checkpoint is inconsistent")
    return values[0], values[1]


def check_linear(scheme: Scheme, module: str, headers: Headers, read: Callable[[str], torch.Tensor] | None = None,
                 out_features: int | None = None, in_features: int | None = None) -> tuple[int, int]:
    """That `module`'s tensors are one complete, consistent linear of `scheme` (of the given features,
    or those its headers claim), from the headers alone but for a pack-quantized linear's 16-byte
    `weight_shape`, which `read` fetches once its header is checked; returns (out_features, in_features)."""
    if scheme.format == PACKED:
        name = f"{module}.weight_shape"
        check_parts(module, [Part("weight_shape", (2,), ("I64", "I32"))], headers, scheme.describe())
        if read is not None:
            claimed = claimed_shape(module, read(name), headers.where(name))
            if out_features is not None and (out_features, in_features) != claimed:
                raise InputError(f"{headers.where(name)}: tensor {name!r} claims {list(claimed)}, but the layer is "
                                 f"[{out_features}, {in_features}]; the checkpoint is inconsistent")
            out_features, in_features = claimed
        elif out_features is None or in_features is None:
            raise ValueError("check_linear: a pack-quantized linear needs its weight_shape read or its features")
    elif out_features is None or in_features is None:
        name = f"{module}.weight"
        shape = headers.shape(name) if name in headers else ()
        if len(shape) != 2:
            raise InputError(f"{headers.where(name) if name in headers else module}: {name!r} is missing or not a "
                             f"matrix beside its weight_scale; the checkpoint is inconsistent")
        out_features, in_features = shape
    check_parts(module, parts(scheme, out_features, in_features, module), headers, scheme.describe())
    if scheme.weights.symmetric and f"{module}.weight_zero_point" in headers:
        name = f"{module}.weight_zero_point"
        raise InputError(f"{headers.where(name)}: tensor {name!r} stands beside a symmetric scheme, for which "
                         "compressed-tensors writes no zero point; the checkpoint is inconsistent")
    return out_features, in_features


def unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """`unpack_from_int32` along the last dimension: element i of a row at bit i * bits of its words,
    less 2**(bits - 1), as int8; `count` elements a row (4- and 8-bit fields never straddle a byte)."""
    import torch

    fields = unpack_words(packed, bits).flatten(-2)[..., :count]
    return (fields.to(torch.int16) - (1 << (bits - 1))).to(torch.int8)


def dequantize(scheme: Scheme, module: str, tensors: Mapping[str, torch.Tensor], where: str) -> torch.Tensor:
    """`module`'s float weight [out, in] from its parts (by suffix; shapes already checked by
    `check_linear`), as compressed-tensors decompresses it: in the scale's dtype."""
    args, scale = scheme.weights, tensors["weight_scale"]
    finite(scale, f"{module}.weight_scale", where)
    zero = tensors.get("weight_zero_point")
    if scheme.format == PACKED:
        out_features, in_features = claimed_shape(module, tensors["weight_shape"], where)
        values = unpack(tensors["weight_packed"], args.num_bits, in_features)
        if zero is not None and args.strategy != "tensor":  # packed along the output rows
            zero = unpack(zero.t(), args.num_bits, out_features).t()
    else:
        values = tensors["weight"]
    quantized = values.to(scale.dtype)  # _dequantize: values (and zero point) in the scale's dtype
    if args.strategy == "group":
        quantized = quantized.unflatten(-1, (scale.shape[-1], args.group_size))
        scale = scale.unsqueeze(-1)
        zero = None if zero is None else zero.unsqueeze(-1)
    if zero is not None:
        quantized = quantized - zero.to(scale.dtype)
    return (quantized * scale).reshape(values.shape)
