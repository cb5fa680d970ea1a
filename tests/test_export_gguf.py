"""GGUF out (`convert --to gguf`): tiny perturbed transformers models, converted to canonical, then
written as GGUF by lmconvert, and proven by readers that are not the writer:
- our GGUF reader gives back the source's tensors bit for bit at the file's float type, and
  exactly `gguf.quants.dequantize(quantize(x))` for quantized types;
- the tensors equal what the test's own llama.cpp-converter emulation writes (test_formats_gguf);
- transformers' GGUF loader reads the file, and its logits equal our decoder's on the same file.
Also the refusals, --force and atomic output. llama.cpp itself reads the files in
test_llamacpp.py (`make llamacpp-check`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from bad_input import left_by_a_killed_run
from family_specs import SPECS
from hf_models import build_model, save_checkpoint, save_tiny_tokenizer, token_batch
from specs import SELECTION_BIAS_BUFFERS
from test_formats_gguf import (
    FALCON_LAYOUTS,
    FAMILIES,
    METADATA_DIFFERS,
    TRANSFORMERS_LOADS,
    TRANSFORMERS_OVERRIDES,
    cli,
    imported_tensors,
    logits_of,
    transformers_gguf,
    write_falcon_gguf,
    write_gguf,
)
from transformers import AutoModelForCausalLM

import lmconvert
from lmconvert.convert import convert, to_canonical
from lmconvert.formats.checkpoint import open_source
from lmconvert.formats.errors import InputError
from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.gguf.export import EXPORTS, metadata, read_back
from lmconvert.mappings.tables.transforms import NEG_EXP

FP32_MAX_ABS = 1e-5
FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
QUANTS = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1"}
# the family tests' tiny models that llama.cpp's architectures hold whole (Qwen's sliding windows it has not)
EXPORTABLE = ("llama", "mistral", "olmo2", "gemma2", "gemma3")
WITHOUT = {"olmo2": dict(attention_bias=False), "gemma2": dict(attention_bias=False)}  # llama.cpp loads no o bias


def canonical_of(model: torch.nn.Module, root: Path) -> Path:
    save_checkpoint(model, root / "hf")
    to_canonical(root / "hf", root / "canonical")
    return root / "canonical"


def exported(canonical: Path, out: Path, quant: str) -> Path:
    convert(canonical, out, "gguf", quant=quant)
    return out


@pytest.mark.parametrize("quant", list(FLOATS))
@pytest.mark.parametrize("name", EXPORTABLE)
def test_float_files_read_back_bit_for_bit(name: str, quant: str, tmp_path: Path) -> None:
    spec = SPECS[name]
    canonical = canonical_of(build_model(spec.model_type, **{**spec.kwargs, **WITHOUT.get(name, {})}), tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", quant)
    ours, source = imported_tensors(out), imported_tensors(tmp_path / "hf")
    assert set(ours) == set(source)
    for hf_name, tensor in source.items():
        if spec.model_type.startswith("gemma") and hf_name.endswith("norm.weight"):
            # llama.cpp stores Gemma's norms as w + 1 (in f32): (w + 1) - 1 is all that comes back
            tensor = (tensor.float() + 1) - 1
        assert ours[hf_name].dtype == FLOATS[quant], hf_name
        assert torch.equal(ours[hf_name], tensor.to(FLOATS[quant])), hf_name
    if quant == "f32":  # and the model computes what the source computes
        ids = token_batch(seq=28)
        assert torch.equal(logits_of(lmconvert.load(out), ids), logits_of(lmconvert.load(canonical), ids))


@pytest.mark.parametrize("quant", list(QUANTS))
def test_quantized_files_read_back_as_gguf_dequantizes_them(quant: str, tmp_path: Path) -> None:
    """2-D tensors come back as dequantize(quantize(x)) of the tensor llama.cpp stores (q/k rows
    permuted), undone by the table; 1-D tensors stay f32, exactly."""
    model = build_model("llama", **FAMILIES["llama"])
    canonical = canonical_of(model, tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", quant)
    expected = imported_tensors(write_gguf(model, tmp_path / "emulated.gguf", quant=QUANTS[quant]))
    ours = imported_tensors(out)
    assert set(ours) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(ours[name], tensor), name
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.weight"] == QUANTS[quant]


def test_quantized_values_are_gguf_quants_round_trip(tmp_path: Path) -> None:
    model = build_model("qwen2", **FAMILIES["qwen2"])
    out = exported(canonical_of(model, tmp_path), tmp_path / "m.gguf", "q8_0")
    weight = model.model.layers[1].mlp.down_proj.weight.detach().float().numpy()
    q = gguf.GGMLQuantizationType.Q8_0
    expected = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(weight, q), q))
    assert torch.equal(imported_tensors(out)["model.layers.1.mlp.down_proj.weight"], expected)


@pytest.mark.parametrize("model_type", [t for t in FAMILIES if t in EXPORTS])
def test_same_tensors_and_config_as_the_llama_cpp_converter_emulation(model_type: str, tmp_path: Path) -> None:
    model = build_model(model_type, **FAMILIES[model_type])
    ours = exported(canonical_of(model, tmp_path), tmp_path / "ours.gguf", "f32")
    name = "Mistral-tiny" if model_type == "mistral" else "tiny"
    theirs = write_gguf(model, tmp_path / "theirs.gguf", name=name)
    ours_file, theirs_file = gguf.GGUFReader(ours), gguf.GGUFReader(theirs)
    ours_t = {t.name: np.array(t.data) for t in ours_file.tensors}
    theirs_t = {t.name: np.array(t.data) for t in theirs_file.tensors}
    if "tie_word_embeddings" in METADATA_DIFFERS.get(model_type, {}):  # GPT-2: llama.cpp's converter copies
        # the tied embedding into `output`; llama.cpp's loader takes token_embd when there is none
        assert np.array_equal(theirs_t.pop("output.weight"), theirs_t["token_embd.weight"])
    assert set(ours_t) == set(theirs_t)
    for tensor_name, data in theirs_t.items():
        assert np.array_equal(ours_t[tensor_name], data), tensor_name
    assert_same_config(ours, theirs, set(METADATA_DIFFERS.get(model_type, {})) | INVENTED_IDS.get(model_type, set()))


# token ids the emulation invents: its GPT-2, BLOOM and Falcon files carry a made-up token list (0 and 1
# as BOS and EOS)
INVENTED_IDS = dict.fromkeys(("gpt2", "bloom", "falcon"), {"bos_token_id", "eos_token_id"})


def assert_same_config(ours: Path, theirs: Path, differ: set[str] = frozenset()) -> None:
    """The configs our reader makes of both files: equal but for what the emulation states
    otherwise (`differ`), the token ids (the tokenizer's business) where both state them."""
    ids = {"bos_token_id", "eos_token_id", "pad_token_id"} - differ
    ours_config, theirs_config = open_source(ours).config, open_source(theirs).config
    assert {k: v for k, v in ours_config.items() if k not in ids | differ} == {
        k: v for k, v in theirs_config.items() if k not in ids | differ}
    assert all(ours_config[k] == theirs_config[k] for k in ids if k in ours_config and k in theirs_config)


# transformers' GGUF loader reads no score scale for Gemma and takes its default, 256 (lmconvert
# states it, `attention.scale`, where llama.cpp's rule would differ), nor Gemma 3's layer pattern
# (its default: every sixth layer global, llama.cpp's too): these Gemmas have those defaults
READ_BY_TRANSFORMERS = {"gemma2": dict(query_pre_attn_scalar=256),
                        "gemma3_text": dict(query_pre_attn_scalar=256, sliding_window_pattern=6, num_hidden_layers=7)}


# transformers' GGUF loader reads GPT-2's vocabulary size from the token list only: with a tokenizer below
@pytest.mark.parametrize("model_type", [t for t in TRANSFORMERS_LOADS if t in EXPORTS and t != "gpt2"])
def test_transformers_reads_the_file(model_type: str, tmp_path: Path) -> None:
    overrides: dict[str, Any] = {**FAMILIES[model_type], **TRANSFORMERS_OVERRIDES.get(model_type, {}),
                                 **READ_BY_TRANSFORMERS.get(model_type, {})}
    model = build_model(model_type, **overrides)
    out = exported(canonical_of(model, tmp_path), tmp_path / "m.gguf", "f32")
    ids = token_batch(seq=24)
    theirs = logits_of(transformers_gguf(out), ids)
    assert (theirs - logits_of(lmconvert.load(out), ids)).abs().max() <= FP32_MAX_ABS
    assert (theirs - logits_of(model, ids)).abs().max() <= FP32_MAX_ABS


def test_transformers_reads_minimax_m2(tmp_path: Path) -> None:
    """transformers' GGUF loader reads llama.cpp's minimax-m2 (and so `verify OUT.gguf` takes it as the
    reference): the file computes what the source computes, in transformers and in lmconvert."""
    model = build_model("minimax_m2", **SPECS["minimax_m2"].kwargs)
    out = exported(canonical_of(model, tmp_path), tmp_path / "m.gguf", "f32")
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=out.name, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    ids = token_batch(seq=24)
    assert (logits_of(theirs, ids) - logits_of(lmconvert.load(out), ids)).abs().max() <= FP32_MAX_ABS
    assert (logits_of(theirs, ids) - logits_of(model, ids)).abs().max() <= FP32_MAX_ABS


def test_transformers_reads_gpt2_with_its_tokenizer(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    vocab = save_tiny_tokenizer(hf)
    model = build_model("gpt2", **{**FAMILIES["gpt2"], "vocab_size": vocab})
    save_checkpoint(model, hf)
    to_canonical(hf, tmp_path / "canonical")
    out = tmp_path / "m.gguf"
    convert(tmp_path / "canonical", out, "gguf", quant="f32", gguf_pre="gpt-2")
    ids = token_batch(seq=24)
    theirs = logits_of(transformers_gguf(out), ids)
    assert (theirs - logits_of(lmconvert.load(out), ids)).abs().max() <= FP32_MAX_ABS
    assert (theirs - logits_of(model, ids)).abs().max() <= FP32_MAX_ABS


def test_verify_runs_on_the_result(tmp_path: Path) -> None:
    model = build_model("gemma2", **{**FAMILIES["gemma2"], **READ_BY_TRANSFORMERS["gemma2"]})
    out = exported(canonical_of(model, tmp_path), tmp_path / "m.gguf", "f32")
    code, stdout, err = cli("verify", out, "--seq-len", 20, "--generate", 4)
    assert code == 0, err
    assert "PASS" in stdout
    assert open_source(out).config["query_pre_attn_scalar"] == 256  # read back from `attention.scale`


# what transformers' GGUF loader does not read, as verify names it
UNREAD = {"granite": "granite", "mixtral": "mixtral", "deepseek_v3:moe": "deepseek_v3", "deepseek_v2": "deepseek_v2",
          "falcon:40b": "falcon in this file's layout"}


@pytest.mark.parametrize("name", list(UNREAD))
def test_verify_takes_the_recorded_source_where_transformers_cannot_read_the_file(name: str, tmp_path: Path) -> None:
    """transformers' GGUF loader reads no granite (nor Mixtral, a `llama` file with experts, nor
    DeepSeek-V3), and builds every Falcon as Falcon-7B's layout: the reference is the checkpoint the
    export recorded (`lmconvert.source`, a local path only with --record-source), else --reference."""
    canonical = canonical_of(built(name, MODELS[name]), tmp_path)
    unrecorded = exported(canonical, tmp_path / "unrecorded.gguf", "f32")  # users share these: no local path
    assert "lmconvert.source" not in gguf.GGUFReader(unrecorded).fields
    code, _, err = cli("verify", unrecorded, "--seq-len", 20)
    assert code == 2 and "records no source; pass --reference SRC" in err, err
    out = tmp_path / "m.gguf"
    convert(canonical, out, "gguf", quant="f32", record_source=True)  # --record-source
    assert gguf.GGUFReader(out).fields["lmconvert.source"].contents() == str((tmp_path / "hf").resolve())
    code, stdout, err = cli("verify", out, "--seq-len", 20, "--generate", 4)
    assert code == 0 and "PASS" in stdout, err
    (tmp_path / "hf").rename(tmp_path / "moved")
    code, _, err = cli("verify", out, "--seq-len", 20)
    assert code == 2 and f"transformers' GGUF loader does not read {UNREAD[name]}" in err and "--reference" in err, err
    code, stdout, err = cli("verify", out, "--reference", tmp_path / "moved", "--seq-len", 20)
    assert code == 0 and "PASS" in stdout, err


def test_a_llama_in_a_folder_named_mistral_stays_a_llama(tmp_path: Path) -> None:
    """#28: `general.name` was the bare folder name; llama.cpp's files tell Mistral from LLaMA only by
    that name, so a LLaMA converted from `./mistral` came back as a Mistral (ours) and transformers'
    GGUF loader failed on it (exit 3). The word is left out of a LLaMA's name."""
    src = save_checkpoint(build_model("llama", **TRANSFORMERS_OVERRIDES["llama"]), tmp_path / "mistral")
    to_canonical(src, tmp_path / "canonical")
    out = exported(tmp_path / "canonical", tmp_path / "m.gguf", "f32")
    name = gguf.GGUFReader(out).fields["general.name"].contents()
    assert "mistral" not in name.lower(), name
    assert open_source(out).config["model_type"] == "llama"
    code, stdout, err = cli("verify", out, "--seq-len", 20, "--generate", 2)
    assert code == 0 and "PASS" in stdout, err


QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "tq1_0", "tq2_0", "mxfp4")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "quant"), [("granite", q) for q in QUANTIZED]
                         + [(n, "q8_0") for n in UNREAD if n != "granite"])
