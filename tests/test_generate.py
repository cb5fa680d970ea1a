"""`generate`: sampling as transformers' generate samples (the same seed gives the same token ids on
CPU in fp32), settings from generation_config.json as transformers reads them, the chat template as
transformers applies it, text streamed as it comes, and bad options refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_models import build_model, load_reference, save_checkpoint, save_tiny_tokenizer
from transformers import AutoTokenizer
from transformers.generation import logits_process as hf

import lmconvert
from lmconvert.cli import main
from lmconvert.runtime import sampling
from lmconvert.runtime.generation import TextStream, chat_ids

PROMPT = "The capital of France is"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NEW = 16


def run(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def _checkpoint(directory: Path, template: str | None) -> Path:
    """A tiny perturbed llama with a real BPE tokenizer; with `template`, ChatML's special tokens and
    that chat template. Its generation config is what save_pretrained writes (EOS 2, no sampling)."""
    save_tiny_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    if template is not None:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.chat_template = template
        tokenizer.save_pretrained(directory)
    # a low scale keeps the distribution broad: top-k and top-p then cut something and sampling varies
    return save_checkpoint(build_model("llama", vocab_size=len(tokenizer)), directory)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("plain") / "hf", None)


@pytest.fixture(scope="module")
def chatty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("chatty") / "hf", CHATML)


@pytest.fixture(scope="module")
def models(plain: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    return load_reference(plain), lmconvert.load(plain)


def _prompt(directory: Path, text: str = PROMPT) -> torch.Tensor:
    return torch.tensor([AutoTokenizer.from_pretrained(directory).encode(text)])


def _with_config(src: Path, dst: Path, **settings: object) -> Path:
    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    return dst


# ------------------------------------------------------------------ the processors, op for op

SCORES = torch.randn(3, 300, generator=torch.Generator().manual_seed(0)) * 3
SCORES[0, :7] = SCORES[0, 7]  # ties at a cut


@pytest.mark.parametrize("ours, theirs, cuts", [
    (sampling.temperature(0.7), hf.TemperatureLogitsWarper(0.7), False),
    (sampling.top_k(20), hf.TopKLogitsWarper(20), True),
    (sampling.top_k(1000), hf.TopKLogitsWarper(1000), False),
    (sampling.top_p(0.8), hf.TopPLogitsWarper(0.8), True),
    (sampling.top_p(0.05), hf.TopPLogitsWarper(0.05), True),
    (sampling.min_p(0.1), hf.MinPLogitsWarper(0.1), True),
    (sampling.typical_p(0.6), hf.TypicalLogitsWarper(0.6), True),
    (sampling.epsilon_cutoff(0.01), hf.EpsilonLogitsWarper(0.01), True),
    (sampling.eta_cutoff(0.01), hf.EtaLogitsWarper(0.01), True),
    (sampling.repetition_penalty(1.3), hf.RepetitionPenaltyLogitsProcessor(1.3), False),
], ids=["temperature", "top-k", "top-k-past-vocab", "top-p", "top-p-small", "min-p", "typical-p", "epsilon", "eta",
        "repetition-penalty"])
def test_each_processor_equals_transformers(ours, theirs, cuts: bool) -> None:  # noqa: ANN001
    ids = torch.randint(0, 300, (3, 9), generator=torch.Generator().manual_seed(1))
    expected = theirs(ids, SCORES.clone())
    got = ours(ids, SCORES.clone())
    assert torch.equal(got, expected)
    assert bool(torch.isinf(got).any()) == cuts  # the cut falls inside the vocabulary: the case means something


# ------------------------------------------------------------------ sampled token ids, as transformers'

SETTINGS = [
    {"temperature": 0.8},
    {"top_k": 5},
    {"top_p": 0.7},
    {"temperature": 1.3, "top_k": 30, "top_p": 0.9},
]


@pytest.mark.parametrize("options", SETTINGS, ids=["temperature", "top-k", "top-p", "all-three"])
def test_sampled_ids_equal_transformers(models, plain: Path, options: dict) -> None:  # noqa: ANN001
    reference, ours = models
    ids = _prompt(plain)
    choose = sampling.chooser(sampling.with_options(sampling.Sampling(), options.get("temperature"),
                                                    options.get("top_k"), options.get("top_p")))
    runs = []
    for seed in (0, 1, 2, 3):
        torch.manual_seed(seed)
        with torch.no_grad():
            theirs = reference.generate(ids, max_new_tokens=NEW, do_sample=True, **options)
        torch.manual_seed(seed)
        mine = ours.generate(ids, NEW, eos_token_id=2, choose=choose)
        assert mine.tolist() == theirs.tolist(), (seed, options)
        runs.append(tuple(theirs[0].tolist()))
    with torch.no_grad():
        greedy = tuple(reference.generate(ids, max_new_tokens=NEW, do_sample=False)[0].tolist())
    assert len(set(runs) | {greedy}) > 2  # the seeds sample different tokens: the comparison means something


def test_cli_samples_as_transformers_reads_the_generation_config(plain: Path, tmp_path: Path) -> None:
    """No option given: do_sample, temperature, top_k, top_p, min_p and repetition_penalty come
    from generation_config.json, as transformers' generate takes them; --seed seeds torch."""
    src = _with_config(plain, tmp_path / "hf", do_sample=True, temperature=0.9, top_k=40, top_p=0.95, min_p=0.02,
                       repetition_penalty=1.2)
    reference = load_reference(src)
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = _prompt(src)
    for seed in (5, 6):
        code, out, err = run("generate", src, "--prompt", PROMPT, "--max-new-tokens", NEW, "--seed", seed)
        assert code == 0, err
        torch.manual_seed(seed)
        with torch.no_grad():
            theirs = reference.generate(ids, max_new_tokens=NEW)
        assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"
        assert "note:" not in err  # every setting it holds is applied
        assert f"seed {seed}" in err and "temperature 0.9" in err and "min_p 0.02" in err


