"""llama.cpp's K-quants out (`--quant q2_k|q3_k|q4_k|q5_k|q6_k`, formats/kquants.py), proven by
llama.cpp itself in `make llamacpp-check` (the tests marked llamacpp):
- row by row: our bytes equal ggml's own quantizer's (`ggml_quantize_chunk`, from the libggml-base
  that llama-cpp-python installs, called through ctypes, no importance matrix) on random and
  adversarial rows: zeros, constants, one sign only, huge and tiny magnitudes, subnormals, outliers,
  signed zeros, NaN and Inf, random float32 bit patterns;
- file by file: the same f32 GGUF quantized by `lmconvert convert --quant q4_k` and by
  `llama_model_quantize` (pure, 2 threads) holds the same tensors, of the same types, byte for
  byte, llama-quantize's fallback types included;
- llama.cpp runs our file: its logits are as faithful to the fp32 model as our decoder's on the
  same file (at most 2x its error: llama.cpp also quantizes the activations, to Q8_K), and the
  greedy tokens are ours up to a near-tie (test_llamacpp.check_greedy).
The rest runs in `make test`: the type each tensor gets, and blocks that gguf-py decodes near their input.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from hf_models import make_checkpoint, token_batch
from test_cli import run
from test_quant_bands_plain import names_read

import lmconvert
from lmconvert.convert import convert
from lmconvert.formats import gguf_writer, kquants
from lmconvert.formats.gguf import GgufFile, GgufTensors
from lmconvert.formats.gguf_quant_mix import MIXES
from lmconvert.formats.gguf_writer import FILE_TYPES, tensor_type

KINDS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# llama_ftype that `llama-quantize --pure` takes for each K type alone (llama.h)
FTYPES = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18}


# -- make test: no llama.cpp ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_tensor_types_follow_llama_quantize(kind: str) -> None:
    """llama-quant.cpp's tensor_type_fallback: a row the 256-blocks do not divide takes Q4_0 (Q2_K,
    Q3_K), Q5_0 (Q4_K), Q5_1 (Q5_K) or Q8_0 (Q6_K), F16 where 32 does not divide it either; 1-D stays F32."""
    fallback = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[kind]
    assert tensor_type((64, 512), kind) == kind
    assert tensor_type((4, 64, 256), kind) == kind
    assert tensor_type((64, 320), kind) == fallback
    assert tensor_type((64, 100), kind) == "F16"
    assert tensor_type((512,), kind) == "F32"
    assert FILE_TYPES[kind] == FTYPES[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_encoded_blocks_decode_near_their_input(kind: str) -> None:
    """gguf-py's own dequantizer (not ours) reads our blocks back near their input: within the
    bits the type has."""
    x = np.random.default_rng(1).standard_normal((8, 1024)).astype(np.float32)
    q = kquants.quantize(x, kind)
    assert q.shape == (8, 1024 // 256 * kquants.BLOCK_BYTES[kind])
    back = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[kind])
    bits = int(kind[1])
    rms = float(np.sqrt(np.mean((back - x) ** 2)))
    assert rms < 2.0 ** (2 - bits)  # 0.5 at 2 bits ... 0.06 at 6 for unit-normal values (measured 0.32 ... 0.016)


def test_quantize_refuses_a_partial_block() -> None:
    with pytest.raises(ValueError, match="256"):
        kquants.quantize(np.zeros((2, 320), np.float32), "Q4_K")


def test_a_q4_k_file_reads_back(tmp_path: Path) -> None:
    """`--quant q4_k` writes Q4_K where the rows allow it and llama-quantize's fallback elsewhere;
    lmconvert reads the file back, its weights what gguf-py's dequantizer makes of the bytes."""
    make_checkpoint(tmp_path / "hf", "llama", hidden_size=256, intermediate_size=320, head_dim=64,
                    num_attention_heads=4, num_key_value_heads=2)
    convert(tmp_path / "hf", tmp_path / "m.gguf", "gguf", quant="q4_k")
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    types = {name: t.tensor_type.name for name, t in tensors.items()}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.ffn_down.weight"] == "Q5_0"  # 320 columns
    assert types["blk.0.attn_norm.weight"] == "F32"
    embed = tensors["token_embd.weight"]
    decoded = gguf.quants.dequantize(np.asarray(embed.data), embed.tensor_type)
    model = lmconvert.load(tmp_path / "m.gguf", dtype=torch.float32)
    source = lmconvert.load(tmp_path / "hf", dtype=torch.float32)
    ours = dict(model.named_parameters())["embed.weight"].detach().numpy()
    assert np.array_equal(ours, decoded)
    exact = dict(source.named_parameters())["embed.weight"].detach().numpy()
    assert float(np.abs(ours - exact).max()) <= float(np.abs(exact).max()) / 8
    with torch.no_grad():
        assert torch.isfinite(model(token_batch(seq=16))).all()


