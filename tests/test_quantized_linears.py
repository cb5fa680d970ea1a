"""GPTQ, AWQ and compressed-tensors checkpoints through the quantization table (issue #27): `convert`
keeps their parts as they are (`--to hf` gives back tensors and quantization_config bit for bit),
`--dtype` dequantizes, `lmconvert.load` and `verify` dequantize, GGUF out dequantizes then quantizes.

GPTQ and AWQ tiny llamas are hand-packed by the packers' own loops (tests/test_gptq.py, test_awq.py)
and every dequantized weight is held to the reference formula written out there (gptqmodel's
`dequantize_weight`, AutoAWQ's `dequantize_gemm`): transformers 5.25 loads them only through gptqmodel,
which does not install beside this CPU torch, so verify's reference is transformers running those
weights. compressed-tensors checkpoints are written by the package's own compressors
(tests/test_compressed_tensors.py) and held to transformers' decompressed load
(`CompressedTensorsConfig(run_compressed=False)`), which is verify's reference for one config group;
for several (which transformers 5.25 fails to load), transformers running our dequantized weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import test_awq
import test_gptq
import torch
from safetensors.torch import load_file, save_file
from test_cli import run
from test_compressed_tensors import CONFIGS, int_args, quantized_checkpoint
from test_fp8 import SEQ_LEN, edited, one_line_refusal, same_gguf_as_dequantized
from test_quantized import kept, plain_llama, quantization_config, same_tensors, state
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

import lmconvert
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.runtime.card import card
from lmconvert.verify.run import verify

pytestmark = pytest.mark.slow  # each builds, converts and verifies checkpoints (1.5 s and more)

GPTQ_CASES = {  # name -> bits, group_size, sym, desc_act, v1 (checkpoint_format "gptq"), g_idx stored
    "4bit-sym": (4, 32, True, False, True, True),
    "4bit-asym-desc": (4, 32, False, True, True, True),
    "8bit-asym-v2": (8, 64, False, False, False, False),
    "8bit-desc-per-row": (8, -1, True, True, False, True),
}


Packer = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def packed_copy(src: Path, dst: Path, pack: Packer, quant: dict[str, Any]) -> tuple[Path, dict[str, torch.Tensor]]:
    """`src` with every projection `X.weight` replaced by the parts `pack` gives (suffix -> tensor);
    with each weight the format's reference formula gives from them ([out, in], the scales' dtype)."""
    out: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if not (name.endswith(".weight") and "proj" in name):
            out[name] = tensor
            continue
        parts, expected[name] = pack(tensor.float())
        out.update({name.removesuffix("weight") + suffix: part for suffix, part in parts.items()})
    dst.mkdir()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant
    (dst / "config.json").write_text(json.dumps(config))
    return dst, expected


def gptq_copy(src: Path, dst: Path, bits: int, group_size: int, sym: bool, desc_act: bool, v1: bool,
              g_idx: bool) -> tuple[Path, dict[str, torch.Tensor]]:
    """Packed by gptqmodel's loops; the weights gptqmodel's `dequantize_weight` gives."""
    def pack(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        intw, zeros, scales, idx = test_gptq.quantize(weight, bits, group_size, sym, desc_act)
        qweight, qzeros = test_gptq.pack(intw, zeros, bits, v1)
        parts = {"qweight": qweight, "qzeros": qzeros, "scales": scales, **({"g_idx": idx} if g_idx else {})}
        return parts, test_gptq.reference(qweight, qzeros, scales, idx, bits, v1)
    return packed_copy(src, dst, pack, test_gptq.config(bits, group_size, sym, desc_act, v1))


def awq_copy(src: Path, dst: Path, group_size: int = 32) -> tuple[Path, dict[str, torch.Tensor]]:
    """Packed by AutoAWQ's `WQLinear_GEMM.from_linear` loop; the weights its `dequantize_gemm` gives."""
    def pack(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        intw, zeros, scales = test_awq.quantize(weight, group_size)
        qweight, qzeros = test_awq.pack(intw.t().contiguous()), test_awq.pack(zeros)
        return {"qweight": qweight, "qzeros": qzeros, "scales": scales}, \
            test_awq.reference(qweight, qzeros, scales, group_size).t()
    return packed_copy(src, dst, pack, {**test_awq.CONFIG, "group_size": group_size})


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plain_llama(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module", params=list(GPTQ_CASES))
def gptq(request: pytest.FixtureRequest, plain: Path,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    return gptq_copy(plain, tmp_path_factory.mktemp("gptq") / request.param, *GPTQ_CASES[request.param])


@pytest.fixture(scope="module")
def awq(plain: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    return awq_copy(plain, tmp_path_factory.mktemp("awq") / "awq")


# compressed-tensors: one group (W4A16 asymmetric groups, packed; W8A8 FP8 with dynamic inputs, the
# weight stored as it is; FP8 with a static input scale kept beside it) and two groups of their own
# formats
TWO_GROUPS = {**CONFIGS["w4a16-group"], "format": "mixed-precision", "config_groups": {
    "group_0": {"targets": ["re:.*self_attn.*"], "weights": int_args(4, "group", False, 16),
                "input_activations": None, "output_activations": None, "format": "pack-quantized"},
    "group_1": {"targets": ["re:.*mlp.*"], "weights": int_args(8, "channel", True),
                "input_activations": None, "output_activations": None, "format": "int-quantized"}}}
CT_CASES = {"w4a16-group-asym": CONFIGS["w4a16-group-asym"], "fp8-dynamic": CONFIGS["fp8-channel"],
            "fp8-static-input": CONFIGS["fp8-static-input"], "two-groups": TWO_GROUPS}


@pytest.fixture(scope="module", params=list(CT_CASES))
def compressed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantized_checkpoint(tmp_path_factory.mktemp("ct") / request.param, CT_CASES[request.param],
                                torch.bfloat16)


def written_back(src: Path, out: Path, tmp_path: Path) -> None:
    """`--to hf` from the kept checkpoint and in one step from the source: the source's tensors and
    quantization_config, bit for bit."""
    for args, where in [((out, tmp_path / "hf"), "hf"), ((src, tmp_path / "direct"), "direct")]:
        code, _, err = run("convert", *args, "--to", "hf")
        assert code == 0, err
        same_tensors(state(tmp_path / where), state(src))
        assert quantization_config(tmp_path / where) == quantization_config(src)


def loaded_equal(src: Path, out: Path, expected: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Each dequantized canonical weight is the reference's (stored names), cast to `dtype`."""
    ours = dict(lmconvert.load(out, dtype=dtype).named_parameters())
    with open_checkpoint(src) as checkpoint:
        for canonical, (stored, transform) in checkpoint.plan.items():
            if stored in expected:
                want = transform.forward(expected[stored]).to(dtype).contiguous()
                assert torch.equal(ours[canonical].view(torch.uint8), want.view(torch.uint8)), canonical
        assert sum(stored in expected for stored, _ in checkpoint.plan.values()) == 14


def passes_at_zero(path: Path) -> None:
    report = verify(path, seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0 and all(p.max_abs == 0.0 for p in report.points)


def test_gptq_kept_loaded_verified_written_back(gptq: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    src, expected = gptq
    out = kept(src, tmp_path)
    names = set(state(out))
    assert "layers.0.mlp.up.qweight" in names and "layers.0.mlp.up.weight" not in names
    assert json.loads((out / "lmconvert.json").read_text())["quantization"] == quantization_config(src)
    for dtype in (torch.float32, torch.bfloat16):
        loaded_equal(src, out, expected, dtype)
    passes_at_zero(out)
    written_back(src, out, tmp_path)
    assert "verify's reference: transformers running lmconvert's dequantized weights" in card(src)["quantization"]


def test_awq_kept_loaded_verified_written_back(awq: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    src, expected = awq
    out = kept(src, tmp_path)
    for dtype in (torch.float32, torch.bfloat16):
        loaded_equal(src, out, expected, dtype)
    passes_at_zero(src)
    passes_at_zero(out)
    written_back(src, out, tmp_path)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtype_dequantizes_as_the_reference_formula(awq: tuple[Path, dict[str, torch.Tensor]],
                                                     gptq: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path,
                                                     dtype: str) -> None:
    for i, (src, expected) in enumerate((awq, gptq)):
        out = tmp_path / f"{i}"
        code, _, err = run("convert", src, out, "--dtype", dtype)
        assert code == 0, err
        assert not json.loads((out / "lmconvert.json").read_text()).get("quantization")
        loaded_equal(src, out, expected, getattr(torch, dtype))


def decompressed(src: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype,
                                                 quantization_config=CompressedTensorsConfig(run_compressed=False))
    return {name: t.detach() for name, t in model.state_dict().items()}


def test_compressed_tensors_kept_loaded_verified_written_back(compressed: Path, tmp_path: Path) -> None:
    """Kept and written back bit for bit; dequantized (kept, and by --dtype) as transformers'
    decompressed load gives each weight, float32 and bfloat16 (one group: the package's own
    decompression through transformers; two groups, which transformers 5.25 fails to load: our
    dequantization, the package's formula, held to it by tests/test_compressed_tensors.py); verify at 0."""
    src = compressed
    out = kept(src, tmp_path)
    groups = len(quantization_config(src)["config_groups"])
    if groups == 1:
        for dtype in ("float32", "bfloat16"):
            ref = {n: t for n, t in decompressed(src, getattr(torch, dtype)).items() if "proj" in n}
            loaded_equal(src, out, ref, getattr(torch, dtype))
            code, _, err = run("convert", src, tmp_path / dtype, "--dtype", dtype)
            assert code == 0, err
            loaded_equal(src, tmp_path / dtype, ref, getattr(torch, dtype))
    passes_at_zero(out)
    written_back(src, out, tmp_path)
    line = card(src)["quantization"]
    assert ("transformers' own dequantizing load" in line) == (groups == 1), line
    if "dynamic" in src.name:
        assert "input activations float8 per token, dynamic" in line, line


def test_two_groups_are_resolved_per_module(tmp_path: Path) -> None:
    """Each linear dequantized by its own group (int4 packed attention, int8 MLP), in the source and
    in the kept canonical checkpoint, whose names no target matches."""
    src = quantized_checkpoint(tmp_path / "two", TWO_GROUPS, torch.float32)
    stored = load_file(src / "model.safetensors")
    assert "model.layers.0.self_attn.q_proj.weight_packed" in stored
    assert stored["model.layers.0.mlp.up_proj.weight"].dtype == torch.int8
    out = kept(src, tmp_path)
    with open_checkpoint(src) as source, open_checkpoint(out) as canonical:
        for name in canonical.plan:
            assert torch.equal(canonical.tensor(name), source.tensor(name)), name


def test_gguf_dequantizes_then_quantizes(awq: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    """GGUF out of an AWQ source (in one step, and from its kept checkpoint) is the file its
    dequantized float32 canonical checkpoint gives, tensor for tensor."""
    same_gguf_as_dequantized(awq[0], tmp_path, ("q8_0",))


Q = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(("fmt", "config", "tensors", "said"), [
    ("gptq", lambda q: q.update(bits=3), None, "quantization_config.bits 3 is not handled"),
    ("gptq", lambda q: q.update(dynamic={"-:.*": {}}), None, "quantization_config.dynamic"),
    ("gptq", None, lambda t: t.update({Q + ".scales": torch.ones(3, 128, dtype=torch.float16)}),
     "'model.layers.0.self_attn.q_proj.scales' has shape [3, 128], but GPTQ"),
    ("gptq", None, lambda t: t.pop(Q + ".qzeros"), "no 'model.layers.0.self_attn.q_proj.qzeros'"),
    ("gptq", None, lambda t: t[Q + ".scales"].__setitem__((0, 0), float("nan")), "holds NaN or Inf scales"),
    ("gptq", None, lambda t: t[Q + ".g_idx"].__setitem__(0, 99), "holds groups from 0 to 99"),
    ("awq", lambda q: q.update(version="gemv"), None, "quantization_config.version 'gemv' is not handled"),
    ("awq", None, lambda t: t.update({Q + ".scales": torch.ones(4, 120, dtype=torch.float16)}),
     "'model.layers.0.self_attn.q_proj.scales' has shape [4, 120], but AWQ"),
    ("awq", None, lambda t: t.update({Q + ".qweight": torch.zeros(128, 15, dtype=torch.int32)}),
     "'model.layers.0.self_attn.q_proj.qzeros' has shape [4, 16], but AWQ"),
], ids=["gptq-bits", "gptq-dynamic", "gptq-scale-shape", "gptq-missing", "gptq-nan", "gptq-g_idx", "awq-gemv",
        "awq-scale-shape", "awq-packed-size"])
def test_refusals_are_one_line(plain: Path, awq: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, fmt: str,
                               config: Any, tensors: Any, said: str) -> None:
    if fmt == "gptq":  # asymmetric 4-bit with desc_act: every part, g_idx included
        source, _ = gptq_copy(plain, tmp_path / "gptq", *GPTQ_CASES["4bit-asym-desc"])
    else:
        source = awq[0]
    src = edited(source, tmp_path / "src", config=config, tensors=tensors)
    err = one_line_refusal(src, tmp_path / "out", "--dtype", "bfloat16")
    assert said in err, err


@pytest.mark.parametrize(("config", "tensors", "said"), [
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block"), None, "strategy 'block'"),
    (lambda q: q.update(kv_cache_scheme={"num_bits": 8}), None, "quantization_config.kv_cache_scheme"),
    (None, lambda t: t.update({Q + ".weight_scale": torch.ones(64, 3)}),
     "'model.layers.0.self_attn.q_proj.weight_scale' has shape [64, 3]"),
    (None, lambda t: t.pop(Q + ".weight_shape"), "no 'model.layers.0.self_attn.q_proj.weight_shape'"),
], ids=["block", "kv-cache", "scale-shape", "missing-shape"])
def test_compressed_tensors_refusals_are_one_line(tmp_path: Path, config: Any, tensors: Any, said: str) -> None:
    source = quantized_checkpoint(tmp_path / "w4a16", CONFIGS["w4a16-group-asym"], torch.bfloat16)
    src = edited(source, tmp_path / "src", config=config, tensors=tensors)
    err = one_line_refusal(src, tmp_path / "out", "--dtype", "bfloat16")
    assert said in err, err


def test_a_transform_the_parts_cannot_follow_is_refused_by_name(tmp_path: Path) -> None:
    """Phi-3's fused gate_up_proj (and qkv_proj) are split into rows by its table: GPTQ's packed words
    cannot follow (qzeros packs the outputs), so keeping them is refused in one line naming the tensor
    and --dtype; dequantized, they convert, each piece the reference formula's rows."""
    from hf_models import build_model, save_checkpoint

    plain = save_checkpoint(build_model("phi3"), tmp_path / "plain", torch.bfloat16)
    src, expected = gptq_copy(plain, tmp_path / "gptq", *GPTQ_CASES["4bit-asym-desc"])
    err = one_line_refusal(src, tmp_path / "kept")
    assert "gate_up_proj.weight' is quantized" in err and "cannot follow" in err and "--dtype" in err, err
    code, _, err = run("convert", src, tmp_path / "f32", "--dtype", "float32")
    assert code == 0, err
    with open_checkpoint(src) as source, open_checkpoint(tmp_path / "f32") as ours:
        for canonical, (stored, transform) in source.plan.items():
            if stored in expected:
                assert torch.equal(ours.tensor(canonical), transform.forward(expected[stored]).float()), canonical