def test_an_option_overrides_the_generation_config(plain: Path, tmp_path: Path) -> None:
    src = _with_config(plain, tmp_path / "hf", do_sample=True, temperature=0.9, top_k=40)
    reference = load_reference(src)
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = _prompt(src)
    code, out, err = run("generate", src, "--prompt", PROMPT, "--max-new-tokens", NEW, "--seed", 3, "--top-k", 3)
    assert code == 0, err
    torch.manual_seed(3)
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=NEW, top_k=3)
    assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"


def test_temperature_0_is_greedy_whatever_the_config_says(plain: Path, tmp_path: Path) -> None:
    src = _with_config(plain, tmp_path / "hf", do_sample=True, temperature=0.9, repetition_penalty=1.3)
    reference = load_reference(src)
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = _prompt(src)
    code, out, err = run("generate", src, "--prompt", PROMPT, "--max-new-tokens", NEW, "--temperature", 0,
                         "--top-p", 0.5)
    assert code == 0, err
    with torch.no_grad():  # greedy, and the repetition penalty applies to greedy too
        theirs = reference.generate(ids, max_new_tokens=NEW, do_sample=False)
        unpenalized = reference.generate(ids, max_new_tokens=NEW, do_sample=False, repetition_penalty=1.0)
    assert not torch.equal(theirs, unpenalized)
    assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"
    assert "greedy" in err.splitlines()[-1]


def test_greedy_by_default_equals_transformers(plain: Path) -> None:
    reference = load_reference(plain)
    tokenizer = AutoTokenizer.from_pretrained(plain)
    ids = _prompt(plain)
    code, out, err = run("generate", plain, "--prompt", PROMPT, "--max-new-tokens", NEW)
    assert code == 0, err
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=NEW, do_sample=False)
    assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"
    (line,) = err.splitlines()  # tokens/s, one line
    assert re.fullmatch(r"\d+ new tokens? in [\d.]+ s: [\d.]+ tokens/s \(.*; greedy\)", line), line


def test_settings_transformers_would_apply_and_lmconvert_does_not_are_named(plain: Path, tmp_path: Path) -> None:
    src = _with_config(plain, tmp_path / "hf", no_repeat_ngram_size=3, suppress_tokens=[5, 6])
    code, out, err = run("generate", src, "--prompt", PROMPT, "--max-new-tokens", 4)
    assert code == 0, err
    (note,) = [line for line in err.splitlines() if line.startswith("note:")]
    assert "no_repeat_ngram_size=3" in note and "suppress_tokens=[5, 6]" in note and "does not apply" in note


# ------------------------------------------------------------------ chat


def test_chat_ids_are_the_templates(chatty: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(chatty)
    for system in (None, "Be brief."):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "Hi"}]
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        assert chat_ids(tokenizer, "Hi", system) == expected
        assert expected[-3:] == tokenizer.encode("<|im_start|>assistant\n")[-3:]


def test_chat_is_the_default_with_a_template(chatty: Path) -> None:
    """The reply alone is printed, and it is transformers' greedy reply to the templated prompt."""
    tokenizer = AutoTokenizer.from_pretrained(chatty)
    reference = load_reference(chatty)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=NEW, do_sample=False)
    reply = tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True)
    for flags in ([], ["--chat"]):
        code, out, err = run("generate", chatty, "--prompt", PROMPT, "--system", "Be brief.", "--max-new-tokens", NEW,
                             *flags)
        assert code == 0, err
        assert out == reply + "\n"
    code, out, err = run("generate", chatty, "--prompt", PROMPT, "--max-new-tokens", NEW, "--no-chat")
    assert code == 0, err
    prompt = _prompt(chatty)
    with torch.no_grad():
        plain = reference.generate(prompt, max_new_tokens=NEW, do_sample=False)
    assert out == PROMPT + tokenizer.decode(plain[0, prompt.shape[1]:], skip_special_tokens=True) + "\n"
    assert out != PROMPT + reply + "\n"


