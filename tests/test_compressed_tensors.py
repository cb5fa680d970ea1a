"""compressed-tensors: lmconvert's dequantization equals the `compressed-tensors` package's own
decompression, bit for bit, on tensors its own compressors produce (every format, strategy, symmetry and
width lmconvert reads), and equals transformers 5.25 loading a checkpoint the package wrote
(`CompressedTensorsConfig(run_compressed=False)`, which decompresses on load); a module's scheme is the
one the package's `apply_quantization_config` gives it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors.torch import load_file
from test_gptq import refusal
from transformers import AutoModelForCausalLM, CompressedTensorsConfig, LlamaConfig, LlamaForCausalLM

from lmconvert.formats import compressed_tensors as ct
from lmconvert.formats.errors import InputError
from lmconvert.formats.quantized_linear import TensorHeaders


def config(fmt: str, weights: dict[str, Any], inputs: dict[str, Any] | None = None,
           targets: tuple[str, ...] = ("Linear",)) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": list(targets), "weights": weights,
                                          "input_activations": inputs, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
            "global_compression_ratio": None, "version": "0.20.1"}


def int_args(bits: int, strategy: str, symmetric: bool, group_size: int | None = None) -> dict[str, Any]:
    return {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy, "group_size": group_size,
            "dynamic": False, "actorder": None, "observer": "minmax", "observer_kwargs": {}}


FP8 = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
DYNAMIC_FP8 = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
DYNAMIC_INT8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
CONFIGS = {
    "w4a16-group": config("pack-quantized", int_args(4, "group", True, 16)),
    "w4a16-group-asym": config("pack-quantized", int_args(4, "group", False, 16)),
    "w4a16-channel": config("pack-quantized", int_args(4, "channel", True)),
    "w4a16-channel-asym": config("pack-quantized", int_args(4, "channel", False)),
    "w4a16-tensor": config("pack-quantized", int_args(4, "tensor", True)),
    "w4a16-tensor-asym": config("pack-quantized", int_args(4, "tensor", False)),
    "w8a16-channel": config("pack-quantized", int_args(8, "channel", True)),
    "w8a16-group-asym": config("pack-quantized", int_args(8, "group", False, 16)),
    "fp8-tensor": config("float-quantized", {**FP8, "strategy": "tensor"}, DYNAMIC_FP8),
    "fp8-channel": config("float-quantized", {**FP8, "strategy": "channel"}, DYNAMIC_FP8),
    "fp8-group": config("float-quantized", {**FP8, "strategy": "group", "group_size": 16}),
    "fp8-static-input": config("float-quantized", {**FP8, "strategy": "channel"},
                               {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor",
                                "dynamic": False}),
    "w8a8-int-channel": config("int-quantized", int_args(8, "channel", True), DYNAMIC_INT8),
    "w8a8-int-tensor-asym": config("int-quantized", int_args(8, "tensor", False), DYNAMIC_INT8),
    "naive-int4-group": config("naive-quantized", int_args(4, "group", True, 16)),
}


def qparams(weight: torch.Tensor, args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The package's own scale and zero point (`calculate_qparams`) from min/max at the args' strategy,
    scales in the weight's dtype as `initialize_qparams` makes them."""
    w = weight.float()
    if args.strategy == "group":
        w = w.unflatten(-1, (w.shape[1] // args.group_size, args.group_size))
        lo, hi = w.amin(-1), w.amax(-1)
    elif args.strategy == "channel":
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    else:
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    scale, zero = calculate_qparams(lo, hi, args)
    return scale.to(weight.dtype), zero


@pytest.mark.bitexact  # float16/bfloat16 bits, on AVX2's kernels too
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantize_equals_the_package(name: str, dtype: torch.dtype) -> None:
    quant = CONFIGS[name]
    theirs_scheme = QuantizationConfig.model_validate(quant).config_groups["group_0"]
    ours_scheme = ct.scheme_for(ct.recipe(quant, "config.json"), "model.layers.0.mlp.up_proj")
    assert ours_scheme is not None
    # input features not a multiple of 8 where the strategy allows: packed words that end mid-row
    out_features, in_features = 24, 64 if ours_scheme.weights.strategy == "group" else 36
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(len(name))).to(dtype)
    scale, zero = qparams(weight, theirs_scheme.weights)
    state = {"weight": weight, "weight_scale": scale, "weight_zero_point": zero}
    if ours_scheme.inputs is not None and not ours_scheme.inputs.dynamic:
        state["input_scale"] = torch.tensor([0.5], dtype=dtype)
    compressor = BaseCompressor.get_value_from_registry(ours_scheme.format)
    compressed = compressor.compress(state, theirs_scheme)
    headers = TensorHeaders({f"m.{k}": v for k, v in compressed.items()}, "model.safetensors")
    shape = ct.check_linear(ours_scheme, "m", headers, read=lambda n: compressed[n.removeprefix("m.")])
    assert shape == (out_features, in_features)
    assert ct.check_linear(ours_scheme, "m", headers, read=lambda n: compressed[n.removeprefix("m.")],
                           out_features=out_features, in_features=in_features) == shape
    ours = ct.dequantize(ours_scheme, "m", compressed, "model.safetensors")
    theirs = compressor.decompress(compressed, theirs_scheme)["weight"]
    assert ours.dtype == theirs.dtype == scale.dtype and ours.shape == (out_features, in_features)
    assert torch.equal(ours.view(torch.uint8), theirs.contiguous().view(torch.uint8))


def test_unpack_equals_the_packages_on_every_word() -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (5, 7), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    for bits, count in ((4, 53), (4, 56), (8, 25), (8, 28)):
        assert torch.equal(ct.unpack(words, bits, count), unpack_from_int32(words, bits, torch.Size((5, count))))


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def quantized_checkpoint(directory: Path, quant: dict[str, Any], dtype: torch.dtype) -> Path:
    """A checkpoint written by the package as llm-compressor writes one: the scheme applied, min-max
    qparams, `ModelCompressor.compress_model`, `save_pretrained`, `update_config`."""
    model = tiny_llama().to(dtype)
    qconfig = QuantizationConfig.model_validate(quant)
    qconfig.quantization_status = QuantizationStatus.FROZEN
    apply_quantization_config(model, qconfig, show_progress=False)
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is not None:
            scale, zero = qparams(module.weight.data, scheme.weights)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(directory)
    return directory


@pytest.mark.bitexact  # float16/bfloat16 bits, on AVX2's kernels too
@pytest.mark.parametrize("name", ["w4a16-group-asym", "w8a16-channel", "fp8-channel", "w8a8-int-tensor-asym"])
@pytest.mark.parametrize("stored,loaded", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                           (torch.bfloat16, torch.float32)])
def test_equals_transformers_decompressed_load(tmp_path: Path, name: str, stored: torch.dtype,
                                               loaded: torch.dtype) -> None:
    """The product in the stored scales' dtype, then cast to the model's, as transformers does."""
    directory = quantized_checkpoint(tmp_path / name, CONFIGS[name], stored)
    quant = json.loads((directory / "config.json").read_text())["quantization_config"]
    recipe = ct.recipe(quant, directory / "config.json")
    tensors = load_file(directory / "model.safetensors")
    headers = TensorHeaders(tensors, directory / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=loaded,
                                                 quantization_config=CompressedTensorsConfig(run_compressed=False))
    modules = sorted({m for m in map(ct.module_of, tensors) if m is not None})
    assert len(modules) == 14
    for module in modules:
        scheme = ct.scheme_for(recipe, module)
        assert scheme is not None and scheme.format == quant["format"]
        ct.check_linear(scheme, module, headers, read=lambda n: tensors[n])
        parts = {n.removeprefix(module + "."): t for n, t in tensors.items() if n.rsplit(".", 1)[0] == module}
        ours = ct.dequantize(scheme, module, parts, str(directory)).to(loaded)
        theirs = model.get_parameter(f"{module}.weight")
        assert theirs.dtype == loaded and torch.equal(ours.view(torch.uint8), theirs.detach().view(torch.uint8)), module
    assert ct.scheme_for(recipe, "lm_head") is None