def test_verify_of_a_quantized_file_transformers_cannot_read_holds_its_own_weights(name: str, quant: str,
                                                                                   tmp_path: Path) -> None:
    """#28: against the float source a quantized file of an architecture transformers' GGUF loader
    does not read failed fp32's bar by the quantization error, blaming layers.0.attn.q. Its
    reference is now transformers' model of the family holding the file's own weights, dequantized."""
    wide = dict(hidden_size=256, intermediate_size=256) if quant.startswith("tq") else {}  # ternary: rows of 256
    canonical = canonical_of(built(name, {**MODELS[name], **wide}), tmp_path)
    out = tmp_path / "m.gguf"
    convert(canonical, out, "gguf", quant=quant, record_source=True)
    assert {t.tensor_type.name for t in gguf.GGUFReader(out).tensors} - {"F32", "F16", "BF16"}, "not quantized"
    code, stdout, err = cli("verify", out, "--seq-len", 20, "--generate", 4)
    assert code == 0 and "PASS" in stdout, (stdout, err)
    code, stdout, _ = cli("verify", out, "--reference", tmp_path / "hf", "--seq-len", 20, "--generate", 0)
    assert code == 1 and "FAIL" in stdout, stdout  # the float source: off by the quantization error


def test_llama3_rope_travels_as_rope_freqs(tmp_path: Path) -> None:
    spec = SPECS["llama"]  # llama3 scaling over 32 original positions: not llama.cpp's usual 8192
    canonical = canonical_of(build_model(spec.model_type, **spec.kwargs), tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", "f32")
    assert "rope_freqs.weight" in {t.name for t in gguf.GGUFReader(out).tensors}
    assert open_source(out).config["rope_scaling"]["original_max_position_embeddings"] == 32


# -- the CLI, refusals, --force and atomic output ---------------------------------------------


@pytest.fixture
def llama_canonical(tmp_path: Path) -> Path:
    return canonical_of(build_model("llama", **FAMILIES["llama"]), tmp_path)


def test_cli_writes_q8_0_by_default(llama_canonical: Path, tmp_path: Path) -> None:
    code, out, err = cli("convert", llama_canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 0, err
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert {t.tensor_type.name for t in reader.tensors} == {"F32", "Q8_0"}
    assert reader.fields["general.file_type"].contents() == 7  # llama.cpp's MOSTLY_Q8_0


@pytest.mark.parametrize(("args", "fragment"), [
    (["--quant", "q3_k_l"], "--quant 'q3_k_l'"),  # a mix llama-quantize has and lmconvert does not offer
    (["--dtype", "float16"], "--dtype does not apply with --to gguf"),
    (["--max-shard-size", "lots"], "--max-shard-size 'lots'"),
])
def test_cli_argument_errors(llama_canonical: Path, tmp_path: Path, args: list[str], fragment: str) -> None:
    code, _, err = cli("convert", llama_canonical, tmp_path / "m.gguf", "--to", "gguf", *args)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


def test_quant_needs_gguf(llama_canonical: Path, tmp_path: Path) -> None:
    code, _, err = cli("convert", llama_canonical, tmp_path / "hf-out", "--to", "hf", "--quant", "q8_0")
    assert code == 2 and "--quant only applies with --to gguf" in err


def test_family_without_llama_cpp_architecture_is_refused(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("opt"), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "opt has no llama.cpp architecture" in err, err
    assert [p.name for p in tmp_path.iterdir()] == [p.name for p in tmp_path.iterdir() if p.name != "m.gguf"]


def test_a_llama_cpp_architecture_not_written_is_named(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("gptj", **SPECS["gptj"].kwargs), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp names a gptj architecture but has no graph that runs it" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.gguf").exists()
    with pytest.raises(MappingError, match="llama.cpp names a gptj architecture"):
        metadata({"model_type": "gptj"}, "tiny")


def test_gemma3n_is_refused_naming_what_llama_cpp_s_graph_computes_otherwise(tmp_path: Path) -> None:
    """llama.cpp's gemma3n takes the sparse gates' std over n - 1 and sparsifies its first 10 layers whatever the
    model says (test_llamacpp.py measures it on its own converter's file): no Gemma 3n is written, the wrapper's
    model_type neither."""
    canonical = canonical_of(build_model("gemma3n_text", **SPECS["gemma3n_text"].kwargs), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "gemma3n_text: llama.cpp's gemma3n graph computes another model" in err, err
    assert "std over n - 1" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "m.gguf").exists()
    with pytest.raises(MappingError, match="gemma3n: llama.cpp's gemma3n graph computes another model"):
        metadata({"model_type": "gemma3n"}, "tiny")


def test_what_llama_cpp_cannot_hold_is_named(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0),
                             tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's qwen2 metadata cannot express" in err and "sliding_window" in err, err
    assert not (tmp_path / "m.gguf").exists()


def test_force_replaces_only_a_file_lmconvert_wrote(llama_canonical: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    assert cli("convert", llama_canonical, out, "--to", "gguf", "--quant", "f32")[0] == 0
    code, _, err = cli("convert", llama_canonical, out, "--to", "gguf")
    assert code == 2 and "already exists" in err
    assert cli("convert", llama_canonical, out, "--to", "gguf", "--force")[0] == 0
    assert gguf.GGUFReader(out).fields["general.file_type"].contents() == 7
    theirs = write_gguf(build_model("llama", **FAMILIES["llama"]), tmp_path / "theirs.gguf")
    before = theirs.read_bytes()
    code, _, err = cli("convert", llama_canonical, theirs, "--to", "gguf", "--force")
    assert code == 2 and "is not a file lmconvert wrote" in err
    assert theirs.read_bytes() == before


def test_a_failed_export_leaves_nothing(llama_canonical: Path, tmp_path: Path) -> None:
    shard = next(llama_canonical.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-4:] = np.float32(np.nan).tobytes()  # the last tensor's last value
    shard.write_bytes(bytes(data))
    code, _, err = cli("convert", llama_canonical, tmp_path / "m.gguf", "--to", "gguf", "--quant", "f32")
    assert code in (1, 2) and len(err.strip().splitlines()) == 1, err
    assert not any(p.name.startswith((".m.gguf", "m.gguf")) for p in tmp_path.iterdir())


def test_a_killed_run_s_half_written_file_is_cleaned_up(llama_canonical: Path, tmp_path: Path) -> None:
    stale = left_by_a_killed_run(tmp_path / "m.gguf", "writing", "file")
    other = tmp_path / ".m.gguf.notes"  # not a name lmconvert makes: left alone
    other.write_text("mine")
    assert cli("convert", llama_canonical, tmp_path / "m.gguf", "--to", "gguf")[0] == 0
    assert not stale.exists() and other.read_text() == "mine"


# -- the tokenizer travels -------------------------------------------------------------------

TOKENIZED = ("The capital of France is Paris.", "def f(x):\n    return x + 1\n", "lmconvert keeps logits equal.",
             "北京 🚀 12345   spaces")


def spm_checkpoint(root: Path) -> Path:
    """A LLaMA-style SentencePiece tokenizer (byte fallback, split digits) beside a tiny llama."""
    import sentencepiece as spm

    root.mkdir()
    (root / "corpus.txt").write_text("\n".join(TOKENIZED * 3 + ("The quick brown fox jumps over the lazy dog.",)))
    spm.SentencePieceTrainer.train(input=str(root / "corpus.txt"), model_prefix=str(root / "tok"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, split_digits=True,
                                   character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    hf = save_checkpoint(build_model("llama", vocab_size=400), root / "hf")
    (hf / "tokenizer.model").write_bytes((root / "tok.model").read_bytes())
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False}))
    return hf


def gguf_tokenizer_ids(path: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)(text)["input_ids"]


def test_sentencepiece_tokenizer_travels(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    hf = spm_checkpoint(tmp_path / "spm")
    to_canonical(hf, tmp_path / "canonical")
    out = exported(tmp_path / "canonical", tmp_path / "m.gguf", "f32")
    fields = gguf.GGUFReader(out).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama" and fields["tokenizer.ggml.pre"].contents() == "default"
    assert fields["tokenizer.ggml.add_bos_token"].contents() is True
    source = AutoTokenizer.from_pretrained(str(hf))
    for text in TOKENIZED:
        assert gguf_tokenizer_ids(out, text) == source(text)["input_ids"], text


def test_bpe_tokenizer_with_an_unknown_pre_tokenizer_needs_naming(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    hf = tmp_path / "hf"
    vocab = save_tiny_tokenizer(hf)
    save_checkpoint(build_model("qwen2", vocab_size=vocab, tie_word_embeddings=True), hf)
    to_canonical(hf, tmp_path / "canonical")
    code, _, err = cli("convert", tmp_path / "canonical", tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "not one llama.cpp knows" in err and "--gguf-pre" in err, err
    assert not (tmp_path / "m.gguf").exists()
    code, _, err = cli("convert", tmp_path / "canonical", tmp_path / "m.gguf", "--to", "gguf", "--gguf-pre", "gpt-2")
    assert code == 0, err
    fields = gguf.GGUFReader(tmp_path / "m.gguf").fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2" and fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    source = AutoTokenizer.from_pretrained(str(hf))
    assert len(fields["tokenizer.ggml.merges"].data) == len(json.loads((hf / "tokenizer.json").read_text())
                                                               ["model"]["merges"])
    # a named pre-tokenizer is the user's claim: llama.cpp's gpt-2 (and transformers' reading of it)
    # splits runs of whitespace before a word otherwise than this tokenizer's ByteLevel regex
    for text in (TOKENIZED[0], TOKENIZED[2]):
        assert gguf_tokenizer_ids(tmp_path / "m.gguf", text) == source(text)["input_ids"], text


def test_no_tokenizer_files_means_llama_cpp_s_no_vocabulary(llama_canonical: Path, tmp_path: Path) -> None:
    out = exported(llama_canonical, tmp_path / "m.gguf", "f32")
    assert gguf.GGUFReader(out).fields["tokenizer.ggml.model"].contents() == "none"
    assert open_source(out).tokenizer is None


# -- mixtures of experts: every expert of a layer and projection stacked -----------------------

# what llama.cpp's qwen2moe / qwen3moe / llama graphs hold: an expert FFN on every layer, no window,
# the top-k weights renormalised never (qwen2moe) or always (qwen3moe, Mixtral)
MOE = {"qwen2_moe": dict(SPECS["qwen2_moe"].kwargs, use_sliding_window=False, mlp_only_layers=[],
                         norm_topk_prob=False),
       "qwen3_moe": dict(SPECS["qwen3_moe"].kwargs, use_sliding_window=False, decoder_sparse_step=1,
                         norm_topk_prob=True, attention_bias=False,  # llama.cpp's qwen3moe loads no o bias
                         head_dim=32),  # as the qwen3 model's: see test_llamacpp's q8_0 note
       "mixtral": dict(SPECS["mixtral"].kwargs, sliding_window=None),
       # no o bias, no grouped-query attention (llama.cpp's k norm is as wide as q's)
       "olmoe": dict(SPECS["olmoe"].kwargs, attention_bias=False, norm_topk_prob=False, num_key_value_heads=4)}


MLA = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
           v_head_dim=10)
# families whose GGUF lmconvert writes but transformers' GGUF loader does not read: their spec models,
# cut to what llama.cpp's architecture holds (no o or MLP biases: its loaders read none for these;
# SmolLM3's NoPE on every fourth layer and no window, as llama.cpp hard-codes it)
WRITTEN_ONLY = {
    "gemma": dict(SPECS["gemma"].kwargs, attention_bias=False),
    "granite": dict(SPECS["granite"].kwargs),  # its four multipliers, its biases
    "smollm3": dict(SPECS["smollm3"].kwargs, attention_bias=False, mlp_bias=False, no_rope_layer_interval=4,
                    use_sliding_window=False),
    "olmo": dict(SPECS["olmo"].kwargs, attention_bias=False, clip_qkv=0.4),
    "phi": dict(SPECS["phi"].kwargs, qk_layernorm=False),  # llama.cpp's phi2 has no q/k LayerNorm
    "gpt_neox": dict(SPECS["gpt_neox"].kwargs),  # q, k, v fused as [q | k | v]; parallel residual
    "gpt_neox:sequential": dict(SPECS["gpt_neox"].kwargs, use_parallel_residual=False),  # `name:variant`
    # logit_scale; no q/k norms: llama.cpp's command-r has them only with 64 layers or more
    "cohere": dict(SPECS["cohere"].kwargs, attention_bias=False, use_qk_norm=False),
    "cohere2": dict(SPECS["cohere2"].kwargs, attention_bias=False),  # every fourth layer global, without RoPE
    # ALiBi over six heads (MPT's slopes are ggml's), clip_qkv; scores scaled by 1/sqrt(head_dim), as
    # llama.cpp's mpt has it
    "mpt": dict(SPECS["mpt"].kwargs, attn_config={"clip_qkv": 1.5}),
    # DeepSeek-V3's MLA with a q LoRA (llama.cpp reads a plain q only for its lite layer counts), dense, and
    # with grouped sigmoid-routed experts (a perturbed selection bias: `built`) after a dense layer
    "deepseek_v3": dict(MLA, first_k_dense_replace=2),
    "deepseek_v3:moe": dict(MLA, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
                            moe_intermediate_size=24, n_shared_experts=2, routed_scaling_factor=1.5, n_group=4,
                            topk_group=2),
    # DeepSeek-V2: softmax-routed experts, unrenormalised, scaled, without groups (V2-Lite's greedy), after
    # two dense layers; every expert chosen somewhere in the test sequences
    "deepseek_v2": dict(MLA, first_k_dense_replace=2, num_hidden_layers=4, n_routed_experts=8,
                        num_experts_per_tok=3, moe_intermediate_size=24, n_shared_experts=2,
                        routed_scaling_factor=1.5),
    "deepseek_v2:dense": dict(MLA, first_k_dense_replace=2),  # no num_experts_per_tok: llama.cpp wants one
}
# a family added with its spec alone: its spec's model cut to what llama.cpp's architecture holds
WRITTEN_ONLY.update({name: dict(spec.kwargs, **spec.gguf) for name, spec in SPECS.items()
                     if spec.gguf is not None and name not in WRITTEN_ONLY})
# Granite 4 with RoPE, which llama.cpp's granitehybrid runs as lmconvert states it (its converter would drop the RoPE)
WRITTEN_ONLY["granitemoehybrid:rope"] = dict(WRITTEN_ONLY["granitemoehybrid"], position_embedding_type="rope")
# Nemotron-H with MoE blocks (llama.cpp's nemotron_h_moe): no MLP block beside them (llama.cpp reads every FFN block of
# a model with experts as a mixture), no biases on the shared expert or the Mamba2 projections
WRITTEN_ONLY["nemotron_h:moe"] = dict(SPECS["nemotron_h_moe"].kwargs, use_bias=False, mlp_bias=False,
                                      layers_block_type=["linear_attention", "moe", "full_attention", "moe",
                                                         "linear_attention"])
# a dense Granite 4 (the shared MLP its only FFN, no top-k: llama.cpp's loader asserts none without experts), without
# positions and in_proj / out_proj biases, as the MoE one
WRITTEN_ONLY["granitemoehybrid:dense"] = dict(SPECS["granitemoehybrid_dense"].kwargs, **SPECS["granitemoehybrid"].gguf)
# Llama 4 Maverick's layout: 128 experts, for which llama.cpp's llama4 runs no QK norm (Scout's 16 have it)
WRITTEN_ONLY["llama4_text:maverick"] = dict(WRITTEN_ONLY["llama4_text"], num_local_experts=128, use_qk_norm=False)
# Gemma 4's MoE block beside every dense MLP (the 26B-A4B layout), per-layer embeddings too; and a Gemma 4 without a
# final soft-cap, which export states as 0 (llama.cpp's runtime soft-caps at 30 where a file states none)
WRITTEN_ONLY["gemma4_text:moe"] = dict(WRITTEN_ONLY["gemma4_text"], enable_moe_block=True, num_experts=6,
                                       top_k_experts=3, moe_intermediate_size=32)
WRITTEN_ONLY["gemma4_text:uncapped"] = dict(WRITTEN_ONLY["gemma4_text"], final_logit_softcapping=None)
# Falcon's layouts beyond Falcon-7B's (FAMILIES["falcon"]) that llama.cpp's falcon runs: Falcon-40B's two
# norms, Falcon2-11B's one with grouped KV heads, multi-head attention; transformers' GGUF loader reads
# each as Falcon-7B's, so our reader and llama.cpp are their proof
FALCONS = {f"falcon:{layout}": {**FAMILIES["falcon"], **overrides}
           for layout, (overrides, _, _) in FALCON_LAYOUTS.items() if layout != "7b"}
# every exportable family's tiny model that llama.cpp's architecture holds whole (test_llamacpp.py runs them)
MODELS: dict[str, dict[str, Any]] = {**{t: FAMILIES[t] for t in FAMILIES if t in EXPORTS}, **MOE, **WRITTEN_ONLY,
                                     **FALCONS}
# what our reader must give back bit for bit: the families transformers cannot read, and the LayerNorm
# families whose every layout transformers' GGUF loader does not tell apart; not those whose multipliers llama.cpp's
# converter folds into the weights (Falcon-H1's muP), read back folded (tests/test_gguf_falcon_h1.py)
READ_BACK = {name: kwargs for name, kwargs in
             {**WRITTEN_ONLY, "bloom": FAMILIES["bloom"], "falcon": FAMILIES["falcon"], **FALCONS}.items()
             if not EXPORTS[name.split(":")[0]][1].folded}



# canonical tensors llama.cpp stores exponentiated (A = -exp(A_log)): log(-A) gives them back within float32's eps
# x max(1, |A_log|) (measured: 1.0x on a million normal values times 3)
STORED_AS_EXP = (".A_log",)  # Mamba's, Mamba2's and the gated delta-net's


def test_every_architecture_written_has_a_test_model() -> None:
    """A family whose GGUF entry export writes is tested by llama.cpp on a model of it (its spec's `gguf`)."""
    assert set(EXPORTS) - {name.split(":")[0] for name in MODELS} == set()

def built(name: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    """The tiny model `name` (`family:variant`), DeepSeek-V3's selection bias perturbed too (a buffer,
    which build_model's perturbation of parameters leaves at 0)."""
    model = build_model(name.split(":")[0], **kwargs)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith(SELECTION_BIAS_BUFFERS):
                buffer.add_(torch.randn(buffer.shape, generator=generator) * 0.3)
    return model


@pytest.mark.parametrize("quant", ["f32", "bf16"])
@pytest.mark.parametrize("name", list(READ_BACK))
def test_families_transformers_cannot_read_come_back_bit_for_bit(name: str, quant: str, tmp_path: Path) -> None:
    """Our reader, which reads these files the way llama.cpp's loader does (tested by llama.cpp
    itself in test_llamacpp.py), gives back the model: every tensor at the file's type, the same
    ArchConfig but the float32 eps, and at f32 the same logits. A state-space A_log, which llama.cpp stores as
    A = -exp(A_log), comes back as log(-A), within 2 eps x max(1, |A_log|) (STORED_AS_EXP): the source is given
    that round trip before tensors and logits are compared bit for bit."""
    canonical = canonical_of(built(name, READ_BACK[name]), tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", quant)
    ours, source = lmconvert.load(out, attention="eager"), lmconvert.load(canonical, attention="eager")
    assert as_float32(ours.cfg) == as_float32(source.cfg)
    theirs = source.state_dict()
    with torch.no_grad():
        for tensor_name, tensor in theirs.items():
            if tensor_name.endswith(STORED_AS_EXP):
                back = torch.log(-NEG_EXP.inverse(tensor.float()))  # the file's A, then log(-A)
                bar = torch.finfo(torch.float32).eps * tensor.float().abs().clamp(min=1)  # measured: within 1x
                assert bool(((back - tensor.float()).abs() <= 2 * bar).all()), tensor_name
                tensor.copy_(back)  # the source's own parameter: its logits below are the round trip's
    assert set(ours.state_dict()) == set(theirs)
    for tensor_name, tensor in ours.state_dict().items():
        if name.split(":")[0] in ONE_PLUS_W and tensor_name.endswith("norm.weight") and ".mixer." not in tensor_name:
            # stored as w + 1, in f32
            assert torch.equal(tensor, ((theirs[tensor_name].float() + 1) - 1).to(tensor.dtype)), tensor_name
            continue
        assert torch.equal(tensor.float(), theirs[tensor_name].to(FLOATS[quant]).float()), tensor_name
    if quant == "f32":
        ids = token_batch(seq=28)
        assert torch.equal(logits_of(ours, ids), logits_of(source, ids))


# the families whose norms llama.cpp stores as w + 1 (their gated delta-net's own norm excepted)
ONE_PLUS_W = {"gemma", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}


def as_float32(value: Any) -> Any:  # noqa: ANN401 - a config, field by field
    """A config with every real rounded to float32, as GGUF metadata stores reals."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: as_float32(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, tuple):
        return tuple(as_float32(v) for v in value)
    return value


@pytest.mark.parametrize("name", list(FALCONS))
def test_falcon_layouts_are_what_the_llama_cpp_converter_writes(name: str, tmp_path: Path) -> None:
    model = build_model("falcon", **FALCONS[name])
    ours = exported(canonical_of(model, tmp_path), tmp_path / "ours.gguf", "f32")
    theirs = write_falcon_gguf(model, tmp_path / "theirs.gguf")
    ours_t = {t.name: np.array(t.data) for t in gguf.GGUFReader(ours).tensors}
    theirs_t = {t.name: np.array(t.data) for t in gguf.GGUFReader(theirs).tensors}
    assert set(ours_t) == set(theirs_t)
    for tensor_name, data in theirs_t.items():
        assert np.array_equal(ours_t[tensor_name], data), tensor_name
    assert_same_config(ours, theirs, INVENTED_IDS["falcon"])


def test_granite_s_multipliers_are_llama_cpp_s_keys(tmp_path: Path) -> None:
    kwargs = WRITTEN_ONLY["granite"]
    out = exported(canonical_of(build_model("granite", **kwargs), tmp_path), tmp_path / "m.gguf", "f32")
    fields = gguf.GGUFReader(out).fields
    for key, hf_key in (("granite.attention.scale", "attention_multiplier"),
                        ("granite.embedding_scale", "embedding_multiplier"),
                        ("granite.residual_scale", "residual_multiplier"), ("granite.logit_scale", "logits_scaling")):
        assert fields[key].contents() == pytest.approx(kwargs[hf_key], rel=1e-7), key
    assert gguf.GGUFReader(tmp_path / "m.gguf").fields["general.architecture"].contents() == "granite"


def test_mpt_s_own_score_scale_is_refused(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("mpt", **SPECS["mpt"].kwargs), tmp_path)  # softmax_scale 0.2
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's mpt metadata cannot express this model's attn_scale" in err, err


def test_bloom_s_residual_after_the_norm_is_refused(tmp_path: Path) -> None:
    """llama.cpp's bloom graph adds each sublayer to its un-normed input, and no key says otherwise."""
    canonical = canonical_of(build_model("bloom", **{**FAMILIES["bloom"],
                                                     "apply_residual_connection_post_layernorm": True}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's bloom metadata cannot express this model's residual_after_norm" in err, err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("overrides", "fragment"), [
    (dict(rms_norm_eps=1e-5), "llama.cpp's deepseek2 normalises the latent q and kv with rms_norm_eps (1e-05)"),
    (dict(q_lora_rank=None), "reads a plain q projection (q_lora_rank null) exactly for its lite shapes"),
    (dict(rope_interleave=False), "cannot express this model's rope"),
    (dict(attention_bias=True), "llama.cpp's deepseek2 architecture loads no blk.0.attn_kv_a_mqa.bias"),
    (dict(WRITTEN_ONLY["deepseek_v3:moe"], topk_group=4),  # every group kept: llama.cpp's loader aborts
     "llama.cpp's deepseek2 loader requires expert_group_used_count below expert_group_count (it aborts otherwise), "
     "and this model uses 4 of 4 expert groups"),
])
def test_deepseek_v3_s_layouts_llama_cpp_lacks_are_refused(overrides: dict[str, Any], fragment: str,
                                                           tmp_path: Path) -> None:
    canonical = canonical_of(build_model("deepseek_v3", **{**WRITTEN_ONLY["deepseek_v3"], **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("name", "overrides", "fragment"), [
    ("qwen3_next", dict(linear_value_head_dim=16), "load the gated delta-net's value heads as wide as its key heads"),
    ("qwen3_5_text", dict(linear_value_head_dim=16), "and this model's are 16 and 8 wide"),
    ("qwen3_next", dict(norm_topk_prob=False), "qwen3next metadata cannot express this model's moe"),
    ("qwen3_next", dict(mlp_only_layers=[2]), "qwen3next architecture has no tensor for layers.2.mlp.down.weight"),
    ("qwen3_5_moe_text", dict(attention_bias=True), "qwen35moe architecture loads no blk.1.attn_k.bias"),
])
def test_gated_deltanet_layouts_llama_cpp_lacks_are_refused(name: str, overrides: dict[str, Any], fragment: str,
                                                             tmp_path: Path) -> None:
    """llama.cpp's qwen3next / qwen35 / qwen35moe: value heads as wide as key heads, experts on every layer and
    renormalised, no attention biases; anything else is refused by name."""
    canonical = canonical_of(built(name, {**WRITTEN_ONLY[name], **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("name", "overrides", "fragment"), [
    ("jamba", dict(mamba_expand=3), "runs a Mamba width of 2 x hidden_size only"),
    ("jamba", dict(mamba_conv_bias=False), "requires the Mamba conv's bias"),
    ("jamba", dict(mamba_proj_bias=True), "jamba architecture has no tensor for layers.0.mixer.in_proj.bias"),
    ("granitemoehybrid", dict(mamba_expand=3, mamba_d_head=24), "runs a Mamba2 width of 2 x hidden_size only"),
    ("granitemoehybrid", dict(mamba_proj_bias=True),
     "granitehybrid architecture has no tensor for layers.0.mixer.in_proj.bias"),
    ("granitemoehybrid", dict(time_step_limit=[0.01, 3.0]), "granitehybrid metadata cannot express this model's"),
    ("nemotron_h", dict(mlp_hidden_act="silu"), "runs the MLP blocks with relu2"),
    ("nemotron_h", dict(use_bias=True), "nemotron_h architecture has no tensor for layers.0.mixer.in_proj.bias"),
    ("nemotron_h:moe", dict(layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "moe"]),
     "reads every FFN block of a model with experts as a mixture (nemotron-h.cpp: `if (n_expert != 0)`), and this "
     "model has MLP blocks beside its MoE blocks (layers [3])"),
    ("nemotron_h:moe", dict(mlp_bias=True),
     "nemotron_h_moe architecture has no tensor for layers.1.mlp.shared.down.bias"),
    ("bamba", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "rotates whole heads (its converter permutes every q/k row for that), and this model rotates "
     "partial_rotary_factor=0.5 of each"),
])
def test_state_space_hybrid_layouts_llama_cpp_lacks_are_refused(name: str, overrides: dict[str, Any], fragment: str,
                                                                 tmp_path: Path) -> None:
    """What llama.cpp's hybrid state-space architectures cannot run is refused by name, nothing written."""
    canonical = canonical_of(built(name, {**WRITTEN_ONLY[name], **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


# MiMo-V2-Flash's tiny model's two RoPE types (full: theta 5e4, 0.334 of 24 dims; sliding: theta 2e4, half)
MIMO_ROPE = SPECS["mimo_v2_flash"].kwargs["rope_parameters"]


@pytest.mark.parametrize(("name", "overrides", "fragment"), [
    ("mimo_v2_flash", dict(attention_bias=True), "never adds the q, k and v biases its loader reads"),
    ("mimo_v2_flash", dict(norm_topk_prob=False), "always renormalises the chosen experts' weights"),
    ("mimo_v2_flash", dict(routed_scaling_factor=1.5), "reads no expert_weights_scale"),
    ("mimo_v2_flash", dict(rope_parameters=MIMO_ROPE), "rotates every layer's heads by layer 0's width"),
    ("mimo_v2_flash", dict(rope_parameters={kind: {**MIMO_ROPE[kind], "rope_type": "linear", "factor": 2.0,
                                                   "partial_rotary_factor": 0.334} for kind in MIMO_ROPE}),
     "rotates the sliding layers unscaled"),
    ("afmoe", dict(mup_enabled=False), "scales the embeddings by sqrt(hidden_size) whatever the file says"),
    ("afmoe", dict(attention_bias=True), "loads no attention output bias"),
    ("afmoe", dict(layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
     "rotates every layer but each 4th"),
    ("laguna", dict(moe_router_logit_softcapping=2.0), "does not soft-cap the router's logits"),
    ("laguna", dict(attention_bias=True), "adds no o_proj bias"),
    ("laguna", dict(layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"]),
     "load_swa_pattern(ml, 4, /*dense_first=*/true);"),
    ("laguna", dict(mlp_layer_types=["dense", "sparse", "dense", "sparse"]), "runs dense FFNs on the leading layers"),
    ("laguna", dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e4},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}),
     "with its default RoPE only"),
    ("laguna", dict(gating=False), "with its per-head gate only"),
], ids=["mimo-qkv-bias", "mimo-not-renormalised", "mimo-scaled-weights", "mimo-two-rotated-widths",
        "mimo-scaled-rope", "afmoe-no-mup", "afmoe-attention-biases", "afmoe-full-every-second-layer",
        "laguna-router-softcap", "laguna-o-bias", "laguna-other-window-pattern", "laguna-dense-after-experts",
        "laguna-scaled-rope", "laguna-per-element-gate"])
def test_what_llama_cpp_s_graph_computes_otherwise_is_refused(name: str, overrides: dict[str, Any], fragment: str,
                                                              tmp_path: Path) -> None:
    """What llama.cpp's mimo2, afmoe and laguna graphs compute otherwise than transformers' MiMo-V2-Flash, AFMoE and
    Laguna (a line of their C++ the message names) is refused by name, nothing written."""
    canonical = canonical_of(built(name, {**WRITTEN_ONLY[name], **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("overrides", "fragment"), [
    (dict(rms_norm_eps=1e-5), "llama.cpp's kimi-linear normalises the latent q and kv with rms_norm_eps (1e-05)"),
    (dict(linear_num_heads=2), "runs KDA with the attention's head count (4), and this model's KDA has "
                               "linear_num_heads=2"),
    (dict(mlp_layer_types=["sparse", "dense", "sparse", "sparse"]), "has dense layers only before the experts"),
    (dict(moe_renormalize=False), "always renormalises the chosen experts' weights"),
    (dict(num_expert_group=4, topk_group=4), "requires expert_group_used_count below expert_group_count"),
    (dict(attention_bias=True), "kimi-linear architecture loads no blk.3.attn_kv_a_mqa.bias"),
    (dict(q_lora_rank=24), "reads no q_lora_rank (its loader sizes attn_q_a_norm as 0)"),
    (dict(layer_types=["linear_attention"] * 4), "aborts on a model without both KDA and MLA layers"),
    (dict(layer_types=["full_attention"] * 4), "and this model's layers are all MLA"),
])
def test_kimi_linear_layouts_llama_cpp_lacks_are_refused(overrides: dict[str, Any], fragment: str,
                                                          tmp_path: Path) -> None:
    """llama.cpp's kimi-linear: rms_norm_eps for MLA's kv_a norm and KDA's q/k l2 norms (transformers: 1e-6), both
    layer kinds, one head count for KDA and MLA, a plain q, leading dense layers, renormalised experts, DeepSeek-V3's
    groups as its loader takes them, no biases; anything else is refused by name, nothing
    written."""
    canonical = canonical_of(built("kimi_linear", {**WRITTEN_ONLY["kimi_linear"], **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("name", "key", "element", "value", "fragment"), [
    ("mimo_v2_flash", "mimo2.attention.head_count_kv", 0, 3, "twice the full layers' KV heads on every sliding"),
    ("afmoe", "afmoe.expert_weights_norm", 0, 0, "afmoe.expert_weights_norm is not true"),
], ids=["mimo-kv-heads-not-halved", "afmoe-unnormalised-weights"])
def test_what_llama_cpp_runs_otherwise_is_refused_on_import(name: str, key: str, element: int, value: int,
                                                            fragment: str, tmp_path: Path) -> None:
    """A mimo2 or afmoe file llama.cpp would run as transformers' model cannot (a sliding layer without twice the
    full layers' KV heads; experts' weights left unnormalised) is refused on import, naming the key."""
    from test_gguf_header import patched

    out = exported(canonical_of(built(name, WRITTEN_ONLY[name]), tmp_path), tmp_path / "m.gguf", "f32")
    lmconvert.load(out)  # as written, it reads back
    patched(out, field=key, part=int(gguf.GGUFReader(out).fields[key].data[element]), value=value)
    with pytest.raises(InputError, match=fragment):
        lmconvert.load(out)


def hf_config_of(name: str, root: Path) -> dict[str, Any]:
    """The config.json GGUF export starts from for the tiny model `name` (`family:variant`)."""
    family = name.split(":")[0]
    return family_named(family).hf_config(lmconvert.load(canonical_of(built(name, WRITTEN_ONLY[name]), root)).cfg)


def test_deepseek_v2_and_v3_are_told_apart_by_llama_cpp_s_gating_function(tmp_path: Path) -> None:
    """llama.cpp's deepseek2 is both: softmax scores (`expert_gating_func` 1, and no key at all, which
    llama.cpp's loader takes as softmax) read as DeepSeek-V2, sigmoid (2) as DeepSeek-V3, anything
    else refused; V2 with renormalised weights (which it never has) refused."""
    v2 = metadata(hf_config_of("deepseek_v2", tmp_path / "v2"), "t")
    v3 = metadata(hf_config_of("deepseek_v3:moe", tmp_path / "v3"), "t")
    shapes = {"token_embd.weight": (128, 64)}
    assert v2.values["deepseek2.expert_gating_func"] == 1 and v3.values["deepseek2.expert_gating_func"] == 2
    config, _ = read_back(v2, shapes)
    assert (config["model_type"], config["topk_method"], config["n_group"]) == ("deepseek_v2", "greedy", None)
    assert read_back(v3, shapes)[0]["model_type"] == "deepseek_v3"
    unstated = dataclasses.replace(v2, values={k: v for k, v in v2.values.items() if "gating" not in k})
    assert read_back(unstated, shapes)[0]["model_type"] == "deepseek_v2"
    # llama.cpp scales the chosen experts' weights only by a stated scale other than 0
    unscaled = {k: v for k, v in v2.values.items() if not k.endswith("expert_weights_scale")}
    for values in (unscaled, {**unscaled, "deepseek2.expert_weights_scale": 0.0}):
        assert read_back(dataclasses.replace(v2, values=values), shapes)[0]["routed_scaling_factor"] == 1.0
    for values, fragment in (({"deepseek2.expert_gating_func": 3}, "expert_gating_func=3: lmconvert reads"),
                             ({"deepseek2.expert_weights_norm": True}, "DeepSeek-V2 never renormalises")):
        with pytest.raises(MappingError, match=fragment):
            read_back(dataclasses.replace(v2, values={**v2.values, **values}), shapes)


def test_deepseek_v2_f16_reads_back_bit_for_bit(tmp_path: Path) -> None:
    """f16 (f32 and bf16: test_families_transformers_cannot_read_come_back_bit_for_bit)."""
    canonical = canonical_of(built("deepseek_v2", WRITTEN_ONLY["deepseek_v2"]), tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", "f16")
    ours, source = lmconvert.load(out, attention="eager"), lmconvert.load(canonical, attention="eager")
    assert as_float32(ours.cfg) == as_float32(source.cfg)
    theirs = source.state_dict()
    for tensor_name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[tensor_name].to(torch.float16)), tensor_name


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_deepseek_v2_quantized_is_gguf_quants_round_trip(quant: str, tmp_path: Path) -> None:
    """Each tensor of a quantized file is gguf.quants' quantization of the f32 file's (itself the
    model bit for bit), or that tensor unchanged where llama.cpp keeps it f32 (norms, the router)."""
    canonical = canonical_of(built("deepseek_v2", WRITTEN_ONLY["deepseek_v2"]), tmp_path)
    f32 = exported(canonical, tmp_path / "f32.gguf", "f32")
    exact = {t.name: np.array(t.data) for t in gguf.GGUFReader(f32).tensors}
    quantized = 0
    for t in gguf.GGUFReader(exported(canonical, tmp_path / "q.gguf", quant)).tensors:
        kind = t.tensor_type
        if kind == gguf.GGMLQuantizationType.F32:
            assert np.array_equal(np.array(t.data), exact[t.name]), t.name
            continue
        expected = gguf.quants.dequantize(gguf.quants.quantize(exact[t.name], kind), kind)
        assert np.array_equal(gguf.quants.dequantize(t.data, kind), expected), t.name
        quantized += kind.name == QUANTS[quant]
    assert quantized >= 10
    assert torch.equal(imported_tensors(tmp_path / "q.gguf")["model.layers.2.mlp.gate.weight"],
                       imported_tensors(tmp_path / "f32.gguf")["model.layers.2.mlp.gate.weight"])


@pytest.mark.parametrize(("overrides", "fragment"), [
    (dict(topk_method="group_limited_greedy", n_group=4, topk_group=2),
     "limited to 2 of 4 expert groups: llama.cpp's deepseek2 scores a group by the sum of its two best"),
    (dict(topk_method="group_limited_greedy", n_group=2, topk_group=2),  # greedy, but llama.cpp aborts
     "llama.cpp's deepseek2 loader requires expert_group_used_count below expert_group_count"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                           "original_max_position_embeddings": 32, "mscale": 0.707, "mscale_all_dim": 0.707}),
     "derives the attention scale of scaled RoPE (yarn) its own way"),
    (dict(q_lora_rank=None), "reads a plain q projection (q_lora_rank null) exactly for its lite shapes"),
])
def test_deepseek_v2_s_layouts_llama_cpp_computes_otherwise_are_refused(overrides: dict[str, Any], fragment: str,
                                                                       tmp_path: Path) -> None:
    canonical = canonical_of(built("deepseek_v2", {**WRITTEN_ONLY["deepseek_v2"], **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


def test_command_r_s_qk_norms_go_with_64_layers(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("cohere", **{**WRITTEN_ONLY["cohere"], "use_qk_norm": True}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "has q/k norms exactly when there are 64 layers or more" in err, err


def test_smollm3_s_nope_layers_must_be_llama_cpp_s(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("smollm3", **{**WRITTEN_ONLY["smollm3"], "no_rope_layer_interval": 2}),
                             tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's smollm3 metadata cannot express this model's layer_positions" in err, err


@pytest.mark.parametrize("quant", ["f32", "bf16"])
@pytest.mark.parametrize("name", list(MOE))
def test_mixtures_read_back_bit_for_bit(name: str, quant: str, tmp_path: Path) -> None:
    """Each expert's matrices stacked on export and unstacked on import: every canonical tensor
    back bit for bit at the file's type, and at f32 the same logits."""
    canonical = canonical_of(build_model(name, **MOE[name]), tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", quant)
    ours, source = lmconvert.load(out, attention="eager"), lmconvert.load(canonical, attention="eager")
    assert ours.cfg.moe == source.cfg.moe
    theirs = source.state_dict()
    for tensor_name, tensor in ours.state_dict().items():
        assert torch.equal(tensor.float(), theirs[tensor_name].to(FLOATS[quant]).float()), tensor_name
    names = {t.name for t in gguf.GGUFReader(out).tensors}
    assert "blk.0.ffn_gate_exps.weight" in names and not any(".experts." in n for n in names)
    if quant == "f32":
        ids = token_batch(seq=28)
        assert torch.equal(logits_of(ours, ids), logits_of(source, ids))


@pytest.mark.parametrize("name", list(MOE))
def test_mixtures_are_what_the_llama_cpp_converter_writes(name: str, tmp_path: Path) -> None:
    from test_moe import write_moe_gguf

    model = build_model(name, **MOE[name])
    ours = exported(canonical_of(model, tmp_path), tmp_path / "ours.gguf", "f32")
    theirs = write_moe_gguf(model, tmp_path / "theirs.gguf",
                            name="Mixtral-tiny" if name == "mixtral" else "tiny")
    ours_t = {t.name: np.array(t.data) for t in gguf.GGUFReader(ours).tensors}
    theirs_t = {t.name: np.array(t.data) for t in gguf.GGUFReader(theirs).tensors}
    assert set(ours_t) == set(theirs_t)
    for tensor_name, data in theirs_t.items():
        assert np.array_equal(ours_t[tensor_name], data), tensor_name
    assert_same_config(ours, theirs)


@pytest.mark.parametrize("name", ["qwen2_moe", "qwen3_moe"])
def test_transformers_reads_the_mixtures(name: str, tmp_path: Path) -> None:
    """transformers' GGUF loader reads no expert widths (its config defaults: test_moe's models)."""
    from test_moe import GGUF_MODELS

    model = build_model(name, **GGUF_MODELS[name])
    out = exported(canonical_of(model, tmp_path), tmp_path / "m.gguf", "f32")
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=out.name, dtype=torch.float32,
                                                  attn_implementation="eager", experts_implementation="eager").eval()
    ids = token_batch(seq=24)
    assert (logits_of(theirs, ids) - logits_of(lmconvert.load(out, attention="eager"), ids)).abs().max() <= FP32_MAX_ABS


def test_a_bias_llama_cpp_does_not_load_is_refused_by_name(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("qwen3_moe", **{**MOE["qwen3_moe"], "attention_bias": True}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's qwen3moe architecture loads no blk.0.attn_output.bias" in err, err
    assert not (tmp_path / "m.gguf").exists()


def test_a_tied_output_where_llama_cpp_requires_one_is_refused(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("stablelm", **{**FAMILIES["stablelm"], "tie_word_embeddings": True}),
                             tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's stablelm architecture requires an output matrix" in err, err


def test_olmoe_with_grouped_query_attention_is_refused(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("olmoe", **{**MOE["olmoe"], "num_key_value_heads": 2}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's olmoe architecture normalises k over as many heads as q" in err, err


def test_a_dense_layer_in_a_mixture_is_refused_by_name(tmp_path: Path) -> None:
    canonical = canonical_of(build_model("qwen2_moe", **{**MOE["qwen2_moe"], "mlp_only_layers": [1]}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and "llama.cpp's qwen2moe architecture has no tensor for layers.1.mlp.down.weight" in err, err
    assert not (tmp_path / "m.gguf").exists()


def test_split_files_as_llama_cpp_writes_them(llama_canonical: Path, tmp_path: Path) -> None:
    """--max-shard-size: OUT is a directory of `OUT-0000i-of-0000N.gguf`, each with its split keys,
    holding between them exactly the one file's tensors (llama.cpp's test is in test_llamacpp.py)."""
    whole = exported(llama_canonical, tmp_path / "one.gguf", "q8_0")
    code, _, err = cli("convert", llama_canonical, tmp_path / "parts", "--to", "gguf", "--max-shard-size", "40KB")
    assert code == 0, err
    files = sorted(p.name for p in (tmp_path / "parts").glob("*.gguf"))
    n = len(files)
    assert n > 1 and files == [f"parts-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    expected = {t.name: bytes(t.data) for t in gguf.GGUFReader(whole).tensors}
    found = {}
    for i, name in enumerate(files):
        reader = gguf.GGUFReader(tmp_path / "parts" / name)
        assert reader.fields["split.no"].contents() == i and reader.fields["split.count"].contents() == n
        assert reader.fields["split.tensors.count"].contents() == len(expected)
        found.update({t.name: bytes(t.data) for t in reader.tensors})
    assert found == expected
    assert gguf.GGUFReader(tmp_path / "parts" / files[0]).fields["general.architecture"].contents() == "llama"
    code, _, err = cli("convert", llama_canonical, tmp_path / "parts", "--to", "gguf", "--max-shard-size", "40KB")
    assert code == 2 and "already exists" in err
    assert cli("convert", llama_canonical, tmp_path / "parts", "--to", "gguf", "--max-shard-size", "80KB",
               "--force")[0] == 0
    assert len(list((tmp_path / "parts").glob("*.gguf"))) < n


def test_ernie4_5_moe_with_dense_layers_between_sparse_ones_is_refused(tmp_path: Path) -> None:
    """llama.cpp's ernie4_5-moe loader reads experts on every layer from the first sparse one: a
    model with a dense layer after it (moe_layer_interval 2) would not load, so export refuses it."""
    kwargs = SPECS["ernie4_5_moe"].kwargs
    assert kwargs["moe_layer_interval"] == 2
    canonical = canonical_of(build_model("ernie4_5_moe", **kwargs), tmp_path)
    with pytest.raises(InputError, match=r"reads experts on every layer from the first sparse one \(1\) on, and this "
                                         r"model's sparse layers are \[1, 3\]"):
        convert(canonical, tmp_path / "out.gguf", "gguf", quant="f32")


@pytest.mark.parametrize("overrides", [{}, {"n_group": 1, "topk_group": 1,
                                            "mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}],
                         ids=["groups", "dense-between"])
def test_exaone_moe_s_routing_llama_cpp_lacks_is_refused(overrides: dict[str, Any], tmp_path: Path) -> None:
    """llama.cpp's exaone-moe has no group-limited choice (the spec model chooses in 2 of 4 groups)
    and only leading dense layers: such a model is refused, naming the mixture of experts."""
    assert SPECS["exaone_moe"].kwargs["n_group"] == 4
    canonical = canonical_of(build_model("exaone_moe", **{**SPECS["exaone_moe"].kwargs, **overrides}), tmp_path)
    with pytest.raises(InputError, match="llama.cpp's exaone-moe metadata cannot express this model's moe"):
        convert(canonical, tmp_path / "out.gguf", "gguf", quant="f32")


# -- the families llama.cpp's converter writes under another's architecture, and what their graphs lack --

F = "full_attention"


@pytest.mark.parametrize(("name", "word"), [
    ("internlm3", "internlm3"), ("iquestcoder", "iquestcoder"), ("olmo3", None), ("olmo2", None), ("youtu", "youtu"),
    ("sarvam_mla", "sarvam"), ("glm4_moe_lite", "glm4_moe_lite")])
def test_a_family_written_as_another_s_architecture_reads_back_as_itself(name: str, word: str | None,
                                                                         tmp_path: Path) -> None:
    """InternLM3 and IQuest-Coder are llama.cpp's `llama`, Youtu, Sarvam and GLM-4.7-Flash its
    `deepseek2`: told apart, as Mistral, by a word of general.name; OLMo 3 is its `olmo2` with a
    window (an OLMo 2 file, without one, stays OLMo 2)."""
    out = exported(canonical_of(built(name, MODELS[name]), tmp_path), tmp_path / "m.gguf", "f32")
    assert open_source(out).config["model_type"] == name
    if word is not None:
        assert word in gguf.GGUFReader(out).fields["general.name"].contents().lower()


@pytest.mark.parametrize(("name", "overrides", "fragment"), [
    # the sliding layers' own theta: llama.cpp's olmo2 rotates them with `rope.freq_base`
    ("olmo3", dict(SPECS["olmo3"].kwargs, attention_bias=False),
     "olmo2 metadata cannot express this model's rope_local"),
    # sliding layers below 64 layers: llama.cpp's exaone4 has none; with 64, its own, which lmconvert does not
    # write
    ("exaone4", dict(SPECS["exaone4"].kwargs), "exaone4 metadata cannot express this model's layer_positions"),
    ("exaone4", dict(WRITTEN_ONLY["exaone4"], num_hidden_layers=64, layer_types=[F] * 64),
     "llama.cpp's exaone4 hard-codes sliding layers"),
    ("jais2", dict(SPECS["jais2"].kwargs), "llama.cpp's jais2 loads no rope_freqs tensor"),
    ("dots1", dict(WRITTEN_ONLY["dots1"], num_key_value_heads=2), "llama.cpp's dots1 sizes k and v as q"),
    ("gpt_bigcode", dict(WRITTEN_ONLY["gpt_bigcode"], scale_attn_weights=False),
     "starcoder metadata cannot express this model's attn_scale"),
    ("glm4_moe_lite", dict(WRITTEN_ONLY["glm4_moe_lite"], mlp_layer_types=["sparse", "dense", "sparse"]),
     "deepseek2 metadata cannot express this model's moe"),  # a dense layer after experts
    ("seed_oss", dict(WRITTEN_ONLY["seed_oss"], attention_out_bias=True), "seed_oss architecture loads no"),
    # llama.cpp's gpt-oss loader requires the attention output's bias (openai-moe.cpp: create_tensor(..., 0))
    ("gpt_oss", dict(SPECS["gpt_oss"].kwargs, **SPECS["gpt_oss"].gguf, attention_bias=False),
     "gpt-oss architecture requires blk.0.attn_output.bias"),
    # full and sliding layers with thetas of their own: llama.cpp's granite_swa rotates every layer with freq_base
    ("granite_swa", dict(SPECS["granite_swa"].kwargs), "granite_swa metadata cannot express this model's rope_local"),
    # llama.cpp's llama4 hard-codes its layer pattern, chunk, temperature and QK norm, and reads only the experts'
    # interleave step: the file read back (`derived` fills in what its graph computes) loses what differs, named
    *(("llama4_text", dict(WRITTEN_ONLY["llama4_text"], **overrides), f"llama4 {fragment}")
      for overrides, fragment in (
          (dict(SPECS["llama4_text"].kwargs), "metadata cannot express this model's moe, layer_positions"),
          (dict(attention_chunk_size=8), "metadata cannot express this model's attention_chunk;"),
          (dict(layer_types=["chunked_attention", "full_attention", "chunked_attention", "full_attention"]),
           "metadata cannot express this model's chunked_layers;"),
          (dict(floor_scale=8), "metadata cannot express this model's attn_temperature_floor;"),
          (dict(attn_scale=0.5), "metadata cannot express this model's attn_temperature;"),
          (dict(attn_temperature_tuning=False), "metadata cannot express this model's attn_temperature,"),
          (dict(use_qk_norm=False), "metadata cannot express this model's qk_l2_norm;"),
          (dict(num_local_experts=128), "metadata cannot express this model's qk_l2_norm;"),  # Maverick: no QK norm
          (dict(moe_layers=[1, 2]), "metadata cannot express this model's moe;"),
          (dict(moe_layers=[]), "metadata cannot express this model's moe;"),
          (dict(attention_bias=True), "architecture loads no"))),
    # llama.cpp's gemma4: a per-layer embedding for every token id; the KV-shared layers take the K/V of the last
    # layer before them (full) and of the one before that (sliding); unscaled proportional and default RoPE; no biases
    *(("gemma4_text", dict(WRITTEN_ONLY["gemma4_text"], **overrides), fragment) for overrides, fragment in (
        (dict(vocab_size_per_layer_input=64), "reads a per-layer embedding for every token id (vocab_size=128)"),
        (dict(layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention",
                           "sliding_attention", "full_attention"]),
         "gemma4 gives the KV-shared layers the K/V of layer 3 (the full ones) and 2 (the sliding ones)"),
        (dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1e6}}),
         "llama.cpp's gemma4 runs unscaled proportional RoPE on the full layers"),
        (dict(attention_bias=True), "gemma4 architecture loads no blk.0.attn_k.bias"))),
])
def test_what_these_llama_cpp_graphs_compute_otherwise_is_refused(name: str, overrides: dict[str, Any], fragment: str,
                                                                   tmp_path: Path) -> None:
    canonical = canonical_of(build_model(name, **overrides), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()
