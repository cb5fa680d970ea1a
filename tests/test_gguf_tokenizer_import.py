"""A GGUF's tokenizer comes back as the HF tokenizer it was written from: the ids of `convert X.gguf
OUT`'s tokenizer, and of `generate X.gguf`'s, are the source tokenizer's on text with spaces,
newlines, tabs, unicode and digits, for each layout `--to gguf` writes (and llama.cpp's converter
writes for the same source): Gemma 3 as BPE over SentencePiece pieces (`gpt2`, pre-tokenizer
`gemma4`, its merges), Gemma 3 and LLaMA as SentencePiece (`llama`). A tokenizer that cannot be
rebuilt leaves the weights converted, with one warning line; never exit 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from hf_models import build_model, save_checkpoint
from test_export_gguf import spm_checkpoint
from test_formats_gguf import write_gguf
from transformers import AutoTokenizer

from lmconvert.cli import main
from lmconvert.convert import convert, to_canonical

TEXTS = ("The capital of France is Paris.", "def f(x):\n    return x + 1\n", "Hello\n\nworld  12345 北京",
         " leading space", "  two leading", "trailing  ", "a\tb\t\tc   d", "🚀 emoji\n\n\nend",
         "Ünïcödé — naïve café 3.14 and 1,000,000", "<start_of_turn>user\nhi<end_of_turn>\n")
SPACE = "\u2581"


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def gemma_sentencepiece(root: Path) -> Path:
    """A SentencePiece model shaped as Gemma's: pad, eos, bos, unk, mask first; turn markers,
    newline, space and tab runs as user-defined pieces; byte fallback; no dummy prefix, no
    whitespace cleanup, split digits."""
    import sentencepiece as spm

    root.mkdir(parents=True)
    corpus = ["The capital of France is Paris.", "def f(x):\n    return x + 1\n", "lmconvert keeps logits equal.",
              "北京 🚀 12345   spaces", "The quick brown fox jumps over the lazy dog.\n\nNew paragraph\there."]
    (root / "corpus.txt").write_text("\n".join(corpus * 5))
    user = ["<start_of_turn>", "<end_of_turn>", "\n", "\n\n", "\n\n\n", SPACE * 2, SPACE * 3, SPACE * 4, "\t", "\t\t"]
    spm.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"), model_prefix=str(root / "tok"), vocab_size=500, model_type="bpe",
        byte_fallback=True, split_digits=True, character_coverage=1.0, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        control_symbols=["<mask>", "[multimodal]"], user_defined_symbols=user, normalization_rule_name="identity",
        add_dummy_prefix=False, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_by_whitespace=False, minloglevel=2)
    return root / "tok.model"


def gemma3_checkpoint(root: Path, saved_by_transformers: bool) -> Path:
    """A tiny Gemma 3 beside that tokenizer: as the Hub ships it (tokenizer.model), or as
    transformers 5 saves it (tokenizer.json only), the layout from which llama.cpp's converter
    writes `gpt2` with the `gemma4` pre-tokenizer."""
    model = gemma_sentencepiece(root / "spm")
    hf = save_checkpoint(build_model("gemma3_text", vocab_size=500, head_dim=16), root / "hf")
    (hf / "tokenizer.model").write_bytes(model.read_bytes())
    # the added tokens as the Hub's Gemma 3 tokenizer_config.json lists them: special and control,
    # or user-defined (the whitespace runs), which llama.cpp's converter types from this list
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    added = {str(i): {"content": sp.IdToPiece(i), "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": sp.IsControl(i) or sp.IsUnknown(i) or i in (6, 7)}
             for i in range(16)}
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
        "pad_token": "<pad>", "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": added}))
    if saved_by_transformers:
        tokenizer = AutoTokenizer.from_pretrained(str(hf))
        (hf / "tokenizer.model").unlink()
        (hf / "tokenizer_config.json").unlink()
        tokenizer.save_pretrained(str(hf))
        assert not (hf / "tokenizer.model").exists()
    return hf


def exported(hf: Path, out: Path, **kwargs: object) -> Path:
    to_canonical(hf, hf.parent / "canonical")
    convert(hf.parent / "canonical", out, "gguf", quant="f32", **kwargs)
    return out


def with_key(src: Path, dst: Path, key: str, value: bool) -> Path:
    """The file with one more boolean key, everything else as it was."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[1]) if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub)
    writer.add_bool(key, value)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=list(reversed(tensor.shape.tolist())),
                          raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def assert_same_ids(source: Path, path: Path, out: Path) -> None:
    """`convert` writes a tokenizer with the source's ids, and `generate` on the file tokenizes alike."""
    code, _, err = cli("convert", path, out)
    assert code == 0, err
    assert "warning" not in err, err
    theirs, ours = AutoTokenizer.from_pretrained(str(source)), AutoTokenizer.from_pretrained(str(out))
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids, text
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True), text
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["bos_token_id"] == theirs.bos_token_id and generation["eos_token_id"] == theirs.eos_token_id
    code, stdout, err = cli("generate", path, "--prompt", "The capital", "--max-new-tokens", "3")
    assert code == 0 and stdout.startswith("The capital"), err


