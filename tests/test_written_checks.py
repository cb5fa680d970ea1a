"""What is written is checked, not only what is read (issue #28, class 4): a cast or quantization
that turns a finite weight into Inf, a tokenizer with more ids than the embedding has rows, and a
download whose bytes are not the ones the Hub announced are refused in one line (exit 2), leaving
no output."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from bad_input import assert_clean_failure, lmconvert
from hf_models import build_model, edited_weights, save_checkpoint, save_tiny_tokenizer
from hub_server import HubServer
from safetensors.torch import load_file
from test_pull import assert_one_line_error, files_of, hub_env
from test_pull import lmconvert as pull_cli

from lmconvert.convert import to_canonical
from lmconvert.formats.checkpoint import open_source
from lmconvert.formats.digest import CHUNK, file_chunks
from lmconvert.formats.whole_file import Announced, AnnouncedMismatch, WholeFileHash

VICTIM = "model.layers.0.mlp.down_proj.weight"  # canonical: layers.0.mlp.down.weight


def with_weight(root: Path, value: float) -> Path:
    """A bf16 checkpoint one of whose weights is `value`: finite in bfloat16."""
    save_checkpoint(build_model("llama"), root / "clean", torch.bfloat16)

    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[VICTIM][0, 0] = value

    hf = edited_weights(root / "clean", root / "hf", edit)
    assert torch.isfinite(load_file(hf / "model.safetensors")[VICTIM]).all()
    return hf


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_weight(tmp_path_factory.mktemp("big"), 1e5)


@pytest.fixture(scope="module")
def big_canonical(big: Path) -> Path:
    to_canonical(big, big.parent / "canonical")
    return big.parent / "canonical"


# -- a cast that overflows ------------------------------------------------------------------------

def test_a_cast_to_float16_that_overflows_is_refused(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert_clean_failure(lmconvert("convert", big, out, "--dtype", "float16"), str(big / "model.safetensors"),
                         VICTIM, "float16", "--dtype", "--allow-nonfinite", out=out)
    assert lmconvert("convert", big, out, "--dtype", "float32").returncode == 0
    proc = lmconvert("convert", big, tmp_path / "inf", "--dtype", "float16", "--allow-nonfinite")
    assert proc.returncode == 0, proc.stderr
    assert torch.isinf(load_file(tmp_path / "inf" / "model.safetensors")["layers.0.mlp.down.weight"][0, 0])


@pytest.mark.parametrize("to", ["hf", "meta"])
def test_exports_refuse_a_cast_that_overflows(big_canonical: Path, tmp_path: Path, to: str) -> None:
    out = tmp_path / "out"
    assert_clean_failure(lmconvert("convert", big_canonical, out, "--to", to, "--dtype", "float16"),
                         "layers.0.mlp.down.weight", "float16", "--dtype", "--allow-nonfinite", out=out)
    assert lmconvert("convert", big_canonical, out, "--to", to, "--dtype", "bfloat16").returncode == 0


@pytest.mark.parametrize("value, quant", [(1e5, "f16"), (1e6, "q4_0"), (1e6, "q4_1")])
def test_gguf_refuses_what_its_type_cannot_hold(tmp_path: Path, value: float, quant: str) -> None:
    """F16 holds nothing over 65504; Q4_0 stores each block's largest value over -8 as a float16 scale."""
    hf = with_weight(tmp_path / "src", value)
    to_canonical(hf, tmp_path / "canonical")
    out = tmp_path / "m.gguf"
    assert_clean_failure(lmconvert("convert", tmp_path / "canonical", out, "--to", "gguf", "--quant", quant),
                         "layers.0.mlp.down.weight", quant.upper(), "--quant", "--allow-nonfinite", out=out)
    proc = lmconvert("convert", tmp_path / "canonical", out, "--to", "gguf", "--quant", quant, "--allow-nonfinite")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # on request, and without numpy's warnings
    (down,) = [t for t in gguf.GGUFReader(out).tensors if t.name == "blk.0.ffn_down.weight"]
    with np.errstate(invalid="ignore"):  # an Inf scale times a zero
        assert not np.isfinite(gguf.quants.dequantize(down.data, down.tensor_type)).all()
    for fits in ("bf16", "q8_0"):  # what holds it is written, and lmconvert's reader takes it
        proc = lmconvert("convert", tmp_path / "canonical", out, "--to", "gguf", "--quant", fits, "--force")
        assert proc.returncode == 0, proc.stderr
        source = open_source(out)
        try:
            assert torch.isfinite(source.tensors.get(VICTIM)).all()
        finally:
            source.close()