# ------------------------------------------------------------------ streaming


def test_stream_prints_pieces_whose_sum_is_the_final_text(chatty: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(chatty)
    ids = tokenizer.encode("The capital of France is Paris. def f(x): return x + 1 \u00e9\u4e2d lmconvert keeps")
    pieces: list[str] = []
    stream = TextStream(tokenizer, pieces.append)
    for token in ids:
        stream.put(token)
    streamed_before_end = len(pieces)
    final = stream.end()
    assert final == tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(pieces) == final
    assert streamed_before_end > len(ids) // 3  # it streamed as tokens came, not all at the end
    assert all("\ufffd" not in piece for piece in pieces)  # a partial character waits for the rest


def test_streamed_cli_output_equals_the_final_text(models, plain: Path) -> None:  # noqa: ANN001
    """What the CLI streamed (sampled, so not greedy's text) is the decoded continuation of
    transformers' ids for the seed."""
    reference, _ = models
    tokenizer = AutoTokenizer.from_pretrained(plain)
    ids = _prompt(plain)
    code, out, err = run("generate", plain, "--prompt", PROMPT, "--max-new-tokens", NEW, "--seed", 11,
                         "--temperature", 1.0)
    assert code == 0, err
    torch.manual_seed(11)
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=NEW, do_sample=True, temperature=1.0)
    assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"


# ------------------------------------------------------------------ bad options


@pytest.mark.parametrize("args, fragment", [
    (["--temperature", "-0.5"], "--temperature -0.5"),
    (["--temperature", "nan"], "--temperature nan"),
    (["--top-p", "0"], "--top-p 0"),
    (["--top-p", "1.5"], "--top-p 1.5"),
    (["--top-k", "-1"], "--top-k -1"),
    (["--system", "Be brief.", "--no-chat"], "--system"),
], ids=["negative-temperature", "nan-temperature", "top-p-0", "top-p-above-1", "negative-top-k", "system-no-chat"])
def test_bad_options_exit_2_in_one_line(plain: Path, args: list[str], fragment: str) -> None:
    code, out, err = run("generate", plain, "--prompt", PROMPT, *args)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("lmconvert: error: ") and fragment in line


def test_system_without_a_template_exits_2(plain: Path) -> None:
    code, out, err = run("generate", plain, "--prompt", PROMPT, "--system", "Be brief.")
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert "--system" in line and "no chat template" in line
    code, _, err = run("generate", plain, "--prompt", PROMPT, "--chat")
    assert code == 2 and "no chat template" in err


def test_bad_sampling_value_in_the_generation_config_is_one_line(plain: Path, tmp_path: Path) -> None:
    src = _with_config(plain, tmp_path / "hf", do_sample=True, top_p=1.5)
    code, out, err = run("generate", src, "--prompt", PROMPT)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert "generation_config.json" in line and "top_p" in line


def test_sampling_settings_without_do_sample_are_greedy_and_said_so(plain: Path, tmp_path: Path) -> None:
    src = _with_config(plain, tmp_path / "hf", temperature=0.6, top_p=0.9)
    reference = load_reference(src)
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = _prompt(src)
    code, out, err = run("generate", src, "--prompt", PROMPT, "--max-new-tokens", NEW)
    assert code == 0, err
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=NEW)
    assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"
    (note,) = [line for line in err.splitlines() if line.startswith("note:")]
    assert "temperature=0.6, top_p=0.9 but not do_sample: greedy" in note


def test_temperature_0_in_the_generation_config_is_greedy(plain: Path, tmp_path: Path) -> None:
    """transformers' TemperatureLogitsWarper refuses 0 (its message: set do_sample=False); lmconvert
    reads it as greedy, as --temperature 0."""
    src = _with_config(plain, tmp_path / "hf", do_sample=True, temperature=0, top_k=5)
    reference = load_reference(src)
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = _prompt(src)
    code, out, err = run("generate", src, "--prompt", PROMPT, "--max-new-tokens", NEW, "--seed", 1)
    assert code == 0, err
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=NEW, do_sample=False)
    assert out == PROMPT + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True) + "\n"
    assert "greedy" in err.splitlines()[-1]
    (note,) = [line for line in err.splitlines() if line.startswith("note:")]
    assert "top_k=5 but temperature 0: greedy" in note
