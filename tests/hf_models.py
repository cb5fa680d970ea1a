"""Tiny random transformers checkpoints, built at test time with transformers' own classes.

Every parameter is perturbed away from its init, so a missing bias, a wrong norm offset or a
swapped tensor changes the logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)


def perturb(model: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * scale)
        for name, b in model.named_buffers():  # Gemma 4's per-layer output scalar: a buffer, stored in checkpoints
            if name.endswith(".layer_scalar"):
                b.add_(torch.randn(b.shape, generator=generator).to(b.dtype) * scale)


def build_model(model_type: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    perturb(model, seed)
    return model.eval()


def save_checkpoint(model: torch.nn.Module, directory: Path, dtype: torch.dtype = torch.float32,
                    **save_kwargs: Any) -> Path:
    model.to(dtype).save_pretrained(directory, **save_kwargs)
    model.to(torch.float32)
    return directory


def edited_weights(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy of a checkpoint directory whose one model.safetensors went through `edit` (in place)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def make_checkpoint(directory: Path, model_type: str = "llama", dtype: torch.dtype = torch.float32, seed: int = 0,
                    **overrides: Any) -> Path:
    return save_checkpoint(build_model(model_type, seed, **overrides), directory, dtype)


@torch.no_grad()
def module_outputs(model: torch.nn.Module, path: str, ids: torch.Tensor) -> torch.Tensor:
    """The output of one module, hooked independently of lmconvert's recorder."""
    seen = []
    handle = model.get_submodule(path).register_forward_hook(lambda _m, _a, out: seen.append(out))
    model(ids)
    handle.remove()
    return seen[0].float()


def load_reference(directory: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="eager").eval()


def token_batch(vocab: int = 128, batch: int = 2, seq: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def save_tiny_tokenizer(directory: Path, vocab_size: int = 300) -> int:
    """A real byte-level BPE tokenizer trained on a few lines, saved the way the Hub ships one;
    returns its length, which the model's vocab must cover."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = ["The capital of France is Paris.", "def f(x): return x + 1", "lmconvert keeps logits equal."] * 4
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    return len(fast)


def incremental(step, ids: torch.Tensor, prefill: int) -> torch.Tensor:  # noqa: ANN001
    """Logits from a prefill of `prefill` tokens, then one token at a time."""
    return torch.cat([step(ids[:, :prefill])] + [step(ids[:, i:i + 1]) for i in range(prefill, ids.shape[1])], 1)


@torch.no_grad()
def cached_logits(model: torch.nn.Module, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """transformers' own cached decoding, for comparison with ours; a model transformers keeps no
    cache for (GPT's OpenAIGPTLMHeadModel) runs each step over the whole prefix, as its generate does."""
    state: dict[str, Any] = {"seen": ids[:, :0]}
    # the positions of the new tokens, as generate passes them: Bamba's forward, given none, numbers them from 0
    positions = "position_ids" in inspect.signature(model.forward).parameters

    def step(chunk: torch.Tensor) -> torch.Tensor:
        past = state["seen"].shape[1]
        state["seen"] = torch.cat([state["seen"], chunk], 1)
        if state.get("uncached"):
            return model(state["seen"]).logits[:, -chunk.shape[1]:]
        where = {"position_ids": torch.arange(past, past + chunk.shape[1])[None]} if positions else {}
        out = model(chunk, cache=state.get("cache"), use_cache=True, **where)
        state["uncached"] = not hasattr(out, "cache")
        state["cache"] = getattr(out, "cache", None)
        return out.logits

    return incremental(step, ids, prefill)


def check_cached_decoding(src: Path, ids: torch.Tensor, prefill: int, attention: str,
                          reference_attention: str | None = None, tol: float = 1e-5) -> None:
    """Our decoding over the KV cache (a prefill, then one token at a time) equals transformers'
    cached decoding, and, in float64 where rounding cannot hide a wrong position or mask, our own
    full forward. transformers' parameters left at the file's alignment are copied first, as verify does
    (verify.reference.aligned)."""
    import lmconvert
    from lmconvert.verify.reference import aligned

    def worst(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).abs().max())

    model = lmconvert.load(src, attention=attention)
    theirs = AutoModelForCausalLM.from_pretrained(src, attn_implementation=reference_attention or attention)
    theirs = aligned(theirs)
    cache = model.new_cache()
    with torch.no_grad():
        ours = incremental(lambda chunk: model(chunk, cache=cache), ids, prefill)
        reference = cached_logits(theirs, ids, prefill)
    assert cache.length == ids.shape[1]
    assert worst(ours, reference) <= tol
    exact = lmconvert.load(src, dtype=torch.float64, attention=attention)
    cache = exact.new_cache()
    with torch.no_grad():
        assert worst(incremental(lambda chunk: exact(chunk, cache=cache), ids, prefill), exact(ids)) <= tol


def check_parity(src: Path, ids: torch.Tensor, work: Path, attention: str, tol: float = 1e-5) -> None:
    """Our logits equal transformers' (same attention implementation) within `tol`, straight from
    the HF directory and through a canonical one written under `work`."""
    import lmconvert
    from lmconvert.convert import to_canonical

    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(src, attn_implementation=attention)(ids).logits
        assert float((lmconvert.load(src, attention=attention)(ids) - ref).abs().max()) <= tol
        to_canonical(src, work / "canon")
        assert float((lmconvert.load(work / "canon", attention=attention)(ids) - ref).abs().max()) <= tol


def check_streamed_verify(canonical: Path, work: Path) -> int:
    """`verify --max-memory 20KB` streams both sides one block at a time and agrees exactly at every
    point; returns the number of points compared."""
    import json

    from click.testing import CliRunner

    from lmconvert.cli import main

    result = CliRunner().invoke(main, ["verify", str(canonical), "--max-memory", "20KB", "--seq-len", "16",
                                       "--generate", "4", "--json", str(work / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((work / "r.json").read_text())
    assert report["streamed"] and report["max_abs"] == 0.0
    assert all(p["max_abs"] == 0.0 for p in report["points"])
    return len(report["points"])


def tensors_of(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().flatten().view(torch.uint8)


def check_round_trip(src: Path, work: Path, architecture: str) -> dict[str, Any]:
    """HF -> canonical -> HF (into `work / "back"`) gives back every tensor byte for byte, in its
    dtype and shape, and a config.json naming `architecture`, which is returned."""
    import json

    from lmconvert.convert import to_canonical, to_hf

    to_canonical(src, work / "canon")
    to_hf(work / "canon", work / "back")
    before, after = tensors_of(src), tensors_of(work / "back")
    assert sorted(before) == sorted(after)
    for name, t in before.items():
        assert after[name].dtype == t.dtype and after[name].shape == t.shape, name
        assert torch.equal(raw_bytes(after[name]), raw_bytes(t)), name
    config = json.loads((work / "back" / "config.json").read_text())
    assert config["architectures"] == [architecture]
    return config
