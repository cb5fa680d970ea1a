"""Quantized checkpoints kept as they are (issue #27): `convert` without --dtype writes a canonical
checkpoint holding each quantized weight's stored parts under its canonical name and the
quantization_config in lmconvert.json; `--to hf` writes back tensors and quantization_config
bit-identical to the source's; `lmconvert.load` and `verify` dequantize the kept checkpoint as
transformers dequantizes the source on CPU.

Schemes: block-wise and per-tensor FP8 (quantized by transformers' own `Fp8Quantize`, loaded by
transformers with `FineGrainedFP8Config(dequantize=True)`), and fbgemm FP8, which transformers cannot
load on CPU (its quantizer requires a GPU and fbgemm-gpu): its tiny checkpoint is quantized per row as
fbgemm's `quantize_fp8_per_row` does, and the dequantized weights are held to the product its
integration's `FbgemmFp8Linear.forward` computes (`torch._scaled_mm`, which runs on CPU)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import build_model, save_checkpoint
from safetensors.torch import load_file, save_file
from test_cli import run
from test_fp8 import MODELS, SEQ_LEN, edited, fp8_copy, fp8_maker, one_line_refusal, reference_weights
from transformers import AutoModelForCausalLM, FineGrainedFP8Config

import lmconvert
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.verify.run import verify

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit for bit: same names, dtypes, shapes and bytes."""
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


