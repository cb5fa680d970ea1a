"""LLaMA end to end: fp32 parity on every variant the mapping covers, bf16 faithfulness, bit-exact
round trips, the KV cache, both config styles, and the loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_models import (
    build_model,
    cached_logits,
    incremental,
    load_reference,
    make_checkpoint,
    save_checkpoint,
    token_batch,
)
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import lmconvert
from lmconvert.convert import to_canonical, to_hf

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
VARIANTS = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "biases": {"attention_bias": True, "mlp_bias": True},
    "head_dim": {"head_dim": 32},
    "tied": {"tie_word_embeddings": True},
    "llama3": {"rope_parameters": LLAMA3},
    "linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    "dynamic": {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                "max_position_embeddings": 32},  # the 48-token batch grows the base
    "yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32}},
}


def tensors_of(directory: Path) -> dict[str, tuple[torch.dtype, bytes]]:
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = (t.dtype, t.contiguous().view(torch.uint8).numpy().tobytes())
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_fp32_parity(tmp_path: Path, variant: str, attention: str) -> None:
    """Each of our attention backends against the same transformers implementation."""
    hf_dir = make_checkpoint(tmp_path / "hf", **VARIANTS[variant])
    ids = token_batch(seq=48)
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation=attention)(ids).logits
        ours = lmconvert.load(hf_dir, attention=attention)(ids)
    assert ref.abs().max() > 1.0  # the perturbed model is far from init
    assert (ours - ref).abs().max() <= 1e-5


def test_canonical_directory_matches_hf_directory(tmp_path: Path) -> None:
    hf_dir = make_checkpoint(tmp_path / "hf", **VARIANTS["biases"])
    to_canonical(hf_dir, tmp_path / "can")
    ids = token_batch()
    with torch.no_grad():
        assert torch.equal(lmconvert.load(tmp_path / "can")(ids), lmconvert.load(hf_dir)(ids))


def test_bf16_faithfulness(tmp_path: Path) -> None:
    """Both sides load the same bf16 checkpoint; each is measured against transformers in fp32."""
    hf_dir = make_checkpoint(tmp_path / "hf", dtype=torch.bfloat16, **VARIANTS["llama3"])
    ids = token_batch(seq=48)
    with torch.no_grad():
        exact = load_reference(hf_dir, torch.float32)(ids).logits
        theirs = load_reference(hf_dir, torch.bfloat16)(ids).logits.float()
        ours = lmconvert.load(hf_dir, dtype=torch.bfloat16, attention="eager")(ids).float()
    their_error = (theirs - exact).abs().mean()
    our_error = (ours - exact).abs().mean()
    assert their_error > 0
    assert our_error <= 1.25 * their_error


@pytest.mark.parametrize("variant", ["gqa", "tied", "biases"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(tmp_path: Path, variant: str, dtype: torch.dtype) -> None:
    hf_dir = make_checkpoint(tmp_path / "hf", dtype=dtype, **VARIANTS[variant])
    to_canonical(hf_dir, tmp_path / "can")
    to_hf(tmp_path / "can", tmp_path / "back")
    assert tensors_of(tmp_path / "back") == tensors_of(hf_dir)
    ids = token_batch()
    with torch.no_grad():
        assert torch.equal(load_reference(tmp_path / "back")(ids).logits, load_reference(hf_dir)(ids).logits)


def test_sharded_source_and_output(tmp_path: Path) -> None:
    model = build_model("llama")
    hf_dir = save_checkpoint(model, tmp_path / "hf", max_shard_size="40KB")
    assert (hf_dir / "model.safetensors.index.json").exists()
    to_canonical(hf_dir, tmp_path / "can", max_shard_bytes=50_000)
    assert len(list((tmp_path / "can").glob("model-*-of-*.safetensors"))) > 1
    to_hf(tmp_path / "can", tmp_path / "back", max_shard_bytes=50_000)
    assert tensors_of(tmp_path / "back") == tensors_of(hf_dir)
    ids = token_batch()
    with torch.no_grad():
        assert torch.equal(load_reference(tmp_path / "back")(ids).logits, model(ids).logits)


@pytest.mark.parametrize("variant", ["gqa", "llama3", "dynamic"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_cached_decoding_equals_full_forward(tmp_path: Path, variant: str, attention: str) -> None:
    """Our cached logits match transformers' cached logits; cached equals full in float64, where
    fp32 rounding (which moves transformers' own cache by ~1e-5 too) cannot hide an error."""
    hf_dir = make_checkpoint(tmp_path / "hf", **VARIANTS[variant])
    ours = lmconvert.load(hf_dir, attention=attention)
    theirs = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation=attention)
    ids = token_batch(seq=48)
    cache = ours.new_cache()
    with torch.no_grad():
        our_steps = incremental(lambda chunk: ours(chunk, cache=cache), ids, 8)
        their_steps = cached_logits(theirs, ids, 8)
    assert (our_steps - their_steps).abs().max() <= 1e-5
    if variant == "dynamic":  # by design: keys cached before the base grew keep the old rotation
        return
    exact = lmconvert.load(hf_dir, dtype=torch.float64, attention=attention)
    cache = exact.new_cache()
    with torch.no_grad():
        assert (incremental(lambda chunk: exact(chunk, cache=cache), ids, 8) - exact(ids)).abs().max() <= 1e-5