def small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of 3 rows of 256 float32 values (and 5 bytes): several per tensor, the last one short."""
    monkeypatch.setattr(gguf_writer, "CHUNK_BYTES", 3 * 256 * 4 + 5)


@pytest.mark.slow  # two conversions, and the f32 GGUF built for them
@pytest.mark.parametrize("kind", ["q4_k", "q6_k", "q8_0"])
def test_an_f32_gguf_is_encoded_band_by_band(kind: str, f32_gguf: tuple[Path, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """From an f32 GGUF, every tensor written unchanged (the embedding, the projections but q/k, the
    norms) is read a band of rows at a time as it is encoded, never whole (llama-quantize holds it
    whole): the file is the one the whole tensors give (and llama-quantize's, in the llamacpp tests)."""
    _, source = f32_gguf
    small_bands(monkeypatch)
    reads = names_read(monkeypatch, GgufFile, "read")  # the GGUF tensors read whole
    convert(source, tmp_path / "bands.gguf", "gguf", quant=kind)
    assert "token_embd.weight" not in reads and "blk.0.ffn_up.weight" not in reads, reads
    monkeypatch.setattr(GgufTensors, "banded", lambda self, name: None)
    convert(source, tmp_path / "whole.gguf", "gguf", quant=kind)
    assert "token_embd.weight" in reads
    assert (tmp_path / "bands.gguf").read_bytes() == (tmp_path / "whole.gguf").read_bytes()


@pytest.mark.slow  # the f32 GGUF built for it
def test_a_nan_read_in_a_band_is_refused_by_name(f32_gguf: tuple[Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN in the last band of an f32 GGUF's embedding is refused as the whole tensor's was, naming
    it, and nothing is written."""
    _, source = f32_gguf
    small_bands(monkeypatch)
    embed = next(t for t in gguf.GGUFReader(source).tensors if t.name == "token_embd.weight")
    data = bytearray(source.read_bytes())
    at = embed.data_offset + embed.n_bytes - 4
    data[at:at + 4] = np.float32(np.nan).tobytes()
    (tmp_path / "nan.gguf").write_bytes(bytes(data))
    code, _, err = run("convert", tmp_path / "nan.gguf", tmp_path / "out.gguf", "--quant", "q4_k")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "embed" in err and "NaN" in err, err
    assert not (tmp_path / "out.gguf").exists()


# -- make llamacpp-check: llama.cpp's own quantizer ----------------------------------------------


def ggml_quantize(rows: np.ndarray, kind: str) -> np.ndarray:
    """ggml_quantize_chunk(type, rows, ...) with no importance matrix, from llama-cpp-python's libggml-base."""
    import llama_cpp

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    chunk = lib.ggml_quantize_chunk
    chunk.restype = ctypes.c_size_t
    chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_void_p]
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    out = np.zeros((rows.shape[0], rows.shape[1] // 256 * kquants.BLOCK_BYTES[kind]), np.uint8)
    written = chunk(int(gguf.GGMLQuantizationType[kind]), rows.ctypes.data, out.ctypes.data, 0, rows.shape[0],
                    rows.shape[1], None)
    assert written == out.size
    return out


def adversarial_rows() -> Iterator[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(27)

    def normal(rows: int, cols: int = 256) -> np.ndarray:
        return rng.standard_normal((rows, cols)).astype(np.float32)

    yield "weights", normal(96, 1024) * 0.02
    yield "uniform", rng.uniform(-1, 1, (32, 512)).astype(np.float32)
    yield "zeros", np.zeros((4, 512), np.float32)
    yield "constant", np.full((4, 256), 0.37, np.float32)
    yield "negative constant", np.full((4, 256), -2.5, np.float32)
    yield "negative only", -np.abs(normal(16))
    yield "positive only", np.abs(normal(16))
    yield "huge", normal(16) * 1e30
    yield "float32 max", np.clip(rng.standard_normal((8, 256)) * 3e38, -3.4e38, 3.4e38).astype(np.float32)
    yield "past fp16", normal(8) * 1e6
    yield "tiny", normal(16) * 1e-30
    yield "subnormal", normal(8) * 1e-40
    yield "near GROUP_MAX_EPS", normal(8) * 1e-16
    yield "magnitudes per row", normal(32) * np.exp(rng.uniform(-20, 20, (32, 1))).astype(np.float32)
    outliers = normal(32) * 0.01
    outliers[rng.random(outliers.shape) < 0.01] = 50.0
    yield "outliers", outliers
    one = normal(16) * 1e-3
    one[:, 7] = 1e4
    yield "one outlier per row", one
    yield "small integers", rng.integers(-8, 8, (32, 256)).astype(np.float32)
    yield "plus minus one", np.tile(np.float32([1.0, -1.0]), (8, 128))
    yield "sparse", (normal(32) * (rng.random((32, 256)) < 0.1)).astype(np.float32)
    mixed = normal(32)
    mixed[:, ::16] = 0
    mixed[5] = 0
    mixed[6, :16] = 1e-20
    mixed[7, :32] = 3.0
    mixed[8, :16] = 1e-16
    yield "zero and flat sub-blocks", mixed
    yield "signed zeros", np.where(rng.random((8, 256)) < 0.5, -0.0, 0.0).astype(np.float32)
    # every float32 bit pattern: NaNs with payloads, Infs, subnormals; where a block's scale is Inf its
    # bytes follow the NaN payloads that survive, which depend on how the compiler ordered commutative
    # operands: equal because _ggml.c is compiled as ggml-base is (setup.py)
    yield "random bit patterns", rng.integers(0, 2**32, (64, 1024), dtype=np.uint32).view(np.float32)
    for value in (np.nan, np.inf, -np.inf):
        bad = normal(8)
        bad[0, 0] = bad[1, 5] = bad[2, 17] = value
        bad[3, 100:140] = value
        bad[4] = value
        yield f"{value} here and there", bad


@pytest.mark.llamacpp
@pytest.mark.parametrize("kind", KINDS)
def test_bytes_equal_ggml_s_quantizer(kind: str) -> None:
    differ = []
    for name, rows in adversarial_rows():
        with np.errstate(all="ignore"):
            ours = kquants.quantize(rows, kind)
        theirs = ggml_quantize(rows, kind)
        if not np.array_equal(ours, theirs):
            blocks = (ours.reshape(-1, kquants.BLOCK_BYTES[kind]) != theirs.reshape(-1, kquants.BLOCK_BYTES[kind]))
            differ.append(f"{name}: {int(blocks.any(axis=1).sum())} blocks")
    assert not differ, f"{kind}: {', '.join(differ)}"


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny LLaMA whose rows are 256-blocks but for ffn_down's (320: llama-quantize's fallback),
    as an f32 GGUF, and its HF source."""
    root = tmp_path_factory.mktemp("kquants")
    make_checkpoint(root / "hf", "llama", hidden_size=256, intermediate_size=320, head_dim=64,
                    num_attention_heads=4, num_key_value_heads=2)
    convert(root / "hf", root / "f32.gguf", "gguf", quant="f32")
    return root / "hf", root / "f32.gguf"


def llama_quantize(src: Path, out: Path, kind: str) -> None:
    """`llama-quantize --pure` to a K type, or to one of its mixes (a MIXES name: not pure)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    mix = MIXES.get(kind)
    params.ftype, params.pure, params.nthread = mix[0] if mix else FTYPES[kind], mix is None, 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) == 0


def same_files(ours_path: Path, theirs_path: Path) -> dict[str, str]:
    """Two GGUF files' tensors, types and bytes and file types compared: {name: our type} when equal."""
    ours, theirs = gguf.GGUFReader(ours_path), gguf.GGUFReader(theirs_path)
    mine, its = {t.name: t for t in ours.tensors}, {t.name: t for t in theirs.tensors}
    assert sorted(mine) == sorted(its)
    types = {name: (t.tensor_type.name, its[name].tensor_type.name) for name, t in mine.items()}
    assert all(a == b for a, b in types.values()), types
    differ = [name for name, t in mine.items()
              if not np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(its[name].data).view(np.uint8))]
    assert not differ
    assert ours.fields["general.file_type"].contents() == theirs.fields["general.file_type"].contents()
    return {name: a for name, (a, _) in types.items()}


@pytest.mark.llamacpp
@pytest.mark.parametrize("kind", KINDS)
def test_file_equals_llama_quantize_s(kind: str, f32_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    _, source = f32_gguf
    convert(source, tmp_path / "ours.gguf", "gguf", quant=kind.lower())
    llama_quantize(source, tmp_path / "theirs.gguf", kind)
    types = same_files(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    assert set(types.values()) == {kind, "F32", {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
                                                 "Q6_K": "Q8_0"}[kind]}


@pytest.mark.llamacpp
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_file_in_small_bands_equals_llama_quantize_s(kind: str, f32_gguf: tuple[Path, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Read and encoded in bands of 3 rows (the last one short), the file is still llama-quantize's."""
    _, source = f32_gguf
    small_bands(monkeypatch)
    convert(source, tmp_path / "ours.gguf", "gguf", quant=kind.lower())
    llama_quantize(source, tmp_path / "theirs.gguf", kind)
    same_files(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")


@pytest.mark.llamacpp
@pytest.mark.parametrize("mix", MIXES)
def test_mix_file_equals_llama_quantize_s(mix: str, f32_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    """`--quant q4_k_m` (and the other mixes) writes the file llama-quantize writes from the same f32
    GGUF: each tensor's type (gguf_quant_mix's choice, proven per family in test_llamacpp_quant_mix)
    and its bytes (the K encoders, and gguf's for the fallback types)."""
    _, source = f32_gguf
    convert(source, tmp_path / "ours.gguf", "gguf", quant=mix)
    llama_quantize(source, tmp_path / "theirs.gguf", mix)
    types = same_files(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")
    assert len(set(types.values()) - {"F32"}) >= 2  # a mix: more than one quantized type


@pytest.mark.llamacpp
@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_runs_our_file(kind: str, f32_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    from test_llamacpp import check_greedy, quantized_logits

    hf, source = f32_gguf
    path = tmp_path / "ours.gguf"
    convert(source, path, "gguf", quant=kind.lower())
    exact, ours, theirs = quantized_logits(hf, path, token_batch(seq=48)[0].tolist())
    their_error, our_error = float((theirs - exact).abs().mean()), float((ours - exact).abs().mean())
    print(f"{kind}: llama.cpp error {their_error:.3e}, ours {our_error:.3e}, ratio {their_error / our_error:.2f}")
    assert their_error <= 2 * our_error
    same = check_greedy(path, token_batch(seq=8)[0].tolist())
    print(f"{kind}: {same}/32 greedy tokens equal")