def test_scheme_for_matches_apply_quantization_config() -> None:
    quant = config("mixed-precision", int_args(4, "group", True, 16), targets=("re:.*mlp\\.(up|down)_proj$",))
    quant["config_groups"]["group_0"]["format"] = "pack-quantized"
    quant["config_groups"]["group_1"] = {"targets": ["Linear"], "weights": int_args(8, "channel", True),
                                         "format": "pack-quantized"}
    quant["config_groups"]["group_2"] = {"targets": ["model.layers.1.self_attn.q_proj", "re:.*down_proj$"],
                                         "weights": {**FP8, "strategy": "channel"}, "format": "float-quantized"}
    quant["ignore"] = ["lm_head", "re:.*layers\\.0\\.self_attn\\.k_proj$"]
    recipe = ct.recipe(quant, "config.json")
    model = tiny_llama()
    qconfig = QuantizationConfig.model_validate(quant)
    qconfig.quantization_status = QuantizationStatus.FROZEN
    apply_quantization_config(model, qconfig, show_progress=False)
    seen = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            theirs = getattr(module, "quantization_scheme", None)
            ours = ct.scheme_for(recipe, name)
            assert (ours is None) == (theirs is None), name
            if ours is not None:
                assert (ours.weights.num_bits, ours.weights.type, ours.format) == (
                    theirs.weights.num_bits, theirs.weights.type, theirs.format), name
                seen.add(ours.group)
    assert seen == {"group_0", "group_1", "group_2"}


def refused(quant: dict[str, Any]) -> str:
    with pytest.raises(InputError) as caught:
        ct.recipe(quant, "/m/config.json")
    message = str(caught.value)
    assert message.startswith("/m/config.json: quantization_config") and "\n" not in message
    return message


