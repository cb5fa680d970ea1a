"""DeepSeek Sparse Attention (the "sparse" kind) and the DeepSeek-V3.2 family against transformers'
DeepseekV32ForCausalLM: tiny models with every parameter perturbed and `index_topk` (4) well below
the sequence (28), so the indexer's choice changes the logits. ReLU makes exact ties in the index
scores common (two index heads: many rows tie at the cut), and the selection matches transformers'
there too, in a full forward and in cached decoding (whose ties torch.topk breaks otherwise, in
transformers as here). With eight index heads the ties vanish and cached decoding equals the full
forward; with `index_topk` >= the sequence the model is DeepSeek-V3 with the same weights."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from family_specs import FAITHFULNESS, FP32_TOL, IDS
from hf_models import (
    build_model,
    cached_logits,
    check_cached_decoding,
    check_parity,
    check_round_trip,
    check_streamed_verify,
    incremental,
    load_reference,
    save_checkpoint,
)
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import lmconvert
from lmconvert.arch import ConfigError
from lmconvert.arch.attention_kinds import SparseSettings
from lmconvert.arch.describe import variants
from lmconvert.arch.latent_attention import absorb
from lmconvert.arch.sparse_attention import SparseAttention
from lmconvert.cli import main
from lmconvert.convert import to_canonical
from lmconvert.mappings import MappingError, family_for
from lmconvert.runtime.streamed import streamed
from lmconvert.verify.run import verify

MLA = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
           v_head_dim=10, attention_bias=True)
INDEX = dict(index_topk=4, index_head_dim=16, index_n_heads=2)
MOE = dict(first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_group=2,
           topk_group=1, n_shared_experts=1, routed_scaling_factor=1.5)
VARIANTS: dict[str, dict[str, Any]] = {
    "ties": dict(**MLA, **INDEX, first_k_dense_replace=2),  # two index heads: ties at the cut
    "untied": {**MLA, **INDEX, "first_k_dense_replace": 2, "index_n_heads": 8},  # none
    "all_keys": {**MLA, **INDEX, "first_k_dense_replace": 2, "index_topk": 64},  # every key chosen
    "moe": dict(**MLA, **INDEX, **MOE, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                    "original_max_position_embeddings": 32, "mscale_all_dim": 0.7}),
    "moe_pattern": dict(**MLA, **INDEX, **MOE, mlp_layer_types=["sparse", "dense"]),  # not a dense prefix
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple[str, torch.dtype], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> Path:
        if (name, dtype) not in made:
            directory = tmp_path_factory.mktemp(f"dsa-{name}-{str(dtype).removeprefix('torch.')}")
            made[name, dtype] = save_checkpoint(build_model("deepseek_v32", **VARIANTS[name]), directory, dtype)
        return made[name, dtype]

    return get


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def recorded_scores(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every index-score tensor the model's sparse layers compute from now on."""
    seen: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, SparseAttention):
            original = module.index_scores

            def record(*args: Any, original: Callable = original) -> torch.Tensor:
                seen.append(original(*args))
                return seen[-1]

            module.index_scores = record
    return seen


def ties_at_the_cut(scores: list[torch.Tensor], topk: int) -> int:
    """Rows whose k-th and (k+1)-th best visible scores are equal: where the tie-break decides."""
    count = 0
    for index in scores:
        if index.shape[-1] > topk:
            ranked = index.sort(dim=-1, descending=True).values
            count += int(((ranked[..., topk - 1] == ranked[..., topk]) & ranked[..., topk].isfinite()).sum())
    return count


