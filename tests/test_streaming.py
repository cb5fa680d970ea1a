"""The streamed safetensors writer and reader, checked through the safetensors library itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lmconvert.convert.safetensors_dir import TensorSource
from lmconvert.convert.shards import Planned, RawBytes, file_sha256, tensor_sha256, write_shards

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool, torch.float64]


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, dtype in enumerate(DTYPES):
        shape = [(3, 5), (7,), (2, 3, 4), (1,), (9, 1), (4, 4), (5,)][i]
        base = torch.randn(shape, generator=g) * 50
        out[f"t{i}.{str(dtype)[6:]}"] = base > 0 if dtype == torch.bool else base.to(dtype)
    out["scalar"] = torch.tensor(3.5)
    out["empty"] = torch.zeros(0, 4)
    return out


def _plan(tensors: dict[str, torch.Tensor]) -> list[Planned]:
    return [Planned(n, tuple(t.shape), t.dtype, (lambda t=t: t)) for n, t in tensors.items()]


@pytest.mark.parametrize("max_bytes", [10**9, 64, 1])
def test_streamed_shards_read_back_through_safetensors(tmp_path: Path, max_bytes: int) -> None:
    tensors = _tensors()
    written = write_shards(_plan(tensors), tmp_path, max_bytes)
    hashes = written.tensors
    files = sorted(tmp_path.glob("*.safetensors"))
    assert (len(files) == 1) == (max_bytes == 10**9)
    loaded: dict[str, torch.Tensor] = {}
    for f in files:
        loaded.update(load_file(f))
        with safe_open(str(f), framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)
        assert hashes[name] == tensor_sha256(t)
    assert written.files == {f.name: file_sha256(f) for f in files}
    if len(files) > 1:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(tensors)
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())


def test_reader_returns_what_safetensors_returns(tmp_path: Path) -> None:
    tensors = _tensors()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with TensorSource(tmp_path) as source:
        for name, t in tensors.items():
            got = source.get(name)
            assert got.dtype == t.dtype and source.shape(name) == tuple(t.shape) and torch.equal(got, t)


def test_writer_refuses_a_tensor_unlike_its_plan(tmp_path: Path) -> None:
    plan = [Planned("x", (2, 2), torch.float32, lambda: torch.zeros(2, 3))]
    with pytest.raises(RuntimeError, match="planned"):
        write_shards(plan, tmp_path, 10**9)


def test_raw_copies_equal_decoded_writes(tmp_path: Path) -> None:
    """Byte-for-byte copies out of a source file (copy_file_range) give the same file, hashes and
    checks as decoding and writing the tensors."""
    tensors = _tensors()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "raw").mkdir()
    (tmp_path / "decoded").mkdir()
    checked = []
    with TensorSource(tmp_path) as source:
        raw = [Planned(n, tuple(t.shape), t.dtype, lambda: pytest.fail("raw tensors are not decoded"),
                       RawBytes(*source.raw_location(n)), lambda t: checked.append(t.clone()))
               for n, t in tensors.items()]
        a = write_shards(raw, tmp_path / "raw", 10**9)
    b = write_shards(_plan(tensors), tmp_path / "decoded", 10**9)
    assert a.tensors == b.tensors and a.files == b.files
    files = [tmp_path / kind / "model.safetensors" for kind in ("raw", "decoded")]
    assert files[0].read_bytes() == files[1].read_bytes()
    assert [t.dtype for t in checked] == [t.dtype for t in tensors.values()]
    assert all(torch.equal(c, t) for c, t in zip(checked, tensors.values(), strict=True))