def test_gemma3_as_bpe_over_sentencepiece_pieces(tmp_path: Path) -> None:
    """llama.cpp's current Gemma 3 layout: transformers' GGUF builder reads `gpt2` as byte-level BPE
    and stops on the merges of "\\n" (exit 3 before); lmconvert rebuilds it from the file."""
    hf = gemma3_checkpoint(tmp_path, saved_by_transformers=True)
    # the tiny vocabulary's hash is not on llama.cpp's list: name the pre-tokenizer llama.cpp names Gemma's
    path = exported(hf, tmp_path / "m.gguf", gguf_pre="gemma4")
    fields = gguf.GGUFReader(path).fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2" and fields["tokenizer.ggml.pre"].contents() == "gemma4"
    assert any("\n" in merge for merge in fields["tokenizer.ggml.merges"].contents())
    assert_same_ids(hf, path, tmp_path / "out")


def test_gemma3_as_sentencepiece(tmp_path: Path) -> None:
    """The Hub's layout: `llama` from tokenizer.model, with `add_space_prefix` false as llama.cpp's
    converter writes it for Gemma 3. Its whitespace runs are user-defined tokens, matched whole
    (transformers' GGUF builder spelled them as pieces: other ids)."""
    hf = gemma3_checkpoint(tmp_path, saved_by_transformers=False)
    path = exported(hf, tmp_path / "m.gguf")
    fields = gguf.GGUFReader(path).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    if "tokenizer.ggml.add_space_prefix" not in fields:
        path = with_key(path, tmp_path / "as-llama-cpp.gguf", "tokenizer.ggml.add_space_prefix", False)
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.add_space_prefix"].contents() is False
    assert_same_ids(hf, path, tmp_path / "out")


def test_llama_as_sentencepiece(tmp_path: Path) -> None:
    """LLaMA's layout: a space in front of the text (no `add_space_prefix` key: llama.cpp's default)."""
    hf = spm_checkpoint(tmp_path / "spm")
    path = exported(hf, tmp_path / "m.gguf")
    assert "tokenizer.ggml.add_space_prefix" not in gguf.GGUFReader(path).fields
    assert_same_ids(hf, path, tmp_path / "out")


TOKENS = ["<pad>", "<s>", "</s>", "\n", "a", "b", "ab", *[f"<|x{i}|>" for i in range(121)]]
UNBUILDABLE = {  # byte-level BPE whose merges name a token its vocabulary lacks (a raw newline);
    # SentencePiece without the scores its merges are ranked by
    "bpe-merges": {"model": "gpt2", "pre": "gpt-2", "merges": ["a b", "\n \n"]},
    "spm-scores": {"model": "llama"},
}


@pytest.mark.parametrize("command", ["convert", "generate"])
@pytest.mark.parametrize("case", list(UNBUILDABLE))
def test_a_tokenizer_that_cannot_be_built_is_not_an_internal_error(case: str, command: str, tmp_path: Path) -> None:
    """`convert` writes the weights without a tokenizer and says so in one line; `generate`, which
    needs it, stops in one line (exit 2)."""
    tok = {"tokens": TOKENS, "types": [3, 3, 3] + [1] * (len(TOKENS) - 3), "bos": 1, "eos": 2, "pad": 0,
           **UNBUILDABLE[case]}
    tokens = TOKENS
    path = write_gguf(build_model("llama", 0, vocab_size=len(tokens)), tmp_path / "m.gguf", tokenizer=tok)
    if command == "generate":
        code, _, err = cli("generate", path, "--prompt", "ab", "--max-new-tokens", "2")
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err, err
        return
    code, _, err = cli("convert", path, tmp_path / "out")
    assert code == 0, err
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1 and str(path) in warning[0] and "tokenizer" in warning[0], err
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    meta = json.loads((tmp_path / "out" / "lmconvert.json").read_text())
    assert meta["source"]["tokenizer"].startswith("not converted"), meta["source"]
    assert (tmp_path / "out" / "model.safetensors").is_file()