# ----------------------------------------------------------------------------- parity with transformers
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["ties", "untied", "moe", "moe_pattern"])
def test_fp32_parity(name: str, attention: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    check_parity(checkpoint(name), IDS, tmp_path, attention, FP32_TOL)


def test_the_selection_changes_the_output_and_ties_are_there(checkpoint: Callable[..., Path]) -> None:
    """The same weights with index_topk 4 and 64: different logits (so parity above covers the
    selection), and the top-4 cut falls inside a tie in many rows (so it covers the tie-break)."""
    model = lmconvert.load(checkpoint("ties"), attention="eager")
    scores = recorded_scores(model)
    with torch.no_grad():
        sparse = model(IDS)
    assert ties_at_the_cut(scores, 4) > 10
    dense = lmconvert.load(checkpoint("all_keys"), attention="eager")
    with torch.no_grad():
        assert max_abs(sparse, dense(IDS)) > 0.1


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["ties", "moe"])
def test_cached_decoding_follows_transformers_cached_decoding(name: str, attention: str,
                                                              checkpoint: Callable[..., Path]) -> None:
    """Prefill 5, then one token at a time, the indexer's keys cached: transformers' cached logits
    step for step, ties and all, which differ from the full forward's (theirs as ours)."""
    src = checkpoint(name)
    model = lmconvert.load(src, attention=attention)
    theirs = AutoModelForCausalLM.from_pretrained(src, attn_implementation=attention).eval()
    cache = model.new_cache()
    with torch.no_grad():
        ours = incremental(lambda chunk: model(chunk, cache=cache), IDS, 5)
        reference = cached_logits(theirs, IDS, 5)
        assert max_abs(ours, reference) <= FP32_TOL
        assert tuple(cache.index_keys[0].shape) == (2, 28, 16)  # (B, S, index_head_dim), after norm and RoPE
        if name == "ties":
            assert max_abs(reference, theirs(IDS).logits) > 0.1  # the tie-break differs: transformers' own


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_cached_decoding_equals_the_full_forward_without_ties(attention: str, checkpoint: Callable[..., Path]) -> None:
    src = checkpoint("untied")
    model = lmconvert.load(src, attention="eager")
    scores = recorded_scores(model)
    with torch.no_grad():
        model(IDS)
    assert ties_at_the_cut(scores, 4) == 0
    check_cached_decoding(src, IDS, 5, attention, tol=FP32_TOL)


def test_all_keys_chosen_is_deepseek_v3_with_the_same_weights(checkpoint: Callable[..., Path],
                                                              tmp_path: Path) -> None:
    """index_topk >= the sequence: the V3.2 checkpoint without its indexer, read as DeepSeek-V3,
    gives the same logits, in transformers and here."""
    src = checkpoint("all_keys")
    v3 = tmp_path / "v3"
    v3.mkdir()
    config = json.loads((src / "config.json").read_text())
    for key in ("index_topk", "index_head_dim", "index_n_heads", "mlp_layer_types", "layer_types"):
        config.pop(key)
    config.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], first_k_dense_replace=2,
                  rope_interleave=True)
    (v3 / "config.json").write_text(json.dumps(config))
    tensors = {n: t for n, t in load_file(src / "model.safetensors").items() if ".indexer." not in n}
    save_file(tensors, v3 / "model.safetensors", metadata={"format": "pt"})
    with torch.no_grad():
        reference = load_reference(v3)(IDS).logits
        assert torch.equal(load_reference(src)(IDS).logits, reference)
        assert torch.equal(lmconvert.load(src, attention="eager")(IDS), lmconvert.load(v3, attention="eager")(IDS))
        assert max_abs(lmconvert.load(src, attention="eager")(IDS), reference) <= FP32_TOL


# ----------------------------------------------------------------------------- bf16
@pytest.mark.parametrize("name", ["ties", "moe"])
@pytest.mark.bitexact
def test_bf16(name: str, checkpoint: Callable[..., Path]) -> None:
    """Our bf16 logits stray from the exact ones no more than transformers' bf16 logits do, and are
    them bit for bit (eager, dense; the MoE layers' experts add in transformers' grouped_mm order)."""
    src = checkpoint(name, torch.bfloat16)
    with torch.no_grad():
        exact = load_reference(src, torch.float32)(IDS).logits.float()
        theirs = load_reference(src, torch.bfloat16)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS)
    reference_error = float((theirs.float() - exact).abs().mean())
    assert reference_error > 0
    assert float((ours.float() - exact).abs().mean()) <= FAITHFULNESS * reference_error
    assert lmconvert.load(src, dtype=torch.bfloat16).layers[0].attn.index_weights.weight.dtype == torch.float32
    if name == "ties":
        assert torch.equal(ours, theirs), max_abs(ours, theirs)


