"""The streamed safetensors writer and reader, checked through the safetensors library itself."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import blake3
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lmconvert.formats import shards
from lmconvert.formats.digest import (
    CHUNK,
    FiniteCheck,
    memory_chunks,
    scan,
    scan_run,
    tensor_bytes,
    tensor_digest,
)
from lmconvert.formats.dtypes import dominant, of_torch
from lmconvert.formats.errors import InputError
from lmconvert.formats.safetensors_dir import TensorSource
from lmconvert.formats.shards import Planned, RawBytes, write_shards

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
    return [Planned(n, tuple(t.shape), of_torch(t.dtype).name, (lambda t=t: t)) for n, t in tensors.items()]


def _header_blake3(path: Path) -> str:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return blake3.blake3(data[:8 + length]).hexdigest()


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
        data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        assert hashes[name] == blake3.blake3(data).hexdigest()
    assert written.shards == {f.name: {"header": _header_blake3(f), "bytes": f.stat().st_size} for f in files}
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
    plan = [Planned("x", (2, 2), "F32", lambda: torch.zeros(2, 3))]
    with pytest.raises(RuntimeError, match="planned"):
        write_shards(plan, tmp_path, 10**9)


def test_raw_copies_equal_decoded_writes(tmp_path: Path) -> None:
    """Byte-for-byte copies out of a source file (by the worker threads) give the same file and hashes
    as decoding and writing the tensors, and pass the NaN/Inf check of finite weights."""
    tensors = _tensors()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "raw").mkdir()
    (tmp_path / "decoded").mkdir()
    with TensorSource(tmp_path) as source:
        raw = [Planned(n, tuple(t.shape), source.dtype_name(n), lambda: pytest.fail("raw tensors are not decoded"),
                       RawBytes(*source.raw_location(n)), FiniteCheck(n, source.where(n)))
               for n, t in tensors.items()]
        a = write_shards(raw, tmp_path / "raw", 10**9)
    b = write_shards(_plan(tensors), tmp_path / "decoded", 10**9)
    assert a.tensors == b.tensors and a.shards == b.shards
    files = [tmp_path / kind / "model.safetensors" for kind in ("raw", "decoded")]
    assert files[0].read_bytes() == files[1].read_bytes()


def test_raw_copy_of_a_nan_is_refused_by_name(tmp_path: Path) -> None:
    tensors = {"a": torch.ones(3 * CHUNK // 4), "b": torch.ones(4, 4), "c": torch.ones(2)}
    tensors["b"][1, 2] = float("nan")
    tensors["b"][3, 0] = float("-inf")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with TensorSource(tmp_path) as source:
        raw = [Planned(n, tuple(t.shape), "F32", lambda: pytest.fail("not decoded"),
                       RawBytes(*source.raw_location(n)), FiniteCheck(n, source.where(n))) for n, t in tensors.items()]
        (tmp_path / "out").mkdir()
        with pytest.raises(InputError, match=r"model.safetensors: tensor 'b' holds 2 NaN/Inf"):
            write_shards(raw, tmp_path / "out", 10**9)


FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nonfinite_count_from_bits_equals_torch(dtype: torch.dtype) -> None:
    """Random bit patterns (every one, for 8-bit types), in chunks: the integer test counts exactly
    what torch.isfinite rejects, and the digests are the hash libraries' own over the same bytes."""
    size = torch.empty((), dtype=dtype).element_size()
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 256, ((CHUNK * 5) // 2 + 24,), dtype=torch.uint8, generator=g)
    if size == 1:
        bits[:256] = torch.arange(256, dtype=torch.uint8)  # every pattern at least once
    t = bits.view(dtype)
    result = scan(memory_chunks(tensor_bytes(t)), of_torch(dtype).name)
    assert result.nonfinite == int((~torch.isfinite(t.float() if size == 1 else t)).sum()) > 0
    assert result.digest == blake3.blake3(bits.numpy().tobytes()).hexdigest() == tensor_digest(t)
    assert tensor_digest(t, "sha256") == hashlib.sha256(bits.numpy().tobytes()).hexdigest()


def _patterns(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(finite, nonfinite) bit patterns of a float type as the same-size integer, by torch's own
    isfinite: every pattern for 8- and 16-bit types; for wider ones, those at the edges between
    finite and not (largest finite of each sign, smallest NaN/Inf of each sign, all-ones) and random
    ones, some forced to an all-ones exponent."""
    size = torch.empty((), dtype=dtype).element_size()
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    if size <= 2:
        bits = torch.arange(1 << (8 * size), dtype=torch.int32).to(ints)
    else:
        one, exponent = torch.tensor(1, dtype=ints), torch.tensor(torch.finfo(dtype).max, dtype=dtype).view(ints)
        sign = one << (8 * size - 1)
        edges = [exponent, exponent + 1, exponent | sign, (exponent + 1) | sign, ~sign, -one, one, sign, exponent + 2]
        g = torch.Generator().manual_seed(2)
        randoms = torch.randint(-(2**31), 2**31 - 1, (4096, size // 4), dtype=torch.int64, generator=g).to(torch.int32)
        randoms = randoms.contiguous().view(ints).reshape(-1)
        bits = torch.cat([torch.stack(edges), randoms, randoms[:1024] | (exponent + 1)])  # finfo.max + 1: Inf
    values = bits.view(dtype)
    finite = torch.isfinite(values.float() if size == 1 else values)
    return bits[finite], bits[~finite]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_each_nonfinite_pattern_alone_among_finite_values_is_found(dtype: torch.dtype) -> None:
    """The check tells at once a chunk with no NaN/Inf (two max reductions over its bits) and
    counts only in one that has some: each NaN/Inf bit pattern, alone among the finite patterns
    nearest to it as signed or unsigned integers, is found; the finite ones alone are not."""
    finite, nonfinite = _patterns(dtype)
    name = of_torch(dtype).name
    hardest = torch.cat([finite.sort().values[-512:], finite.sort().values[:512], finite[::97]])  # as signed
    negative = finite[finite < 0].sort().values  # as unsigned integers, the largest are the negatives nearest -1
    hardest = torch.cat([hardest, negative[-512:]])
    assert scan(memory_chunks(tensor_bytes(hardest.view(dtype))), name).nonfinite == 0
    for i, bad in enumerate(nonfinite):
        with_one = hardest.clone()
        with_one[(i * 131) % len(with_one)] = bad
        assert scan(memory_chunks(tensor_bytes(with_one.view(dtype))), name).nonfinite == 1, hex(int(bad))


def test_rename_only_conversions_never_import_torch(tmp_path: Path) -> None:
    """HF -> canonical -> HF of a safetensors checkpoint copies bytes only, and inspect reads no
    weights: they must work with torch made unimportable (importing it costs more than a second,
    as long as copying a gigabyte)."""
    import subprocess
    import sys

    from hf_models import make_checkpoint

    src = make_checkpoint(tmp_path / "hf", "qwen3", dtype=torch.bfloat16)
    script = ("import sys; sys.modules['torch'] = None\n"  # `import torch` now raises ImportError
              "from lmconvert.cli import main\n"
              "main(sys.argv[1:])")
    run = [sys.executable, "-c", script]
    for args in (["convert", src, tmp_path / "can"], ["verify", "--files", tmp_path / "can"],
                 ["convert", tmp_path / "can", tmp_path / "back", "--to", "hf"], ["inspect", src],
                 ["inspect", tmp_path / "can"]):
        proc = subprocess.run([*run, *map(str, args)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    for name, t in load_file(src / "model.safetensors").items():
        assert torch.equal(load_file(tmp_path / "back" / "model.safetensors")[name], t)


def test_progress_counts_each_tensor_once_in_order(tmp_path: Path) -> None:
    """Tensors are moved (raw) or written (produced) by worker threads; progress is still
    reported from the caller's thread, once per tensor as each is done, in bytes written of all."""
    import threading

    tensors = _tensors()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    seen: list[tuple[int, int, int]] = []
    with TensorSource(tmp_path) as source:
        plan = [Planned(n, tuple(t.shape), source.dtype_name(n), lambda t=t: t,
                        RawBytes(*source.raw_location(n)) if i % 2 else None)
                for i, (n, t) in enumerate(tensors.items())]
        (tmp_path / "out").mkdir()
        write_shards(plan, tmp_path / "out", 64, progress=lambda d, n: seen.append((d, n, threading.get_ident())))
    order = sorted(plan, key=lambda p: (str(p.position[0]), p.position[1])) if all(p.position for p in plan) else plan
    sizes = [p.nbytes for p in order]
    assert [(d, n) for d, n, _ in seen] == [(sum(sizes[:i]), sum(sizes)) for i in range(1, len(plan) + 1)]
    assert sum(sizes) == sum(t.nbytes for t in tensors.values())
    assert {thread for _, _, thread in seen} == {threading.get_ident()}
    loaded = {}
    for f in (tmp_path / "out").glob("*.safetensors"):
        loaded.update(load_file(f))
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())


def test_a_model_dtype_is_a_float_type_when_it_has_one() -> None:
    assert dominant([("F32", 40), ("BF16", 100), ("F32", 40)]) == "BF16"
    assert dominant([("I64", 10**6), ("F16", 8)]) == "F16"  # a large integer buffer is not the model's dtype
    assert dominant([("I64", 8), ("U8", 16)]) == "U8"


def test_produced_tensors_queue_up_to_their_budget_or_one_tensor(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Produced tensors are written by the workers while the next is produced, but no more of
    their bytes wait at once than PRODUCED_IN_FLIGHT, or one tensor larger than it; what is
    written is what was produced, in its place."""
    from lmconvert.formats import shards

    monkeypatch.setattr(shards, "PRODUCED_IN_FLIGHT", 1000)
    tensors = {f"t{i}": torch.full((size,), float(i)) for i, size in enumerate([100, 50, 300, 20, 100, 80, 5, 200])}
    held: list[int] = []
    produced = shards._Writer.produced

    def watched(self: shards._Writer, p: Planned, fd: int, offset: int) -> None:
        produced(self, p, fd, offset)
        held.append(self._held)
        assert self._held <= max(shards.PRODUCED_IN_FLIGHT, p.nbytes)

    monkeypatch.setattr(shards._Writer, "produced", watched)
    write_shards(_plan(tensors), tmp_path, 10**9)
    # bytes queued after each: several at once; the oldest written first to make room, the whole
    # budget for the 1200-byte tensor alone
    assert held == [400, 600, 1200, 80, 480, 800, 820, 820]
    assert all(torch.equal(load_file(tmp_path / "model.safetensors")[n], t) for n, t in tensors.items())


@pytest.mark.parametrize("lengths", [[0, 5, 0, CHUNK // 2, CHUNK // 2 + 3, 0, 1, 3 * CHUNK // 4, 0], [CHUNK // 2],
                                     [0, 0], [7]], ids=["mixed", "one-chunk", "empty", "tiny"])
def test_a_run_scans_each_tensor_as_scanning_it_alone_would(lengths: list[int]) -> None:
    """Tensors back to back, read in chunks that cross their boundaries: each gets its own digest and
    NaN/Inf count, the same as scanning its bytes alone, and every byte reaches the sink once."""
    g = torch.Generator().manual_seed(3)
    pieces = [torch.randn(n, generator=g).to(torch.bfloat16) for n in lengths]
    pieces[1 if len(pieces) > 1 else 0].view(-1)[:1] = float("nan")
    sizes = [t.numel() * 2 for t in pieces]
    data = b"".join(t.view(torch.int16).numpy().tobytes() for t in pieces)
    sunk = bytearray()
    scans = scan_run(memory_chunks(memoryview(data)), sizes, "BF16", sink=sunk.extend)
    assert bytes(sunk) == data
    assert scans == [scan(memory_chunks(memoryview(t.view(torch.int16).numpy().tobytes())), "BF16") for t in pieces]
    assert [s.nonfinite for s in scans] == [int(t.isnan().sum()) for t in pieces]


def test_a_run_given_more_or_fewer_bytes_than_its_tensors_is_an_error() -> None:
    with pytest.raises(ValueError, match="given more"):
        scan_run(memory_chunks(memoryview(b"x" * 10)), [4, 4], "U8")
    with pytest.raises(ValueError, match="ended early"):
        scan_run(memory_chunks(memoryview(b"x" * 6)), [4, 4], "U8")


def test_small_tensors_back_to_back_move_as_few_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixture-of-experts checkpoints hold thousands of small tensors: those that lie back to back in
    a source file, with one dtype and one check, are moved by one job of at most RUN_BYTES, and each
    still gets its own digest."""
    tensors = {f"e{i:03d}": torch.full((1000,), float(i)) for i in range(300)}  # 4 kB each, 1.2 MB in all
    tensors["z.half"] = torch.ones(8, dtype=torch.float16)  # another dtype: a run of its own
    save_file(tensors, str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(shards, "RUN_BYTES", 100 * 4000)
    jobs: list[int] = []
    submit = shards.Movers.submit

    def counted(self: shards.Movers, work, file, nbytes):  # noqa: ANN001, ANN202
        jobs.append(nbytes)
        return submit(self, work, file, nbytes)

    monkeypatch.setattr(shards.Movers, "submit", counted)
    with TensorSource(tmp_path) as source:
        raw = [Planned(n, tuple(t.shape), source.dtype_name(n), lambda: pytest.fail("not decoded"),
                       RawBytes(*source.raw_location(n)), FiniteCheck(n, source.where(n))) for n, t in tensors.items()]
        (tmp_path / "out").mkdir()
        written = write_shards(raw, tmp_path / "out", 10**9)
    assert jobs == [400000, 400000, 400000, 16]
    loaded = load_file(tmp_path / "out" / "model.safetensors")
    for name, t in tensors.items():
        assert torch.equal(loaded[name], t)
        assert written.tensors[name] == blake3.blake3(t.numpy().tobytes()).hexdigest()
