"""`convert --dtype` of the tensors a quantized checkpoint keeps in float (GPTQ's float16 embedding and
norms), and of any safetensors tensor cast on its own: cast a band of rows at a time as they are read
(convert/plan.py's `banded_cast` over a reader's `banded`), so neither the source tensor nor its float32
widening is held whole beside the cast (the 1B GPTQ import's embedding: 1383 MB peak before). Each
tensor written is bit for bit torch's cast of the whole source tensor, and a NaN is refused by name as
before, with bands that do not divide the rows.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_cli import run
from test_quantized import plain_llama
from test_quantized_linears import GPTQ_CASES, gptq_copy

from lmconvert.convert import convert
from lmconvert.convert import plan as plan_module
from lmconvert.formats import quant_bands
from lmconvert.formats.digest import tensor_digest
from lmconvert.formats.quant_bands import dequantize_into
from lmconvert.formats.safetensors_dir import TensorSource

pytestmark = pytest.mark.slow  # each builds a GPTQ checkpoint and converts it (1.5 s and more)

BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


@pytest.fixture(scope="module")
def float16_gptq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPTQ llama whose unquantized tensors are float16, as GPTQ checkpoints ship them."""
    root = tmp_path_factory.mktemp("f16gptq")
    src, _ = gptq_copy(plain_llama(root), root / "gptq", *GPTQ_CASES["4bit-sym"])
    tensors = {n: t.half() if t.dtype == torch.bfloat16 else t for n, t in load_file(src / "model.safetensors").items()}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    return src


def names_read(monkeypatch: pytest.MonkeyPatch, owner: type, method: str) -> list[str]:
    """The names `owner.method(self, name)` is called with from now on (a reader's whole reads)."""
    names: list[str] = []
    read = getattr(owner, method)

    def spy(self: object, name: str) -> torch.Tensor:
        names.append(name)
        return read(self, name)
    monkeypatch.setattr(owner, method, spy)
    return names


def whole_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The safetensors tensors read whole (`TensorSource.get`) from now on; pieces of 4099 bytes'
    worth of rows, in bands of 1031 (several per tensor, the last one short)."""
    names = names_read(monkeypatch, TensorSource, "get")
    monkeypatch.setattr(quant_bands, "dequantize_into", partial(dequantize_into, band_bytes=1031))
    monkeypatch.setattr(plan_module, "dequantize_into", partial(dequantize_into, band_bytes=1031))
    monkeypatch.setattr(plan_module, "cast_pieces", partial(quant_bands.cast_pieces, piece_bytes=4099))
    return names


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_float_tensors_are_cast_band_by_band(float16_gptq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             dtype: str) -> None:
    src = float16_gptq
    source = load_file(src / "model.safetensors")
    plain = {n for n, t in source.items() if t.dtype == torch.float16 and not n.endswith(".scales")}
    assert "model.embed_tokens.weight" in plain
    reads = whole_reads(monkeypatch)
    convert(src, tmp_path / "hf", "hf", dtype=dtype)  # through the canonical view
    convert(src, tmp_path / "canonical", "canonical", dtype=dtype)  # ingest, through the quantized view
    assert not plain & set(reads), sorted(plain & set(reads))
    want = getattr(torch, dtype)
    written = load_file(tmp_path / "hf" / "model.safetensors")
    stored = {n: u for f in (tmp_path / "canonical").glob("*.safetensors") for n, u in load_file(f).items()}
    canonical = {t.view(BITS[t.dtype]).numpy().tobytes() for t in stored.values()}
    meta = json.loads((tmp_path / "canonical" / "lmconvert.json").read_text())
    assert {n: tensor_digest(t, meta["hash"]) for n, t in stored.items()} == meta["tensors"]  # hashed as written
    for name in plain:
        whole = source[name].to(want)
        assert written[name].dtype == want and torch.equal(written[name].view(BITS[want]), whole.view(BITS[want])), name
        assert whole.view(BITS[want]).numpy().tobytes() in canonical, name


def test_a_nan_in_a_band_is_refused_by_name(float16_gptq: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = load_file(float16_gptq / "model.safetensors")
    tensors["model.embed_tokens.weight"][-1, -1] = float("nan")
    src = tmp_path / "nan"
    src.mkdir()
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    for file in float16_gptq.iterdir():
        if file.name != "model.safetensors":
            (src / file.name).write_bytes(file.read_bytes())
    whole_reads(monkeypatch)
    code, _, err = run("convert", src, tmp_path / "out", "--dtype", "bfloat16")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "embed_tokens" in err and "NaN" in err, err
    assert not (tmp_path / "out").exists()