def state(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def quantization_config(directory: Path) -> Any:
    return json.loads((directory / "config.json").read_text())["quantization_config"]


def kept(src: Path, tmp_path: Path) -> Path:
    code, _, err = run("convert", src, tmp_path / "canonical")
    assert code == 0, err
    return tmp_path / "canonical"


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    return fp8_maker(tmp_path_factory)


@pytest.fixture(scope="module")
def per_tensor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama quantized per tensor by transformers' `Fp8Quantize` (weight_block_size null)."""
    root = tmp_path_factory.mktemp("per-tensor")
    return fp8_copy(plain_llama(root), root / "fp8", None)  # type: ignore[arg-type]


def plain_llama(root: Path) -> Path:
    model_type, kwargs, _ = MODELS["llama"]
    return save_checkpoint(build_model(model_type, **kwargs), root / "plain", torch.bfloat16, save_original_format=True)


def fbgemm_copy(src: Path, dst: Path) -> Path:
    """`src` with every projection quantized per row as fbgemm's `quantize_fp8_per_row` does (scale =
    the row's largest magnitude over e4m3's largest, the row divided by it), with the config
    `FbgemmFp8Config` saves."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if name.endswith(".weight") and "proj" in name:
            w = tensor.to(torch.float32)
            scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
            out[name] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            out[name + "_scale"] = scale
        else:
            out[name] = tensor
    dst.mkdir()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"],
                                     "quant_method": "fbgemm_fp8"}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def fbgemm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fbgemm")
    return fbgemm_copy(plain_llama(root), root / "fbgemm")


@pytest.mark.parametrize("name", [*MODELS, "deepseek_v3"])
def test_fp8_kept_as_it_is_and_written_back_bit_for_bit(fp8: Callable[..., Path], tmp_path: Path,
                                                        name: str) -> None:
    """Canonical holds the e4m3 weights and their scales unchanged under canonical names, and the
    quantization_config; `--to hf` from it (and in one step from the source) gives back the source's
    tensors and quantization_config bit for bit."""
    src = fp8(name)
    out = kept(src, tmp_path)
    meta = json.loads((out / "lmconvert.json").read_text())
    assert meta["quantization"] == quantization_config(src)
    canonical = state(out)
    source = state(src)
    with open_checkpoint(src) as checkpoint:
        for name_, (stored, _) in checkpoint.plan.items():
            if stored + "_scale_inv" in source:
                assert torch.equal(canonical[name_].view(torch.uint8), source[stored].view(torch.uint8))
                assert torch.equal(canonical[name_ + "_scale_inv"], source[stored + "_scale_inv"])
    assert sum(t.dtype == torch.float8_e4m3fn for t in canonical.values()) == \
        sum(t.dtype == torch.float8_e4m3fn for t in source.values()) > 0
    for args, where in [((out, tmp_path / "hf"), "hf"), ((src, tmp_path / "direct"), "direct")]:
        code, _, err = run("convert", *args, "--to", "hf")
        assert code == 0, err
        same_tensors(state(tmp_path / where), source)
        assert quantization_config(tmp_path / where) == quantization_config(src)


def test_kept_fp8_loads_and_verifies_as_transformers_dequantizes(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """`lmconvert.load` of the kept checkpoint holds the weights transformers dequantizes from the FP8
    files (float32 and bfloat16, bit for bit), and verify agrees with transformers at 0 in fp32."""
    src = fp8("qwen3")
    out = kept(src, tmp_path)
    for dtype in (torch.float32, torch.bfloat16):
        ref = reference_weights(src, dtype)
        ours = dict(lmconvert.load(out, dtype=dtype).named_parameters())
        with open_checkpoint(src) as checkpoint:
            for canonical, (stored, transform) in checkpoint.plan.items():
                if canonical in ours:
                    assert torch.equal(ours[canonical], transform.forward(ref[stored]).to(dtype)), canonical
    report = verify(out, seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0
    assert all(p.max_abs == 0.0 for p in report.points)


def test_kept_fp8_dequantized_on_export(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """`--to hf --dtype bfloat16` from the kept canonical checkpoint is the file the FP8 source gives
    in one step: every tensor read checked against lmconvert.json's digests (each quantized part)."""
    src = fp8("llama")
    out = kept(src, tmp_path)
    for origin, where in [(out, "from-kept"), (src, "from-source")]:
        code, _, err = run("convert", origin, tmp_path / where, "--to", "hf", "--dtype", "bfloat16")
        assert code == 0, err
        assert "quantization_config" not in json.loads((tmp_path / where / "config.json").read_text())
    same_tensors(state(tmp_path / "from-kept"), state(tmp_path / "from-source"))


def test_a_changed_kept_scale_fails_the_export(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """A scale whose bytes changed after conversion is caught by its digest, dequantized or kept."""
    out = kept(fp8("llama"), tmp_path)
    shard = next(out.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    start, stop = json.loads(data[8:8 + header_len])["layers.0.mlp.up.weight_scale_inv"]["data_offsets"]
    at = 8 + header_len + start
    doubled = torch.frombuffer(data[at:at + stop - start], dtype=torch.float32) * 2
    data[at:at + stop - start] = doubled.numpy().tobytes()
    shard.write_bytes(bytes(data))  # the same header, one scale's bytes changed
    for extra in ([], ["--dtype", "bfloat16"]):
        code, _, err = run("convert", out, tmp_path / f"hf{len(extra)}", "--to", "hf", *extra)
        assert code == 1 and "layers.0.mlp.up.weight_scale_inv" in err, err


def test_per_tensor_fp8_reads_as_transformers_dequantizes(per_tensor: Path, tmp_path: Path) -> None:
    """weight_block_size null: one [1, 1] scale per weight; dequantized bit for bit as transformers
    does (float32 and bfloat16), verify at 0 against transformers loading the per-tensor files, kept
    and written back bit for bit."""
    assert quantization_config(per_tensor)["weight_block_size"] is None
    assert load_file(per_tensor / "model.safetensors")["model.layers.0.self_attn.k_proj.weight_scale_inv"].shape == \
        (1, 1)
    for dtype in ("float32", "bfloat16"):
        code, _, err = run("convert", per_tensor, tmp_path / dtype, "--dtype", dtype)
        assert code == 0, err
        ref = AutoModelForCausalLM.from_pretrained(
            per_tensor, dtype=getattr(torch, dtype),
            quantization_config=FineGrainedFP8Config(weight_block_size=None, dequantize=True)).state_dict()
        with open_checkpoint(per_tensor) as source, open_checkpoint(tmp_path / dtype) as ours:
            for canonical in ours.plan:
                (stored,) = source.stored_names(canonical)
                assert torch.equal(ours.tensor(canonical), source.plan[canonical][1].forward(ref[stored])), canonical
    out = kept(per_tensor, tmp_path)
    report = verify(out, seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0 and all(p.max_abs == 0.0 for p in report.points)
    code, _, err = run("convert", out, tmp_path / "hf", "--to", "hf")
    assert code == 0, err
    same_tensors(state(tmp_path / "hf"), state(per_tensor))
    assert quantization_config(tmp_path / "hf") == quantization_config(per_tensor)


def test_fbgemm_dequantizes_as_its_integration_computes(fbgemm: Path) -> None:
    """Each dequantized weight equals what `FbgemmFp8Linear.forward` computes with it (its
    `torch._scaled_mm` path: `weight.t()` scaled by `weight_scale.to(float32).t()`), fed the identity
    (exact in e4m3, scale 1): the product is the dequantized weight, bit for bit."""
    stored = load_file(fbgemm / "model.safetensors")
    with open_checkpoint(fbgemm) as checkpoint:
        tensors = checkpoint.source.tensors
        quantized = [name for name in tensors.names() if name + "_scale" in stored]
        assert len(quantized) == 14
        for name in quantized:
            weight, scale = stored[name], stored[name + "_scale"]
            eye = torch.eye(weight.shape[1]).to(torch.float8_e4m3fn)
            ones = torch.ones(weight.shape[1], 1)
            product = torch._scaled_mm(eye, weight.t(), scale_a=ones, scale_b=scale.to(torch.float32).t(),
                                       out_dtype=torch.float32)
            assert torch.equal(tensors.get(name), product.t()), name


def test_fbgemm_verifies_keeps_and_writes_back(fbgemm: Path, tmp_path: Path) -> None:
    """verify's reference for fbgemm is transformers running the dequantized weights (it cannot load
    fbgemm_fp8 on CPU); fp32 parity 0; kept and written back bit for bit."""
    report = verify(fbgemm, seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0 and all(p.max_abs == 0.0 for p in report.points)
    out = kept(fbgemm, tmp_path)
    report = verify(out, seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0
    code, _, err = run("convert", out, tmp_path / "hf", "--to", "hf")
    assert code == 0, err
    same_tensors(state(tmp_path / "hf"), state(fbgemm))
    assert quantization_config(tmp_path / "hf") == quantization_config(fbgemm)


def _set(name: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.update({name: value})


def _nan(t: dict[str, torch.Tensor]) -> None:
    t["model.layers.1.mlp.up_proj.weight_scale"][3, 0] = float("nan")


UP = "model.layers.0.mlp.up_proj.weight"


@pytest.mark.parametrize(("config", "tensors", "said"), [
    (lambda q: q.update(activation_scale_ub="big"), None, "activation_scale_ub 'big' is not a number"),
    (lambda q: q.update(input_scale_ub=1.0), None, "quantization_config.input_scale_ub is an option"),
    (None, _nan, "holds NaN or Inf scales"),
    (None, _set(UP + "_scale", torch.ones(256)), "has shape [256], but 'model.layers.0.mlp.up_proj.weight' [256, 128] "
                                                 "needs one scale per row: [256, 1]"),
    (None, _set(UP + "_scale", torch.ones(256, 1, dtype=torch.bfloat16)), "FP8 scales are read as float32 only"),
    (None, _set(UP, torch.zeros(4, 256, 128).to(torch.float8_e4m3fn)), "fbgemm FP8 is read for linear layers"),
], ids=["bound", "unknown", "nan", "scale-shape", "bf16-scale", "stacked"])
def test_fbgemm_refusals_are_one_line(fbgemm: Path, tmp_path: Path, config: Any, tensors: Any, said: str) -> None:
    src = edited(fbgemm, tmp_path / "src", config=config, tensors=tensors)
    err = one_line_refusal(src, tmp_path / "out", "--dtype", "bfloat16")
    assert said in err, err