def test_greedy_generation_matches_transformers(tmp_path: Path) -> None:
    hf_dir = make_checkpoint(tmp_path / "hf")
    prompt = token_batch(batch=1, seq=5)
    with torch.no_grad():
        theirs = load_reference(hf_dir).generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None,
                                                 pad_token_id=0)
        ours = lmconvert.load(hf_dir).generate(prompt, 20)
    assert torch.equal(ours, theirs)


HUB_STYLE = {  # a config.json as LLaMA 3.2 ships it on the Hub, in the transformers 4 style
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 500000.0, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 16, "rope_type": "llama3"},
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}


def test_both_config_styles(tmp_path: Path) -> None:
    old = tmp_path / "old"
    model = build_model("llama", tie_word_embeddings=True, rms_norm_eps=1e-5,
                        rope_parameters={**LLAMA3})
    save_checkpoint(model, old)
    new_config = json.loads((old / "config.json").read_text())
    assert "rope_parameters" in new_config
    (old / "config.json").write_text(json.dumps(HUB_STYLE))
    from lmconvert.mappings import family_for
    assert family_for("llama").arch_config(HUB_STYLE) == family_for("llama").arch_config(new_config)
    ids = token_batch(seq=48)
    with torch.no_grad():
        ref = load_reference(old)(ids).logits
        assert (lmconvert.load(old)(ids) - ref).abs().max() <= 1e-5
        assert (ref - model(ids).logits).abs().max() == 0  # transformers read the old style the same way


def test_loss_matches_transformers(tmp_path: Path) -> None:
    model = build_model("llama")
    hf_dir = save_checkpoint(model, tmp_path / "hf")
    ids = token_batch(seq=32)
    labels = ids.clone()
    labels[:, :5] = -100
    with torch.no_grad():
        theirs = model(ids, labels=labels).loss
        _, ours = lmconvert.load(hf_dir)(ids, labels=labels)
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pad", [None, 3])
def test_batched_generation_pads_finished_rows_as_transformers(tmp_path: Path, pad: int | None) -> None:
    """A row that emitted EOS continues with the pad id (the first EOS id by default) while the
    others run on; generation stops when every row has finished, or at the limit."""
    hf_dir = make_checkpoint(tmp_path / "hf")
    prompt = token_batch(batch=3, seq=5)
    reference, ours = load_reference(hf_dir), lmconvert.load(hf_dir)
    with torch.no_grad():
        free = reference.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        new = free[:, prompt.shape[1]:]
        # EOS ids that end row 0 early and no other row before it: row 0's third token, and one never produced
        eos = [int(new[0, 2]), int(new.max()) + 1]
        assert not (new[1:, :3] == eos[0]).any(), "pick another prompt: EOS would end the other rows as early"
        theirs = reference.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                                    pad_token_id=eos[0] if pad is None else pad)
        mine = ours.generate(prompt, 12, eos_token_id=eos, pad_token_id=pad)
    assert torch.equal(mine, theirs)
    assert (mine[0, prompt.shape[1] + 3:] == (eos[0] if pad is None else pad)).all()
