"""GPTQ, AWQ and compressed-tensors (gptq.py, awq.py, compressed_tensors.py) as schemes of the
quantization table (`quantized.py`).

Each quantized linear's parts `X.<part>` replace `X.weight` (the scheme's `replaces`; a
compressed-tensors naive format's `weight` part is `X.weight` itself); GPTQ's `g_idx`, compressed-tensors'
zero points and static activation scale may be absent (`optional`: the format's `check_linear` says
when one must be there). compressed-tensors gives each linear its config group's scheme
(`Recipe.per_weight`): the group `scheme_for` gives by name, as `apply_quantization_config` does; a
canonical checkpoint's names, which no target names, by the group whose parts its headers fit (the
groups that fit one linear's headers dequantize it alike).

The weight is the format's product in the scales' dtype, widened to float32 exactly (`table_scheme`):
- compressed-tensors: transformers' decompressed load computes that product and casts it to the model's
  dtype, so the cast after it is transformers' own, in every dtype;
- GPTQ and AWQ: gptqmodel's product when the model is loaded in the scales' dtype (float16 as both write
  them); a model loaded in another dtype has gptqmodel cast the scales first, which the cast after the
  product does not follow. transformers 5.25 loads them only through gptqmodel, which does not install
  beside this CPU torch, so verify's reference is transformers running our dequantized weights.

Only a renaming keeps the parts (`own_dims` None): GPTQ's qweight packs the inputs and its qzeros the
outputs, AWQ packs eight output columns a word in its own order, compressed-tensors' asymmetric zero
points pack the output rows: no move of rows or columns keeps every word whole, so a family table's
other transforms are refused by name (`--dtype` dequantizes instead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import awq, gptq
from . import compressed_tensors as ct
from .errors import InputError
from .quant_scheme import Recipe, Scheme
from .quantized_linear import headers_of, module_of_weight
from .source import TensorReader

if TYPE_CHECKING:
    import torch


def table_scheme(method: str, parts: tuple[str, ...], anchor: str,
                 check: Callable[[dict[str, Any], str, TensorReader], tuple[int, ...]],
                 dequantize: Callable[[dict[str, Any], str, Mapping[str, torch.Tensor], str], torch.Tensor],
                 describe: Callable[[dict[str, Any]], str], **more: Any) -> Scheme:  # noqa: ANN401
    """A quantized linear's format as a scheme: parts `X.<part>` in place of `X.weight`, checked from
    the headers by `check(settings, module, reader)`; the weight `dequantize(settings, module, parts,
    where)` widened to float32."""
    return Scheme(method, parts={part: "." + part for part in parts}, anchor=anchor,
                  check=lambda reader, weight, _, settings: check(settings, module_of_weight(weight), reader),
                  dequantize=lambda t, settings, weight, where: dequantize(
                      settings, module_of_weight(weight), t, where).float(),
                  stored_type=describe, replaces=".weight", **more)


GPTQ = table_scheme(gptq.METHOD, gptq.PARTS, "qweight",
                    lambda s, module, reader: gptq.check_linear(s["recipe"], module, headers_of(reader)),
                    lambda s, module, t, where: gptq.dequantize(s["recipe"], module, t, where),
                    lambda s: s["recipe"].describe(), quantized_dtypes=("I32",), optional=("g_idx",),
                    banded=lambda t, s, weight, where: gptq.banded(s["recipe"], module_of_weight(weight), t, where))
AWQ = table_scheme(awq.METHOD, awq.PARTS, "qweight",
                   lambda s, module, reader: awq.check_linear(s["recipe"], module, headers_of(reader)),
                   lambda s, module, t, where: awq.dequantize(s["recipe"], module, t, where),
                   lambda s: s["recipe"].describe(), quantized_dtypes=("I32",))


def read_gptq(where: str, quant: dict[str, Any]) -> Recipe:
    found = gptq.read(quant, where)
    return Recipe(gptq.METHOD, GPTQ, {"recipe": found}, quant, transformers_loads=False, describe=found.describe())


def read_awq(where: str, quant: dict[str, Any]) -> Recipe:
    found = awq.read(quant, where)
    return Recipe(awq.METHOD, AWQ, {"recipe": found}, quant, transformers_loads=False, describe=found.describe())


CT_OPTIONAL = ("weight_zero_point", "input_scale", "input_zero_point")


def _ct_scheme(fmt: str, parts: tuple[str, ...], quantized: tuple[str, ...]) -> Scheme:
    return table_scheme(f"{ct.METHOD} {fmt}", (*parts, *CT_OPTIONAL), "weight_scale", _ct_check,
                        lambda s, module, t, where: ct.dequantize(s["scheme"], module, t, where),
                        lambda s: s["scheme"].describe(), quantized_dtypes=quantized, optional=CT_OPTIONAL)


def _ct_check(settings: dict[str, Any], module: str, reader: TensorReader) -> tuple[int, ...]:
    return ct.check_linear(settings["scheme"], module, headers_of(reader), read=reader.get)


CT_NAIVE = _ct_scheme("naive", ("weight", "weight_scale"), ("I8", "F8_E4M3"))
CT_PACKED = _ct_scheme(ct.PACKED, ("weight_packed", "weight_shape", "weight_scale"), ("I32",))


def _fits(scheme: ct.Scheme, module: str, reader: TensorReader) -> bool:
    try:
        _ct_check({"scheme": scheme}, module, reader)
    except InputError:
        return False
    return True


def _ct_of(found: ct.CtRecipe) -> Callable[[str, TensorReader], tuple[Scheme, dict[str, Any]] | None]:
    def of(weight: str, reader: TensorReader) -> tuple[Scheme, dict[str, Any]] | None:
        module = module_of_weight(weight)
        scheme = ct.scheme_for(found, module)
        if scheme is None:
            scheme = next((s for s in found.schemes if _fits(s, module, reader)), None)
        if scheme is None:
            return None
        return (CT_PACKED if scheme.format == ct.PACKED else CT_NAIVE), {"scheme": scheme}
    return of


def activations(found: ct.CtRecipe) -> str:
    """Each group's weights and any input activations it declares, for the card (lmconvert dequantizes
    the weights alone; transformers' compressed mode would also quantize those inputs)."""
    said = []
    for scheme in found.schemes:
        inputs = "" if scheme.inputs is None else f", input activations {scheme.inputs.describe()}"
        said.append(f"{scheme.group}: {scheme.describe()}{inputs}")
    return "; ".join(said)


def read_compressed_tensors(where: str, quant: dict[str, Any]) -> Recipe:
    """One config group: verify's reference is transformers' decompressed load
    (`CompressedTensorsConfig(run_compressed=False)`, verify/reference.py); several, which transformers
    5.25 fails to load decompressed: transformers running our dequantized weights."""
    found = ct.read(quant, where)
    return Recipe(ct.METHOD, CT_NAIVE, {}, quant, transformers_loads=len(found.schemes) == 1,
                  per_weight=_ct_of(found), schemes=(CT_NAIVE, CT_PACKED), describe=activations(found))