# -- the tokenizer must fit the embedding ------------------------------------------------------------

def bpe_checkpoint(root: Path, tokens: int, rows: int) -> Path:
    """A byte-level BPE tokenizer of `tokens` ids (added tokens on top of a trained vocabulary), beside
    a model of `rows` embedding rows, converted to canonical."""
    from transformers import AutoTokenizer

    hf = root / "hf"
    trained = save_tiny_tokenizer(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(tokens - trained)])
    tokenizer.save_pretrained(hf)
    assert len(AutoTokenizer.from_pretrained(hf)) == tokens
    save_checkpoint(build_model("llama", vocab_size=rows), hf)
    to_canonical(hf, root / "canonical")
    return root / "canonical"


def spm_checkpoint(root: Path, rows: int) -> Path:
    """A 400-piece SentencePiece tokenizer beside a model of `rows` embedding rows, converted to canonical."""
    import sentencepiece as spm

    root.mkdir()
    lines = ["The capital of France is Paris.", "def f(x):\n    return x + 1\n", "lmconvert keeps logits equal.",
             "The quick brown fox jumps over the lazy dog."]
    (root / "corpus.txt").write_text("\n".join(lines * 3))
    spm.SentencePieceTrainer.train(input=str(root / "corpus.txt"), model_prefix=str(root / "tok"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1,
                                   eos_id=2, pad_id=-1, minloglevel=2)
    hf = save_checkpoint(build_model("llama", vocab_size=rows), root / "hf")
    (hf / "tokenizer.model").write_bytes((root / "tok.model").read_bytes())
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    to_canonical(hf, root / "canonical")
    return root / "canonical"


def token_list(path: Path) -> tuple[list[str], list[int]]:
    fields = gguf.GGUFReader(path).fields
    return fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.token_type"].contents()


def test_a_bpe_tokenizer_longer_than_the_embedding_is_refused_a_shorter_one_padded(tmp_path: Path) -> None:
    """A longer one would lose ids, as llama.cpp's converter refuses to; a shorter one is padded as
    llama.cpp's converter pads it: the rows past the vocabulary get unused `[PAD{i}]` tokens."""
    canonical = bpe_checkpoint(tmp_path / "long", 331, 320)
    out = tmp_path / "m.gguf"
    assert_clean_failure(lmconvert("convert", canonical, out, "--to", "gguf", "--gguf-pre", "gpt-2"),
                         "tokenizer.json", "330", "320 embedding rows", "320-330", out=out)
    canonical = bpe_checkpoint(tmp_path / "short", 320, 331)
    proc = lmconvert("convert", canonical, out, "--to", "gguf", "--gguf-pre", "gpt-2")
    assert proc.returncode == 0, proc.stderr
    tokens, types = token_list(out)
    assert len(tokens) == 331 and tokens[320:] == [f"[PAD{i}]" for i in range(320, 331)]
    assert set(types[320:]) == {int(gguf.TokenType.UNUSED)} and int(gguf.TokenType.UNUSED) not in types[:320]


def test_a_sentencepiece_tokenizer_longer_than_the_embedding_is_refused(tmp_path: Path) -> None:
    canonical = spm_checkpoint(tmp_path / "spm", 390)
    out = tmp_path / "m.gguf"
    assert_clean_failure(lmconvert("convert", canonical, out, "--to", "gguf", "--quant", "f32"),
                         "tokenizer.model", "399", "390 embedding rows", out=out)


# -- a download must be the file the Hub announced -------------------------------------------------

def altered(data: bytes) -> bytes:
    """The same size, one low mantissa bit of the last float32 flipped: finite and valid, but not the file."""
    out = bytearray(data)
    out[-4] ^= 0x01
    return bytes(out)


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("repos")
    vocab = save_tiny_tokenizer(root / "tokenizer")
    tokenizer = files_of(root / "tokenizer")
    single = files_of(save_checkpoint(build_model("llama", vocab_size=vocab), root / "single"))
    sharded = files_of(save_checkpoint(build_model("llama", seed=1, vocab_size=vocab), root / "sharded",
                                       max_shard_size="100KB"))
    return {"single": {**single, **tokenizer}, "sharded": {**sharded, **tokenizer}}


def last_shard(files: dict[str, bytes]) -> str:
    return sorted(f for f in files if f.startswith("model-"))[-1]


@pytest.fixture(scope="module")
def hub(repos: dict[str, dict[str, bytes]]) -> Iterator[HubServer]:
    single, sharded = repos["single"], repos["sharded"]
    shard = last_shard(sharded)
    server = HubServer()
    server.add_repo("org/good", [single])
    server.add_repo("org/altered", [single], tampered={"model.safetensors": altered(single["model.safetensors"])})
    server.add_repo("org/altered-shard", [sharded], tampered={shard: altered(sharded[shard])})
    with server:
        yield server


def blobs(home: Path, repo: str) -> set[str]:
    return {p.name for p in (home / "hub" / f"models--{repo.replace('/', '--')}" / "blobs").iterdir()}


@pytest.mark.slow
@pytest.mark.parametrize("repo, kind", [("org/altered", "single"), ("org/altered-shard", "sharded")])
def test_pull_refuses_a_download_that_is_not_what_the_hub_announced(hub: HubServer, repos: dict[str, dict[str, bytes]],
                                                                     tmp_path: Path, repo: str, kind: str) -> None:
    """huggingface_hub checks the size, which matches; the sha256 the listing and the HEAD announce does not."""
    files = repos[kind]
    name = "model.safetensors" if kind == "single" else last_shard(files)
    announced = hashlib.sha256(files[name]).hexdigest()
    out, home = tmp_path / "out", tmp_path / "hf"
    proc = pull_cli("pull", repo, "--out", out, env=hub_env(hub.url, home))
    line = assert_one_line_error(proc, f"{repo}@{hub.repos[repo].refs['main']}: {name}", announced,
                                 hashlib.sha256(altered(files[name])).hexdigest(), "pull again")
    assert "removed from the HF cache" in line
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    assert announced not in blobs(home, repo)  # not served from the cache as that sha256 again
    proc = pull_cli("pull", "org/good", "--out", out, env=hub_env(hub.url, home))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_pull_refuses_a_cached_file_changed_since_its_download(hub: HubServer, repos: dict[str, dict[str, bytes]],
                                                               tmp_path: Path) -> None:
    """From the cache, offline: the listing kept there has no sha256, the blob's name is the one announced."""
    home, env = tmp_path / "hf", hub_env(hub.url, tmp_path / "hf")
    assert pull_cli("pull", "org/good", "--out", tmp_path / "first", env=env).returncode == 0
    announced = hashlib.sha256(repos["single"]["model.safetensors"]).hexdigest()
    blob = home / "hub" / "models--org--good" / "blobs" / announced
    blob.chmod(0o644)
    blob.write_bytes(altered(blob.read_bytes()))
    out = tmp_path / "out"
    proc = pull_cli("pull", "org/good", "--out", out, env={**env, "HF_HUB_OFFLINE": "1"})
    assert_one_line_error(proc, "org/good@", "model.safetensors", announced, "removed from the HF cache")
    assert not out.exists() and not blob.exists()
    proc = pull_cli("pull", "org/good", "--out", out, env=env)  # downloaded again, whole
    assert proc.returncode == 0, proc.stderr
    assert blob.read_bytes() == repos["single"]["model.safetensors"]


def test_a_file_s_sha256_is_fed_in_order_by_readers_in_any_order(tmp_path: Path) -> None:
    """Readers of a file's ranges, finishing in any order, feed its sha256 in order, re-reading what
    came too early; the header (what nobody reads) is read on its own, and a wrong file is refused."""
    data = os.urandom(9 * CHUNK + 12345)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    cuts = [100, CHUNK + 7, 3 * CHUNK, 3 * CHUNK + 1, 6 * CHUNK + 99, len(data) - 5]  # the end is nobody's
    ranges = list(itertools.pairwise(cuts))
    for order in (ranges, ranges[::-1], ranges[1::2] + ranges[::2]):
        whole = WholeFileHash(Announced(path, hashlib.sha256(data).hexdigest(), "f.bin"), ranges)
        for start, end in order:
            assert b"".join(bytes(c) for c in whole.fed(file_chunks(path, start, end), start)) == data[start:end]
            whole.catch_up()
        whole.finish()
    started = threading.Barrier(len(ranges))

    def read(start: int, end: int) -> None:
        started.wait()
        for _ in whole.fed(file_chunks(path, start, end), start):
            pass
        whole.catch_up()

    whole = WholeFileHash(Announced(path, hashlib.sha256(data).hexdigest(), "f.bin"), ranges)
    threads = [threading.Thread(target=read, args=r) for r in ranges]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole.finish()
    wrong = WholeFileHash(Announced(path, hashlib.sha256(altered(data)).hexdigest(), "f.bin"), ranges)
    with pytest.raises(AnnouncedMismatch, match="f.bin: its sha256 is"):
        wrong.finish()
