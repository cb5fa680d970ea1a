"""The mixture of attention heads (attention kind "head_mixture", arch/head_mixture.py) and the sum of
experts JetMoE's MLP mixture computes (MoeConfig.sum_order="sorted", sum_bias), each against transformers'
own JetMoE modules bit for bit; what the kind refuses. The whole family (parity, bf16, cache, round trip,
verify's points) is tests/specs/jetmoe.py's."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from family_specs import IDS, SPECS
from hf_models import build_model, perturb, save_checkpoint
from tp_ranks import cannot_spawn, run_ranks
from transformers import AutoConfig
from transformers.models.jetmoe.modeling_jetmoe import JetMoeAttention, JetMoeMoE

import lmconvert
from lmconvert.arch import ArchConfig, ConfigError, MoeConfig
from lmconvert.arch.attention_kinds import KINDS
from lmconvert.arch.context import Context
from lmconvert.arch.head_mixture import HeadMixture
from lmconvert.arch.moe import MoE
from lmconvert.arch.rope import Rotary
from lmconvert.convert import to_canonical
from lmconvert.runtime.tensor_parallel import make_plan
from lmconvert.verify.trace import our_trace

CONFIG = dict(hidden_size=32, num_key_value_heads=2, kv_channels=8, num_local_experts=5, num_experts_per_tok=3,
              intermediate_size=24)
ARCH = dict(vocab_size=8, d_model=32, n_layers=1, n_heads=6, n_kv_heads=2, head_dim=8, d_ff=24, o_bias=True,
            attention="head_mixture", attention_settings=dict(n_experts=5, top_k=3))


def theirs(module: type, dtype: torch.dtype) -> torch.nn.Module:
    config = AutoConfig.for_model("jetmoe", **CONFIG)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    made = module(config, 0) if module is JetMoeAttention else module(config)
    for p in made.parameters():
        torch.nn.init.normal_(p, std=0.2)
    perturb(made)
    return made.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_head_mixture_is_jetmoe_attention_bit_for_bit(dtype: torch.dtype) -> None:
    """Routed queries, shared keys tiled per slot, each slot's output through its expert's o, weighted, summed in
    one index_add and the bias added: JetMoeAttention's every rounding, with its RoPE tables and causal mask."""
    reference = theirs(JetMoeAttention, dtype)
    cfg = ArchConfig(**ARCH)
    rotary = Rotary(cfg.rope, cfg.head_dim, cfg.max_positions)
    ours = HeadMixture(cfg, KINDS["head_mixture"].parts(cfg), 0, rotary, None).to(dtype).eval()
    e = reference.experts
    state = {"bias": e.bias, "router.weight": e.router.layer.weight, "k.weight": reference.kv_proj.weight[:16],
             "v.weight": reference.kv_proj.weight[16:]}
    state |= {f"q.{i}.weight": e.input_linear.weight[i] for i in range(5)}
    state |= {f"o.{i}.weight": e.output_linear.weight[i] for i in range(5)}
    ours.load_state_dict(state)
    ours.backend = "eager"
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    ctx = Context.build(0, 19, dtype, x.device)
    cos, sin = ctx.rotary(rotary)
    mask = torch.full((19, 19), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]
    with torch.no_grad():
        expected = reference(x, attention_mask=mask, position_embeddings=(cos[None], sin[None]))[0]
        assert torch.equal(ours(x, ctx), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sorted_sum_with_its_bias_is_jetmoe_moe_bit_for_bit(dtype: torch.dtype) -> None:
    """One index_add over the rows sorted by expert (fp32 accumulation on CPU), then the bias: JetMoeMoE's."""
    reference = theirs(JetMoeMoE, dtype)
    cfg = ArchConfig(**{**ARCH, "moe": MoeConfig(n_experts=5, top_k=3, d_expert=24, router="topk_softmax",
                                                 norm_topk=False, sum_order="sorted", sum_bias=True)})
    ours = MoE(cfg).to(dtype).eval()
    fused, down = reference.input_linear.weight, reference.output_linear.weight
    state = {"router.weight": reference.router.layer.weight, "experts.bias": reference.bias}
    for i in range(5):
        state |= {f"experts.{i}.gate.weight": fused[i, :24], f"experts.{i}.up.weight": fused[i, 24:],
                  f"experts.{i}.down.weight": down[i]}
    ours.load_state_dict(state)
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), reference(x))
        if dtype != torch.float32:  # the order bites: an index_add_ per expert rounds after every add
            ours.experts.implementation = "eager"
            assert not torch.equal(ours(x), reference(x))


