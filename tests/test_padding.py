"""Left-padded batches against transformers, one real family per position scheme: rows of different
lengths padded on the left (pad id 0) with an attention mask, through the forward pass, the KV cache
and greedy `generate`. Padding interacts with each scheme its own way: RoPE and absolute positions
are numbered from each row's first token by generate (and by OPT's forward), BLOOM and Falcon-RW
count ALiBi keys from it, MPT's ALiBi is a distance, NoPE layers only mask.

Padding query positions attend to no key at all; transformers' outputs there mean nothing (eager:
a uniform average, SDPA: zeros), so logits are compared at the real tokens only."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from family_specs import FP32_TOL, SPECS
from hf_models import build_model, load_reference, save_checkpoint, save_tiny_tokenizer
from test_mla import VARIANTS as MLA_VARIANTS
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import lmconvert
from lmconvert.arch.context import mask_positions
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.errors import InputError
from lmconvert.formats.source import Loadable
from lmconvert.verify import golden as golden_file
from lmconvert.verify.prompts import padded_lengths, prompt_batch
from lmconvert.verify.run import judge, record_reference, run_ours, verify

# name -> (model_type, kwargs): the scheme each one stands for
CASES: dict[str, tuple[str, dict]] = {
    "llama": (SPECS["llama"].model_type, SPECS["llama"].kwargs),  # RoPE (llama3 scaling)
    "mistral": (SPECS["mistral"].model_type, SPECS["mistral"].kwargs),  # RoPE, sliding window
    "smollm3": (SPECS["smollm3"].model_type, SPECS["smollm3"].kwargs),  # NoPE every other layer
    "cohere2": (SPECS["cohere2"].model_type, SPECS["cohere2"].kwargs),  # sliding RoPE, global NoPE
    "falcon": (SPECS["falcon"].model_type, SPECS["falcon"].kwargs),  # RoPE
    "gpt2": (SPECS["gpt2"].model_type, SPECS["gpt2"].kwargs),  # learned
    "opt": (SPECS["opt"].model_type, SPECS["opt"].kwargs),  # learned, numbered from the mask
    "xglm": (SPECS["xglm"].model_type, SPECS["xglm"].kwargs),  # sinusoidal (fairseq)
    "bloom": (SPECS["bloom"].model_type, SPECS["bloom"].kwargs),  # ALiBi from the mask
    "mpt": (SPECS["mpt"].model_type, SPECS["mpt"].kwargs),  # ALiBi as a distance
    "falcon-rw": ("falcon", dict(num_attention_heads=6, hidden_size=72, parallel_attn=False, multi_query=False,
                                 bias=True, alibi=True, eos_token_id=1)),  # ALiBi from the mask, bf16 slopes
    "deepseek_v3": MLA_VARIANTS["q_lora_interleaved"],  # RoPE inside latent attention (MLA)
    "mixtral": (SPECS["mixtral"].model_type, SPECS["mixtral"].kwargs),  # RoPE, a mixture of experts
    # chunks counted from each row's first real token; the NoPE layers' temperature from the cache index
    "llama4_text": (SPECS["llama4_text"].model_type, SPECS["llama4_text"].kwargs),
}
ALL_WINDOWED = {"mistral", "mixtral"}
# fp32 rounding moves their cached decoding by more than 1e-5 from a full forward (on both sides, as
# test_families.py's cached test says of every family): compared with transformers' own cached decoding, step by
# step (its chunked layers keep a sliding cache of the chunk size, ours every key). Llama 4: four layers of
# renormalised, temperature-scaled queries and top-3 experts. SmolLM3: its sliding layers decode over the keys the
# window still sees, as transformers' sliding cache holds them (arch/attention.py), so its steps round as
# transformers' cached decoding does (1.04e-5 from a full forward)
AGAINST_CACHED = {"llama4_text", "smollm3"}
SEQ, LENGTHS, NEW = 28, (28, 19, 11), 8  # every row longer than the windows (4)


def padded_batch(vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of LENGTHS tokens (ids >= 3, clear of pad/bos/eos), left-padded with 0 to SEQ."""
    ids = torch.randint(3, vocab, (len(LENGTHS), SEQ), generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(len(LENGTHS), SEQ, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        mask[row, SEQ - n:] = 1
    return ids.masked_fill(mask == 0, 0), mask


IDS, MASK = padded_batch()
REAL = MASK.bool()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            model_type, kwargs = CASES[name]
            made[name] = save_checkpoint(build_model(model_type, **kwargs), tmp_path_factory.mktemp(name))
        return made[name]

    return get


def reference(path: Path, attention: str) -> torch.nn.Module:
    """transformers' model with the same attention implementation, where it has one (Falcon-RW's
    eager and SDPA paths round the same ALiBi each their own way); BLOOM, MPT, GPT-Neo and XGLM have
    only their own (eager) attention."""
    model = load_reference(path)
    if attention == "eager" or not model._supports_sdpa:
        return model
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention).eval()


def max_abs_real(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float())[REAL].abs().max())


