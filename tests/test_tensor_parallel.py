"""Tensor parallelism on CPU with gloo: 2 and 4 ranks spawned here, on perturbed tiny checkpoints of a GQA
family (LLaMA, with biases: KV heads split; and with 4 ranks on 2 KV heads, each shared by two ranks), an
MQA family (Falcon-7B's layout: its one KV head kept by every rank) and an MLA family (DeepSeek-V3, dense,
and with a layer of experts).
Each rank's logits, from a full forward and from cached decoding, and every point verify traces (the ones
computed in slices gathered whole) equal the single-process ones; each
rank holds about 1/N of the weights, and reads no tensor larger than its slice (both measured on the
rank). One spawn per rank count runs every model, since starting the processes costs more than the
models."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from family_specs import SPECS
from hf_models import build_model, save_checkpoint, token_batch
from tp_ranks import cannot_spawn, incremental, run_ranks

import lmconvert
from lmconvert.arch import ConfigError
from lmconvert.convert.ingest import to_canonical
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.runtime.tensor_parallel import local_bytes, make_plan, refusals
from lmconvert.verify.trace import our_trace

IDS = token_batch(seq=20)
# the family specs whose tiny model cannot split over 2 and 4 ranks, and the first reason why
REFUSED_FAMILIES = {name: spec.tp_refusal for name, spec in SPECS.items() if spec.tp_refusal}
PREFILL = 12
TOL = 1e-5
MLA = dict(num_key_value_heads=4, first_k_dense_replace=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
           qk_rope_head_dim=8, v_head_dim=10, attention_bias=True, rope_interleave=True)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-gqa": ("llama", dict(attention_bias=True, mlp_bias=True, num_attention_heads=8, num_key_value_heads=4,
                                head_dim=8, tie_word_embeddings=False)),
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "qwen3-qk-norm": ("qwen3", SPECS["qwen3"].kwargs),  # each head's q and k RMS-normed, a sliding window
    "cohere-per-head-norm": ("cohere", SPECS["cohere"].kwargs),  # a QK-norm weight row per head: split with them
    "falcon-7b-mqa": ("falcon", dict(eos_token_id=1)),  # multi_query: one KV head
    "gpt2-conv1d": ("gpt2", SPECS["gpt2"].kwargs),  # Conv1D linears: addmm over each rank's [in, out] slice
    "deepseek_v3-mla": ("deepseek_v3", MLA),  # first_k_dense_replace covers both layers: dense
    # a layer of experts after a dense one: each expert split like the MLP, sigmoid router over groups
    "deepseek_v3-moe": ("deepseek_v3", dict(MLA, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
                                            moe_intermediate_size=24, n_shared_experts=2, routed_scaling_factor=2.5,
                                            n_group=4, topk_group=2, norm_topk_prob=True)),
}


pytestmark = pytest.mark.skipif(cannot_spawn() is not None, reason=str(cannot_spawn()))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model canonical (read by slices), and LLaMA also as HF safetensors (plain renames: slices too)."""
    made = {}
    for name, (model_type, kwargs) in MODELS.items():
        hf = save_checkpoint(build_model(model_type, **kwargs), tmp_path_factory.mktemp(f"{name}-hf"))
        made[name] = tmp_path_factory.mktemp(name) / "canonical"
        to_canonical(hf, made[name])
        if name == "llama-gqa":
            made["llama-gqa-hf"] = hf
    return made


