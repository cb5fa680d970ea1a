"""`convert` from any format to any format in one step: an export straight from an HF (or GGUF)
source streams it through the canonical plan without writing the canonical copy, and writes what
the two steps (`--to canonical`, then the export) write, byte for byte, lmconvert's recorded source
included. Also `OUT.gguf` without --to, a suffix that contradicts --to, and a bad source."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from bad_input import assert_clean_failure, lmconvert, write_tiny_meta
from family_specs import SPECS
from hf_models import build_model, make_checkpoint, save_checkpoint, save_tiny_tokenizer
from safetensors.torch import load_file

from lmconvert.formats.canonical import META_FILE

GPT2_PRE = ("--gguf-pre", "gpt-2")  # the tiny tokenizer's pre-tokenizer is not one llama.cpp hashes


def files_of(path: Path) -> dict[str, str]:
    """{file name: sha256} of an output (a directory's files, or one file)."""
    if path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def assert_no_temporaries(out: Path) -> None:
    assert not list(out.parent.glob(f".{out.name}.lmconvert-*")), "temporaries left behind"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaMA with a real byte-level BPE tokenizer (and generation_config.json), its embedding
    rows padded past the tokenizer's ids as published models' often are."""
    directory = tmp_path_factory.mktemp("llama") / "hf"
    directory.mkdir()
    vocab = save_tiny_tokenizer(directory)
    return save_checkpoint(build_model("llama", vocab_size=vocab + 4, attention_bias=True), directory)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fused experts (transformers 5 stores each layer's experts as one tensor): every expert a run of
    its bytes, copied raw."""
    return make_checkpoint(tmp_path_factory.mktemp("mixtral") / "hf", "mixtral",
                           **dict(SPECS["mixtral"].kwargs, sliding_window=None))


def one_and_two_steps(src: Path, work: Path, name: str, *args: str) -> tuple[Path, Path]:
    """OUT written by `convert SRC OUT ARGS` and by `convert SRC CANONICAL` then `convert CANONICAL
    OUT ARGS`."""
    one, two, canonical = work / "one" / name, work / "two" / name, work / "canonical"
    one.parent.mkdir()
    two.parent.mkdir()
    done = lmconvert("convert", src, one, *args)
    assert done.returncode == 0, done.stderr
    assert not (work / "one" / META_FILE).exists() and sorted(p.name for p in one.parent.iterdir()) == [name]
    assert_no_temporaries(one)
    assert lmconvert("convert", src, canonical, "--to", "canonical").returncode == 0
    done = lmconvert("convert", canonical, two, *args)
    assert done.returncode == 0, done.stderr
    return one, two


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_hf_to_gguf_in_one_step_is_the_two_steps_file(llama: Path, quant: str, tmp_path: Path) -> None:
    one, two = one_and_two_steps(llama, tmp_path, "m.gguf", "--to", "gguf", "--quant", quant, "--record-source",
                                 *GPT2_PRE)
    assert files_of(one) == files_of(two)

    import gguf

    fields = gguf.GGUFReader(one).fields
    assert bytes(fields["lmconvert.source"].parts[-1]).decode() == str(llama.resolve())  # the HF source, not a copy
    assert "tokenizer.ggml.tokens" in fields


def test_fused_experts_to_gguf_and_hf_in_one_step(mixtral: Path, tmp_path: Path) -> None:
    (tmp_path / "gguf").mkdir()
    (tmp_path / "hf").mkdir()
    one, two = one_and_two_steps(mixtral, tmp_path / "gguf", "m.gguf", "--quant", "f32")
    assert files_of(one) == files_of(two)
    one, two = one_and_two_steps(mixtral, tmp_path / "hf", "out", "--to", "hf")
    assert files_of(one) == files_of(two)
    ours, source = load_file(one / "model.safetensors"), load_file(mixtral / "model.safetensors")
    assert ours.keys() == source.keys() and all(torch.equal(ours[k], source[k]) for k in source)


@pytest.mark.parametrize("shards", ["1", "2"])
def test_hf_to_meta_in_one_step(shards: str, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "llama")  # Meta's layout holds no attention bias
    one, two = one_and_two_steps(src, tmp_path, "meta", "--to", "meta", "--shards", shards)
    assert files_of(one) == files_of(two)
    assert len(list(one.glob("consolidated.*.pth"))) == int(shards)


def test_hf_to_hf_as_another_family_in_one_step(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "llama")
    one, two = one_and_two_steps(src, tmp_path, "out", "--to", "hf", "--family", "mistral")
    assert files_of(one) == files_of(two)
    assert json.loads((one / "config.json").read_text())["model_type"] == "mistral"


@pytest.mark.parametrize("to, name, args", [("hf", "out", ()), ("gguf", "f16.gguf", ("--quant", "f16", *GPT2_PRE))])
def test_gguf_in_one_step(llama: Path, to: str, name: str, args: tuple[str, ...], tmp_path: Path) -> None:
    """A quantized GGUF (its tokenizer rebuilt from the metadata) -> HF, or another GGUF, as the two
    steps write it. (GGUF -> GGUF from a file without a tokenizer: test_gguf_to_gguf_keeps_its_tokens.)"""
    gguf_file = tmp_path / "m.gguf"
    src = llama if to == "hf" else make_checkpoint(tmp_path / "plain", "llama")
    assert lmconvert("convert", src, gguf_file, "--quant", "q8_0", *GPT2_PRE).returncode == 0
    one, two = one_and_two_steps(gguf_file, tmp_path, name, "--to", to, *args)
    assert files_of(one) == files_of(two)
    if to == "hf":
        assert (one / "tokenizer.json").is_file()


@pytest.mark.parametrize("to, name", [("hf", "out"), ("gguf", "m.gguf"), ("meta", "meta")])
def test_meta_source_in_one_step(to: str, name: str, tmp_path: Path) -> None:
    src = write_tiny_meta(tmp_path / "src")
    one, two = one_and_two_steps(src, tmp_path, name, "--to", to)
    assert files_of(one) == files_of(two)


def test_out_gguf_says_to_gguf(llama: Path, tmp_path: Path) -> None:
    bare, told = tmp_path / "bare.gguf", tmp_path / "told" / "bare.gguf"
    told.parent.mkdir()
    done = lmconvert("convert", llama, bare, *GPT2_PRE)
    assert done.returncode == 0, done.stderr
    assert lmconvert("convert", llama, told, "--to", "gguf", *GPT2_PRE).returncode == 0
    assert files_of(bare) == files_of(told)
    assert lmconvert("convert", llama, tmp_path / "UPPER.GGUF", *GPT2_PRE).returncode == 0
    assert (tmp_path / "UPPER.GGUF").is_file()  # a file, not a canonical directory


@pytest.mark.parametrize("to", ["canonical", "hf", "meta"])
def test_a_suffix_that_contradicts_to_is_refused(llama: Path, to: str, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    assert_clean_failure(lmconvert("convert", llama, out, "--to", to), "m.gguf", ".gguf says gguf",
                         f"--to is {to}", out=out)


def test_a_canonical_source_is_not_converted_to_canonical(llama: Path, tmp_path: Path) -> None:
    canonical = tmp_path / "canonical"
    assert lmconvert("convert", llama, canonical).returncode == 0
    out = tmp_path / "again"
    assert_clean_failure(lmconvert("convert", canonical, out, "--to", "canonical"), "already a canonical checkpoint",
                         out=out)


@pytest.mark.parametrize("to, name", [("gguf", "m.gguf"), ("hf", "out"), ("meta", "out")])
def test_a_bad_source_fails_cleanly(to: str, name: str, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "llama")
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # cut short: the header promises more
    out = tmp_path / name
    assert_clean_failure(lmconvert("convert", src, out, "--to", to), "model.safetensors", out=out)


def test_nonfinite_weights_fail_cleanly_in_one_step(tmp_path: Path) -> None:
    """A NaN found while writing (after the side files were staged) leaves nothing either."""
    model = build_model("llama")
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    src = save_checkpoint(model, tmp_path / "src")
    for to, name in (("gguf", "m.gguf"), ("hf", "out"), ("meta", "meta")):
        out = tmp_path / name
        assert_clean_failure(lmconvert("convert", src, out, "--to", to), "NaN", out=out)


def test_one_step_meta_ranks_are_read_against_the_first(tmp_path: Path) -> None:
    """Meta's ranks read every tensor once each: with no lmconvert.json to check them against, the
    ranks after the first are checked against the first's reads, so a source changed meanwhile fails."""
    from lmconvert.convert import convert
    from lmconvert.formats.errors import IntegrityError
    from lmconvert.formats.safetensors_dir import data_offsets

    src = make_checkpoint(tmp_path / "src", "llama")
    _, _, start, _ = data_offsets(src / "model.safetensors")["model.norm.weight"]

    def progress(done: int, total: int) -> None:
        if done == total // 2:  # the first rank written
            with open(src / "model.safetensors", "r+b") as f:
                f.seek(start)
                f.write(bytes(4))
    out = tmp_path / "meta"
    with pytest.raises(IntegrityError, match="final_norm.weight.*changed while it was converted"):
        convert(src, out, "meta", shards=2, progress=progress)
    assert not out.exists()
    assert_no_temporaries(out)


def test_gguf_to_gguf_keeps_its_tokens(llama: Path, tmp_path: Path) -> None:
    """A byte-level GGUF whose vocabulary has no `<|endoftext|>` (Llama 3's has none): transformers'
    GGUF builder adds one past the file's tokens, and past the embedding rows, so GGUF -> GGUF (and
    `generate` on the conversion) was refused. The rebuilt tokenizer holds the file's tokens only,
    and the second file lists the first's tokens and merges, with its ids."""
    from gguf import GGUFReader

    first, again = tmp_path / "m.gguf", tmp_path / "again.gguf"
    assert lmconvert("convert", llama, first, *GPT2_PRE).returncode == 0
    done = lmconvert("convert", first, again, *GPT2_PRE)
    assert done.returncode == 0, done.stderr

    def vocabulary(path: Path) -> dict[str, object]:
        fields = GGUFReader(path).fields
        return {key: fields[key].contents() for key in fields if key.startswith("tokenizer.ggml.")
                and key != "tokenizer.ggml.token_type"}  # llama.cpp's padding [PADn] (unused) reads back as tokens

    assert "<|endoftext|>" not in vocabulary(first)["tokenizer.ggml.tokens"]
    assert vocabulary(again) == vocabulary(first)