def with_weights(**change: Any) -> dict[str, Any]:
    quant = json.loads(json.dumps(CONFIGS["w4a16-group"]))
    quant["config_groups"]["group_0"]["weights"].update(change)
    return quant


def test_refused_options() -> None:
    base = CONFIGS["w4a16-group"]
    assert "format 'nvfp4-pack-quantized' is not handled" in refused({**base, "format": "nvfp4-pack-quantized"})
    assert "format 'dense' is not handled" in refused({**base, "format": "dense"})
    assert "quantization_status 'frozen' is not handled" in refused({**base, "quantization_status": "frozen"})
    assert "kv_cache_scheme" in refused({**base, "kv_cache_scheme": {"num_bits": 8, "type": "float"}})
    assert "sparsity_config" in refused({**base, "sparsity_config": {"format": "sparse-bitmask"}})
    assert "transform_config" in refused({**base, "transform_config": {"config_groups": {"u": {}}}})
    assert "quantization_config.provider is an option lmconvert does not handle" in refused({**base, "provider": 1})
    assert "weights.strategy 'block' is not handled" in refused(with_weights(strategy="block", group_size=None))
    assert "weights.actorder 'group' is not handled" in refused(with_weights(actorder="group"))
    assert "float weights of 4 bits are not handled" in refused(with_weights(type="float", num_bits=4))
    assert "weights quantized on the fly are not handled" in refused(with_weights(dynamic=True))
    assert "weights.num_bits 0 is not a positive integer" in refused(with_weights(num_bits=0))
    outputs = json.loads(json.dumps(base))
    outputs["config_groups"]["group_0"]["output_activations"] = {"num_bits": 8}
    assert "output_activations {'num_bits': 8} is not handled" in refused(outputs)
    preset = {**base, "config_groups": {"W4A16": ["Linear"]}}
    assert "config_groups.W4A16 is list (a preset name's targets?)" in refused(preset)


def hostile(name: str, change: dict[str, torch.Tensor], shape: tuple[int, int] = (24, 64)) -> str:
    quant = CONFIGS[name]
    scheme = ct.scheme_for(ct.recipe(quant, "config.json"), "m")
    theirs_scheme = QuantizationConfig.model_validate(quant).config_groups["group_0"]
    weight = torch.randn(*shape).to(torch.bfloat16)
    scale, zero = qparams(weight, theirs_scheme.weights)
    compressed = BaseCompressor.get_value_from_registry(scheme.format).compress(
        {"weight": weight, "weight_scale": scale, "weight_zero_point": zero}, theirs_scheme)
    compressed.update(change)
    headers = TensorHeaders({f"m.{k}": v for k, v in compressed.items()}, "/m/x.safetensors")
    return refusal(lambda: ct.check_linear(scheme, "m", headers, read=lambda n: compressed[n.removeprefix("m.")]),
                   lambda: ct.dequantize(scheme, "m", compressed, "/m/x.safetensors"))


def test_hostile_inputs() -> None:
    assert "'m.weight_scale' has shape [24, 3], but compressed-tensors pack-quantized weights int4 per group " \
           "(group_size 16), static needs [24, 4]" in hostile("w4a16-group", {"weight_scale": torch.ones(24, 3)})
    assert "'m.weight_scale' holds NaN or Inf scales" in hostile(
        "fp8-channel", {"weight_scale": torch.full((24, 1), math.nan, dtype=torch.bfloat16)})
    assert "'m.weight_packed' has shape [24, 8], but" in hostile(
        "w4a16-group", {"weight_shape": torch.tensor([24, 80])})
    assert "'m.weight_shape' holds [24, -64], not two positive sizes" in hostile(
        "w4a16-channel", {"weight_shape": torch.tensor([24, -64])})
    assert "'m.weight_shape' has shape [3], but" in hostile("w4a16-channel", {"weight_shape": torch.tensor([1, 2, 3])})
    assert "'m.weight' is bfloat16, but compressed-tensors float-quantized" in hostile(
        "fp8-tensor", {"weight": torch.zeros(24, 64, dtype=torch.bfloat16)})
    scheme = ct.scheme_for(ct.recipe(CONFIGS["fp8-group"], "c"), "m")
    with pytest.raises(InputError, match="group_size 16 does not divide its 40 input features"):
        ct.parts(scheme, 24, 40, "m")
    scheme = ct.scheme_for(ct.recipe(CONFIGS["w4a16-group-asym"], "c"), "m")
    with pytest.raises(InputError, match="has no 'm.weight_zero_point', which compressed-tensors"):
        ct.check_linear(scheme, "m", TensorHeaders({"m.weight_packed": torch.zeros(24, 8, dtype=torch.int32),
                                                    "m.weight_shape": torch.tensor([24, 64]),
                                                    "m.weight_scale": torch.ones(24, 4)}, "f"), out_features=24,
                        in_features=64, read=lambda n: torch.tensor([24, 64]))
    assert "'m.weight_zero_point' stands beside a symmetric scheme" in hostile(
        "w4a16-group", {"weight_zero_point": torch.zeros(3, 4, dtype=torch.int32)})
