"""Agreement beyond one forward: greedy generation through the KV cache against transformers'
own `generate`, distribution figures checked against independent formulas, and real prompts
through the checkpoint's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hf_models import build_model, load_reference, save_checkpoint, save_tiny_tokenizer

import lmconvert
from lmconvert.verify.agreement import compare_generation, greedy, logit_stats
from lmconvert.verify.prompts import TEXTS
from lmconvert.verify.reference import reference_greedy
from lmconvert.verify.run import verify
from lmconvert.verify.tolerance import Tolerance

FP32 = Tolerance.for_dtype("float32")


@pytest.fixture(scope="module")
def with_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tok") / "hf"
    vocab = save_tiny_tokenizer(directory)
    return save_checkpoint(build_model("qwen3", vocab_size=vocab, head_dim=16), directory)


def test_greedy_is_decoder_generate_and_transformers_generate(with_tokenizer: Path) -> None:
    ours = lmconvert.load(with_tokenizer, attention="eager")
    prompt = torch.randint(0, 300, (1, 7), generator=torch.Generator().manual_seed(3))
    tokens, steps = greedy(ours, prompt, 20)
    assert torch.equal(tokens, ours.generate(prompt, 20))
    theirs = reference_greedy(load_reference(with_tokenizer), prompt, 20)
    assert torch.equal(tokens, theirs[0])
    # generate() computes the head on the last position only and cached steps round differently on
    # each side: the step logits agree to ~1e-6 in fp32, not bit for bit
    assert float((steps - theirs[1]).abs().max()) <= 1e-5
    result = compare_generation((tokens, steps), theirs, 7, FP32)
    assert result.first_difference is None and result.passed and result.step_max_abs <= 1e-5


def test_reference_generation_is_pure_argmax(tmp_path: Path) -> None:
    """generate() would mask a prompt token equal to the pad id and apply the checkpoint's own
    generation settings; transformers' greedy reference does neither."""
    hf = save_checkpoint(build_model("llama"), tmp_path / "hf")
    settings = json.loads((hf / "generation_config.json").read_text())
    settings.update(repetition_penalty=3.0, no_repeat_ngram_size=1, suppress_tokens=[5, 6, 7], do_sample=True)
    (hf / "generation_config.json").write_text(json.dumps(settings))
    prompt = torch.tensor([[5, 0, 17, 0, 44, 5]])  # pad_token_id is 0
    theirs = reference_greedy(load_reference(hf), prompt, 24)
    ours = greedy(lmconvert.load(hf, attention="eager"), prompt, 24)
    assert torch.equal(ours[0], theirs[0]) and float((ours[1] - theirs[1]).abs().max()) <= 1e-5


def test_first_difference_and_ties() -> None:
    ref_logits = torch.zeros(1, 3, 5)
    ref_logits[0, 0, 3], ref_logits[0, 1, 4], ref_logits[0, 2, 1] = 1.0, 1.0, 1.0
    ref = (torch.tensor([[1, 2, 3, 4, 1]]), ref_logits)
    ours_logits = ref_logits.clone()
    ours_logits[0, 1, 2] = 2.0  # ours prefers 2 at the second step; the reference saw a clear 4
    ours = (torch.tensor([[1, 2, 3, 2, 0]]), ours_logits)
    result = compare_generation(ours, ref, 2, FP32)
    assert result.first_difference == 1 and not result.tie and result.passed is False
    assert "position 3" in result.summary()
    tied = ref_logits.clone()
    tied[0, 1, 2] = 1.0  # the reference itself cannot tell 2 from 4
    result = compare_generation(ours, (ref[0], tied), 2, FP32)
    assert result.tie and result.first_difference == 1
    result = compare_generation(ours, ref, 2, Tolerance.for_dtype("bfloat16"))
    assert result.passed is None  # low precision: reported, not judged


def test_logit_stats_against_independent_formulas() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 9, 40, generator=g)
    ours = ref + 0.3 * torch.randn(2, 9, 40, generator=g)
    stats = logit_stats(ours, ref)
    kl = F.kl_div(F.log_softmax(ours, -1), F.log_softmax(ref, -1), log_target=True, reduction="none").sum(-1).mean()
    assert stats["kl"] == pytest.approx(float(kl), rel=1e-5)
    top1 = sum(int(ours[b, t].argmax() == ref[b, t].argmax()) for b in range(2) for t in range(9)) / 18
    assert stats["top1"] == pytest.approx(top1)
    top5 = sum(len(set(ours[b, t].topk(5).indices.tolist()) & set(ref[b, t].topk(5).indices.tolist())) / 5
               for b in range(2) for t in range(9)) / 18
    assert stats["top5"] == pytest.approx(top5)
    assert stats["max_abs"] == float((ours - ref).abs().max())


def test_real_prompts_through_the_checkpoint_tokenizer(with_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    report = verify(with_tokenizer, seq_len=24, generate=12)
    assert report.passed and report.tokens.startswith("prompts")
    assert report.generation is not None and report.generation.new_tokens == 12
    tokenizer = AutoTokenizer.from_pretrained(with_tokenizer)
    stream = tokenizer.encode("\n\n".join(TEXTS), add_special_tokens=False)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    first = bos + stream[:24 - len(bos)]
    assert report.generation.prompt_tokens == 24
    # the generated continuation starts from that text; the first row is the prompt
    ours = lmconvert.load(with_tokenizer, attention="eager")
    assert greedy(ours, torch.tensor([first]), 12)[0][0, 24:].tolist() == report.generation.ours


def test_random_ids_without_a_tokenizer(tmp_path: Path) -> None:
    hf = save_checkpoint(build_model("llama"), tmp_path / "hf")
    report = verify(hf, seq_len=12, generate=0)
    assert report.tokens == "random ids (no tokenizer files)" and report.generation is None and report.passed