@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_padded_forward(name: str, checkpoint: Callable[[str], Path]) -> None:
    """`model(ids, attention_mask=mask)` as transformers computes it, eager and SDPA; the same ids
    without the mask are far off, so the mask is what makes them agree."""
    path = checkpoint(name)
    for attention in ("eager", "sdpa"):
        theirs = reference(path, attention)(IDS, attention_mask=MASK).logits
        ours = lmconvert.load(path, attention=attention)
        assert max_abs_real(ours(IDS, attention_mask=MASK), theirs) <= FP32_TOL
    assert max_abs_real(ours(IDS), theirs) > 1e-2


POSITIONED = [name for name in CASES if name not in ("bloom", "mpt")]  # whose forward takes position_ids


@pytest.mark.parametrize("name", POSITIONED)
@torch.no_grad()
def test_padded_forward_with_positions(name: str, checkpoint: Callable[[str], Path]) -> None:
    """Positions numbered from each row's first token, as generate passes them (`position_ids`)."""
    path = checkpoint(name)
    reference = load_reference(path)
    assert "position_ids" in inspect.signature(reference.forward).parameters
    positions = mask_positions(MASK)
    theirs = reference(IDS, attention_mask=MASK, position_ids=positions).logits
    ours = lmconvert.load(path, attention="eager")
    assert max_abs_real(ours(IDS, attention_mask=MASK, positions=positions), theirs) <= FP32_TOL


@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_padded_cache(name: str, checkpoint: Callable[[str], Path]) -> None:
    """A padded prefill, then one token at a time with the mask grown to cover the cache: every
    step's logits equal transformers' full forward over the padded batch."""
    path = checkpoint(name)
    prefill = 20
    if name in AGAINST_CACHED:  # transformers' own padded decoding, the same steps over its cache
        reference = load_reference(path)
        kept = DynamicCache(config=reference.config)
        theirs = torch.cat([reference(IDS[:, :prefill], attention_mask=MASK[:, :prefill], cache=kept).logits,
                            *(reference(IDS[:, t:t + 1], attention_mask=MASK[:, :t + 1], cache=kept).logits
                              for t in range(prefill, SEQ))], dim=1)
    else:
        theirs = load_reference(path)(IDS, attention_mask=MASK).logits
    ours = lmconvert.load(path, attention="eager")
    cache = ours.new_cache()
    steps = [ours(IDS[:, :prefill], cache=cache, attention_mask=MASK[:, :prefill])]
    for t in range(prefill, SEQ):
        steps.append(ours(IDS[:, t:t + 1], cache=cache, attention_mask=MASK[:, :t + 1]))
    assert max_abs_real(torch.cat(steps, dim=1), theirs) <= FP32_TOL


@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_padded_generate(name: str, checkpoint: Callable[[str], Path]) -> None:
    """Greedy continuations of a left-padded batch equal transformers' generate token for token;
    without the mask they do not (except where a 4-token window on every layer keeps the last
    token's receptive field, two layers deep, away from the padding)."""
    path = checkpoint(name)
    reference = load_reference(path)
    eos = reference.generation_config.eos_token_id
    theirs = reference.generate(IDS, attention_mask=MASK, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                                eos_token_id=eos)
    ours = lmconvert.load(path, attention="eager")
    assert torch.equal(ours.generate(IDS, NEW, eos_token_id=eos, pad_token_id=0, attention_mask=MASK), theirs)
    if name not in ALL_WINDOWED:
        assert not torch.equal(ours.generate(IDS, NEW, eos_token_id=eos, pad_token_id=0), theirs)


@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
@pytest.mark.bitexact
def test_padded_bf16_bit_exact(name: str, tmp_path: Path) -> None:
    """bf16 logits of the padded batch equal transformers' bit for bit at the real tokens. This is
    where each scheme's own numbering shows: softmax ignores a per-row shift of ALiBi's keys in exact
    arithmetic, so BLOOM counting keys from the sequence start rather than the row's first token
    passes fp32 and fails here; and a padding query's all-masked row must stay finite in bf16."""
    model_type, kwargs = CASES[name]
    path = save_checkpoint(build_model(model_type, **kwargs), tmp_path / name, torch.bfloat16)
    # transformers' default experts (grouped_mm), whose order ours follow by default
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager").eval()
    theirs = reference(IDS, attention_mask=MASK).logits
    ours = lmconvert.load(path, dtype=torch.bfloat16, attention="eager")(IDS, attention_mask=MASK)
    assert torch.equal(ours[REAL], theirs[REAL])