# ----------------------------------------------------------------------------- conversion and the card
@pytest.mark.parametrize("name", ["ties", "moe", "moe_pattern"])
def test_round_trip_is_bit_exact(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    src = checkpoint(name, torch.bfloat16)
    config = check_round_trip(src, tmp_path, "DeepseekV32ForCausalLM")
    assert config["mlp_layer_types"] == json.loads((src / "config.json").read_text())["mlp_layer_types"]
    with torch.no_grad():
        assert torch.equal(load_reference(tmp_path / "back")(IDS).logits, load_reference(src)(IDS).logits)


def test_inspect_shows_the_indexer_and_its_cache(checkpoint: Callable[..., Path]) -> None:
    result = CliRunner().invoke(main, ["inspect", str(checkpoint("ties"))])
    assert result.exit_code == 0, result.output
    for phrase in ("family            deepseek_v32",
                   "attention: sparse (DSA: MLA with a lightning indexer), 4 heads, q LoRA rank 24, kv_lora_rank 16",
                   "DSA indexer: 2 heads x 16, ReLU scores in fp32, each query keeps its top 4 keys; cached with the "
                   "latent: 16 more entries per token and layer (40 in all)",
                   "latent KV cache: 24 entries per token and layer (c_kv 16 + k_rot 8); MHA with these heads: 120",
                   "KV cache          320 bytes per token (float32)"):  # 2 layers x 40 entries x 4 bytes
        assert phrase in result.output, (phrase, result.output)


def test_inspect_of_a_deepseek_v32_shaped_config() -> None:
    cfg = family_for("deepseek_v32").arch_config({"model_type": "deepseek_v32", "first_k_dense_replace": 61})
    lines = variants(cfg)
    assert "latent KV cache: 576 entries per token and layer (c_kv 512 + k_rot 64); MHA with these heads: 40960; " \
           "1.4% of it" in lines
    assert any(line.startswith("DSA indexer: 64 heads x 128") and "keeps its top 2048 keys" in line
               and "(704 in all)" in line for line in lines)
    assert cfg.kv_cache_bytes_per_token(2) == 61 * 704 * 2


def test_v3_and_v32_do_not_convert_into_each_other(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    to_canonical(checkpoint("ties"), tmp_path / "v32")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "v32"), str(tmp_path / "out"), "--to", "hf",
                                       "--family", "deepseek_v3"])
    assert result.exit_code == 2, result.output
    assert "deepseek_v3 always has latent attention (MLA), which this model lacks (attention='sparse')" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("stated", "needle"), [
    ({"mlp_layer_types": ["dense"]}, "mlp_layer_types=['dense']: needs \"dense\" or \"sparse\" for each of the"),
    ({"mlp_layer_types": ["dense", "moe"]}, "for each of the num_hidden_layers=2 layers"),
    ({"q_lora_rank": None}, "q_lora_rank=null is not allowed"),
    ({"index_head_dim": 4}, "index_head_dim=4: the indexer rotates its first head_dim=8 dims"),
    ({"index_topk": 0}, "index_topk=0"),
])
def test_what_transformers_cannot_run_is_refused(stated: dict, needle: str) -> None:
    config = {"model_type": "deepseek_v32", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              **MLA, **INDEX, "first_k_dense_replace": 2, **stated}
    with pytest.raises(MappingError) as caught:
        family_for("deepseek_v32").arch_config(config)
    assert needle in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_the_kind_needs_the_q_lora() -> None:
    with pytest.raises(ConfigError, match="sparse attention's indexer reads the q LoRA"):
        SparseSettings(q_lora_rank=None)


# ----------------------------------------------------------------------------- verify, absorbed, streamed
def test_verify_compares_the_indexer_and_names_it(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    src = checkpoint("moe")
    report = verify(src, seq_len=20, generate=6)
    names = {p.name for p in report.points}
    assert {f"layers.1.attn.{n}" for n in ("index_q", "index_k", "index_k_norm", "index_weights")} <= names
    assert report.passed and all(p.max_abs == 0.0 for p in report.points)
    to_canonical(src, tmp_path / "canon")
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "canon", broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["layers.1.attn.index_k.weight"] = tensors["layers.1.attn.index_k.weight"].flip(0).contiguous()
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    report = verify(broken, src, seq_len=20, generate=0)
    assert not report.passed and report.first_failure.name == "layers.1.attn.index_k"


def test_absorbed_decoding_equals_expanded(checkpoint: Callable[..., Path]) -> None:
    expanded = lmconvert.load(checkpoint("ties"), attention="eager")
    absorbed = absorb(lmconvert.load(checkpoint("ties"), attention="eager"))
    with torch.no_grad():
        steps = []
        for model in (expanded, absorbed):
            cache = model.new_cache()
            steps.append(incremental(lambda chunk, m=model, c=cache: m(chunk, cache=c), IDS, 5))
        assert max_abs(steps[0], steps[1]) <= FP32_TOL
        assert max_abs(absorbed(IDS), expanded(IDS)) <= FP32_TOL


@pytest.mark.bitexact
def test_streamed_forward_is_bit_identical(checkpoint: Callable[..., Path]) -> None:
    src = checkpoint("moe")
    model = lmconvert.load(src, attention="eager")
    with streamed(src, torch.float32) as stream, torch.no_grad():
        assert torch.equal(stream(IDS), model(IDS))


def test_verify_with_max_memory_streams_both_sides(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    to_canonical(checkpoint("ties"), tmp_path / "canon")
    # embed, final norm; per layer 12 MLA modules, 4 of the indexer, the output
    assert check_streamed_verify(tmp_path / "canon", tmp_path) == 2 + 2 * 17