@pytest.mark.parametrize(("overrides", "needle"), [
    (dict(n_heads=4), "top_k * n_kv_heads = 6"),
    (dict(q_bias=True), "ArchConfig.q_bias=True"),
    (dict(qk_norm="head"), "no QK norm"),
    (dict(layer_kinds=("local",), sliding_window=4), "no sliding window"),
    (dict(layer_positions=("alibi",)), "RoPE or no positions"),
    (dict(attn_softcap=2.0), "soft-cap"),
    (dict(attention_settings=dict(n_experts=2, top_k=3)), "cannot exceed n_experts=2"),
    (dict(moe=MoeConfig(n_experts=4, top_k=3, d_expert=8, router="topk_softmax", norm_topk=False, aux_loss=0.01)),
     "same n_experts and top_k"),
])
def test_what_a_mixture_of_heads_cannot_compute_is_refused(overrides: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("*", r"\*")):
        ArchConfig(**{**ARCH, **overrides})


@pytest.mark.slow
@pytest.mark.skipif(cannot_spawn() is not None, reason=str(cannot_spawn()))
def test_tensor_parallel_splits_the_experts_by_kv_head(tmp_path: Path) -> None:
    """The spec's model over 2 ranks (each expert's q and o split by the kv heads, the router and bias whole): the
    single process's logits, full and cached, and every point verify compares, within verify's bar under torchrun;
    a kv head shared by ranks refused in one line."""
    spec = SPECS["jetmoe"]
    hf = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path / "hf")
    to_canonical(hf, tmp_path / "canonical")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(run_ranks, args=(2, str(tmp_path / "rendezvous"), {"jetmoe": tmp_path / "canonical"}, IDS, 12,
                              str(tmp_path / "out.pkl")), nprocs=2, join=True)
    with open(tmp_path / "out.pkl", "rb") as f:
        got = pickle.load(f)[2]["jetmoe"]
    single = lmconvert.load(tmp_path / "canonical", attention="eager")
    with torch.no_grad():
        full = single(IDS)
    limit = 1e-5 * max(1.0, float(full.abs().max()))
    assert float((got["full"] - full).abs().max()) <= limit
    assert float((got["cached"] - full).abs().max()) <= limit
    mine = our_trace(single, single, IDS).points
    assert list(got["points"]) == list(mine)
    for point, value in mine.items():
        assert float((got["points"][point] - value).abs().max()) <= 1e-5 * max(1.0, float(value.abs().max())), point
    # 2 kv heads read by 4 query heads: 4 ranks could share each kv head in plain GQA, not in a mixture of heads
    arch = ArchConfig(**{**ARCH, "n_heads": 4, "attention_settings": dict(n_experts=5, top_k=2)})
    with pytest.raises(ConfigError, match="n_kv_heads=2 does not divide by 4 ranks: a mixture of attention heads"):
        make_plan(arch, 4, 0)


def test_verify_max_memory_is_refused_by_name(tmp_path: Path) -> None:
    """transformers' JetMoE reads its attention experts' bias in JetMoeMoA.reduce, never through that module's
    forward, where accelerate loads an offloaded module's weights: offloading the reference is refused in one line."""
    from click.testing import CliRunner

    from lmconvert.cli import main

    hf = save_checkpoint(build_model("jetmoe", **SPECS["jetmoe"].kwargs), tmp_path / "hf")
    result = CliRunner().invoke(main, ["verify", str(hf), "--max-memory", "200KB", "--seq-len", "16"])
    assert result.exit_code == 2, result.output
    assert "--max-memory: jetmoe: transformers' JetMoE attention reads its experts' bias" in result.stderr