# ------------------------------------------------------------------------------------------------ verify --padded
@pytest.mark.parametrize("name", ["llama", "opt", "bloom"])
def test_verify_padded(name: str, checkpoint: Callable[[str], Path]) -> None:
    """`verify --padded` runs both sides on left-padded rows of different lengths under the mask and
    agrees to the bit in fp32; our side run without the mask on the same record fails the logits."""
    path = checkpoint(name)
    report = verify(path, padded=True, seq_len=24, batch=3, generate=4)
    assert report.passed and report.logits["max_abs"] <= FP32_TOL
    assert "left-padded rows of 24, 18, 12 tokens" in report.tokens
    expected = record_reference(path, seq_len=24, batch=3, generate=0, padded=True)
    assert expected.attention_mask is not None and expected.attention_mask.sum(1).tolist() == [24, 18, 12]
    unmasked = replace(expected, attention_mask=None)
    with open_checkpoint(path) as ckpt:
        trace, _ = run_ours(ckpt, unmasked, "cpu", stream=False)
    assert not judge(path, expected, trace, None, "cpu", False, None, None).logits_passed


def test_verify_padded_golden_and_streamed(checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The mask travels in the golden file (checked without transformers) and through the streamed
    decoder (--max-memory); a golden file brings its own batch, so --padded beside it is refused."""
    path = checkpoint("falcon-rw")
    golden = tmp_path / "padded.golden"
    assert verify(path, padded=True, seq_len=20, batch=2, generate=2, save_golden=golden).passed
    assert golden_file.load(golden).attention_mask.sum(1).tolist() == [20, 10]
    assert verify(path, golden=golden).passed
    streamed = verify(path, padded=True, seq_len=20, batch=2, generate=2, max_memory=10 ** 9)
    assert streamed.passed and streamed.logits["max_abs"] <= FP32_TOL
    with pytest.raises(InputError, match="--padded"):
        verify(path, golden=golden, padded=True)


def test_padded_prompts_start_each_row_with_bos(tmp_path: Path) -> None:
    """Real text rows, each left-padded with 0 and starting with the tokenizer's BOS where its
    real tokens begin; the unpadded batch is unchanged by the option."""
    vocab = save_tiny_tokenizer(tmp_path)
    ids, mask = prompt_batch(Loadable(tmp_path), vocab, 3, 16, padded_lengths(3, 16))
    assert mask.sum(1).tolist() == [16, 12, 8]
    bos = AutoTokenizer.from_pretrained(tmp_path).bos_token_id
    for row, n in zip(ids.tolist(), (16, 12, 8), strict=True):
        assert row[:16 - n] == [0] * (16 - n) and row[16 - n] == bos
    plain, none = prompt_batch(Loadable(tmp_path), vocab, 3, 16)
    assert none is None and plain[:, 0].tolist() == [bos] * 3


def test_mask_and_positions_of_the_wrong_shape_are_refused(checkpoint: Callable[[str], Path]) -> None:
    """A mask must cover the cached tokens too, as transformers' does; saying so beats a broadcast error."""
    model = lmconvert.load(checkpoint("llama"))
    cache = model.new_cache()
    model(IDS[:, :20], cache=cache, attention_mask=MASK[:, :20])
    with pytest.raises(ValueError, match=r"attention_mask has shape \[3, 1\].*\[3, 21\]"):
        model(IDS[:, 20:21], cache=cache, attention_mask=MASK[:, 20:21])
    with pytest.raises(ValueError, match=r"positions has shape \[3, 20\]"):
        model(IDS[:, :10], positions=mask_positions(MASK)[:, :20])


OTHERS = [name for name in SPECS if name not in CASES]  # every other family: the same, in brief


@pytest.mark.parametrize("name", OTHERS)
@torch.no_grad()
def test_padded_forward_and_generate_of_every_other_family(name: str, tmp_path: Path) -> None:
    """Each family's own variants (soft-caps, QK norms, longrope, parallel blocks, experts) under the
    same padded batch: forward at the real tokens and greedy generate, against transformers."""
    spec = SPECS[name]
    path = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path / name)
    reference = load_reference(path)
    ours = lmconvert.load(path, attention="eager")
    assert max_abs_real(ours(IDS, attention_mask=MASK), reference(IDS, attention_mask=MASK).logits) <= FP32_TOL
    eos = reference.generation_config.eos_token_id
    theirs = reference.generate(IDS, attention_mask=MASK, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                                eos_token_id=eos)
    assert torch.equal(ours.generate(IDS, NEW, eos_token_id=eos, pad_token_id=0, attention_mask=MASK), theirs)
