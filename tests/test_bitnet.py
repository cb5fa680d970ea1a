"""BitNet checkpoints quantized by transformers' BitNet quantizer (the Hub's microsoft/bitnet-b1.58-2B-4T:
ternary weights packed four to a uint8, a weight_scale per matrix) are refused by name, exit 2, never
read as float matrices; the unquantized ones convert (the family tests, tests/specs/bitnet.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_specs import SPECS
from hf_models import build_model, save_checkpoint
from safetensors.torch import load_file, save_file
from test_cli import run
from transformers.integrations.bitnet import pack_weights

import lmconvert
from lmconvert.formats.errors import InputError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized_copy(src: Path, dst: Path) -> Path:
    """The checkpoint as the Hub's BitNet files are: each projection ternarized with its mean-abs scale and
    packed (transformers' `pack_weights`), its `weight_scale` beside it, and the quantizer's config."""
    dst.mkdir()
    tensors = load_file(src / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        if name.rsplit(".", 2)[-2] in PROJECTIONS and name.endswith(".weight"):
            scale = tensor.abs().mean().clamp(min=1e-5)
            out[name] = pack_weights((tensor / scale).round().clamp(-1, 1).to(torch.int8))
            out[name.removesuffix("weight") + "weight_scale"] = scale.reshape(1).to(torch.bfloat16)
        else:
            out[name] = tensor
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                     "quantization_mode": "offline"}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bitnet")
    plain = save_checkpoint(build_model("bitnet", **SPECS["bitnet"].kwargs), root / "plain")
    return plain, quantized_copy(plain, root / "quantized")


def test_the_quantized_copy_is_packed(checkpoints: tuple[Path, Path]) -> None:
    tensors = load_file(checkpoints[1] / "model.safetensors")
    packed = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert packed.dtype == torch.uint8 and packed.shape[0] * 4 == load_file(
        checkpoints[0] / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"].shape[0]


def test_quantized_bitnet_is_refused_by_name(checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    plain, quantized = checkpoints
    lmconvert.load(plain)  # the same files unquantized are read
    with pytest.raises(InputError, match='config.json: quantization_config.quant_method="bitnet": BitNet-quantized'):
        lmconvert.load(quantized)
    code, out, err = run("convert", quantized, tmp_path / "out", "--to", "hf")
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and 'quant_method="bitnet"' in err and "unquantized" in err
    assert not (tmp_path / "out").exists()