@torch.no_grad()
def _logits(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return model(IDS), incremental(model, IDS, PREFILL)


@pytest.fixture(scope="module")
def spawned(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """One spawn of 4 ranks: each model over 2 of them, then over all 4."""
    tmp = tmp_path_factory.mktemp("ranks")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(run_ranks, args=(4, str(tmp / "rendezvous"), checkpoints, IDS, PREFILL, str(tmp / "out.pkl")),
             nprocs=4, join=True)
    with open(tmp / "out.pkl", "rb") as f:
        return pickle.load(f)


def _planned(path: Path, size: int) -> tuple[list[int], int]:
    """What each rank should hold by the plan (bytes: 1/N of a sharded weight, the rows of its KV head,
    all of a replicated one), and the largest single slice."""
    model = lmconvert.load(path)
    held, largest = [0] * size, 0
    for rank in range(size):
        plan = make_plan(model.cfg, size, rank)
        for name, p in model.named_parameters():
            module, kind = name.rsplit(".", 1)
            if module in plan.styles and not (plan.styles[module] == "row" and kind == "bias"):
                part = p.nbytes // size
            elif module in plan.groups:
                start, stop = plan.groups[module]
                part = p.nbytes // p.shape[0] * (stop - start)
            else:
                part = p.nbytes
            held[rank] += part
            largest = max(largest, part)
    return held, largest


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_tensor_parallel_logits_equal_single_process(size: int, checkpoints: dict[str, Path],
                                                     spawned: dict[int, dict[str, Any]]) -> None:
    for name, path in checkpoints.items():
        single = lmconvert.load(path, attention="eager")
        full, cached = _logits(single)
        got = spawned[size][name]
        assert float((got["full"] - full).abs().max()) <= TOL, name
        assert float((got["cached"] - full).abs().max()) <= TOL, name
        assert float((got["cached"] - cached).abs().max()) <= TOL, name
        mine = our_trace(single, single, IDS).points
        assert list(got["points"]) == list(mine), name  # every point verify compares, in the same order
        for point, value in mine.items():
            assert float((got["points"][point] - value).abs().max()) <= TOL * max(1.0, float(value.abs().max())), \
                (name, point)


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_holds_its_share_and_reads_only_slices(size: int, checkpoints: dict[str, Path],
                                                          spawned: dict[int, dict[str, Any]]) -> None:
    for name, path in checkpoints.items():
        held, largest = _planned(path, size)
        whole = local_bytes(lmconvert.load(path))
        ranks = spawned[size][name]["ranks"]
        assert [r["bytes"] for r in ranks] == held, name  # measured on each rank: what the plan says
        for rank in ranks:
            assert rank["whole_reads"] == [], name
            assert rank["largest_read"] <= largest, name
        if name.startswith("llama-gqa"):  # KV heads split too: only the norms are whole on every rank
            assert all(1 / size <= r["bytes"] / whole <= 1 / size + 0.01 for r in ranks), (name, held, whole)


def test_a_transformed_layout_is_read_whole_and_says_so(tmp_path: Path) -> None:
    """Falcon's fused qkv in HF layout cannot be sliced before it is split: the reader says which
    tensors it read whole (converting to the canonical format once avoids it)."""
    from lmconvert.formats.slices import SliceReader

    hf = save_checkpoint(build_model("falcon", eos_token_id=1), tmp_path / "hf")
    with open_checkpoint(hf) as checkpoint, SliceReader(checkpoint) as reader:
        q = reader.read("layers.0.attn.q.weight", 0, 0, 32)
        assert q.shape == (32, 64)
        assert reader.whole_reads == ["layers.0.attn.q.weight"]
        reader.read("layers.0.mlp.up.weight", 0, 0, 128)
        assert reader.whole_reads == ["layers.0.attn.q.weight"]  # a plain rename is sliced


@pytest.mark.parametrize(("model_type", "overrides", "size", "needle"), [
    ("llama", dict(num_attention_heads=4, num_key_value_heads=2), 8, "n_heads=4 does not divide by 8 ranks"),
    ("falcon", dict(num_attention_heads=6, hidden_size=72, parallel_attn=False, multi_query=False, alibi=True),
     2, "ALiBi's per-head slopes"),
    ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=30,
                       shared_expert_intermediate_size=64), 4, "the experts' width 30 does not divide by 4 ranks"),
    ("olmo2", {}, 2, "QK norm over the whole projection"),
])
def test_what_cannot_be_split_is_refused_in_one_line(model_type: str, overrides: dict, size: int, needle: str,
                                                     tmp_path: Path) -> None:
    hf = save_checkpoint(build_model(model_type, **overrides), tmp_path / "hf")
    with open_checkpoint(hf) as checkpoint, pytest.raises(ConfigError, match=needle) as info:
        make_plan(checkpoint.arch, size, 0)
    assert "\n" not in str(info.value)


def test_tp_outside_a_launch_says_how_to_start_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    hf = save_checkpoint(build_model("llama"), tmp_path / "hf")
    with pytest.raises(ConfigError, match="start this program with torchrun --nproc-per-node N"):
        lmconvert.load(hf, tp=2)


@pytest.mark.slow
def test_every_family_splits_or_is_refused(tmp_path: Path) -> None:
    """Each family's tiny model (family_specs) over 2 and 4 ranks: the single-process logits, full and
    cached, within verify's bar under torchrun (1e-5 x max |logit|: Qwen2's reach 1.07e-5 on logits up
    to ~4 over 2 ranks), or a refusal; the refused ones are exactly those whose variant cannot split."""
    accepted, refused = {}, {}
    for name, spec in SPECS.items():
        hf = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path / f"{name}-hf")
        with open_checkpoint(hf) as checkpoint:
            problems = refusals(checkpoint.arch, 4) + refusals(checkpoint.arch, 2)
        if problems:
            refused[name] = problems[0]
            continue
        accepted[name] = tmp_path / name
        to_canonical(hf, accepted[name])
    assert refused == REFUSED_FAMILIES
    mp.spawn(run_ranks, args=(4, str(tmp_path / "rendezvous"), accepted, IDS, PREFILL, str(tmp_path / "out.pkl")),
             nprocs=4, join=True)
    with open(tmp_path / "out.pkl", "rb") as f:
        results = pickle.load(f)
    for name, path in accepted.items():
        single = lmconvert.load(path, attention="eager")
        full, _ = _logits(single)
        limit = TOL * max(1.0, float(full.abs().max()))  # verify's bar under torchrun (split sums round)
        for size in (2, 4):
            got = results[size][name]
            assert float((got["full"] - full).abs().max()) <= limit, (name, size)
            assert float((got["cached"] - full).abs().max()) <= limit, (name, size)
