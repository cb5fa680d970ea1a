"""Mixtures of experts (arch/moe.py) and the MoE families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE).

The family specs (tests/family_specs.py) already run parity, bf16, cache, round trip and cards for
each family; here: that the test batch reaches every expert (else a wrong expert could hide), the
MoE block alone against transformers' own blocks for each router setting in fp32 and bf16, bit for
bit; transformers 5's fused expert layout read and written back as the Hub's; bf16 logits equal to
transformers' eager experts bit for bit; the fused-tensor transform's inverse; the card's total
and active parameter counts against transformers' own modules; and config validation.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from family_specs import FP32_TOL, IDS, SPECS, family_of
from hf_models import TINY, build_model, raw_bytes, save_checkpoint, tensors_of
from specs import SELECTION_BIAS_BUFFERS
from test_formats_gguf import write_tensors
from transformers import AutoConfig, AutoModelForCausalLM

import lmconvert
from lmconvert.arch import ArchConfig, ConfigError, Decoder, MoeConfig
from lmconvert.arch.describe import parameter_counts, variants
from lmconvert.arch.moe import MoE, Router
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.convert import to_canonical, to_hf
from lmconvert.formats.quant_bands import one_torch_thread
from lmconvert.mappings import FAMILIES
from lmconvert.mappings.tables.transforms import Unstack, same_bits, stack

# read from each spec's own model: a family whose expert counts have no default (dots1) has no MoE
# model at transformers' defaults
MOE_FAMILIES = [name for name in SPECS if FAMILIES[family_of(name)].config.from_hf(
    {"model_type": SPECS[name].model_type, **TINY, **SPECS[name].kwargs}).moe is not None]


@pytest.mark.slow  # it builds every family's transformers model (on the meta device): ~19 s of imports
def test_the_moe_families_are_these() -> None:
    """The families read as mixtures are exactly those whose transformers model holds experts (a parameter
    under an `experts` module), so that none drops out of the tests below unseen; and a spec's
    `selection_bias_buffer` is a buffer of its transformers model, as the tests of it assume."""
    def transformers_model(name: str) -> torch.nn.Module:
        spec = SPECS[name]
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.model_type, **{**TINY, **spec.kwargs}))

    with_experts = []
    for name in SPECS:
        model = transformers_model(name)
        if any(".experts." in n for n, _ in model.named_parameters()):
            with_experts.append(name)
        if SPECS[name].selection_bias_buffer:
            assert any(n.endswith(SELECTION_BIAS_BUFFERS) for n, _ in model.named_buffers()), name
    assert len(MOE_FAMILIES) >= 2 and MOE_FAMILIES == with_experts
    assert [n for n in SPECS if SPECS[n].selection_bias_buffer]  # the buffer tests below have a family


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A family's spec model saved by transformers: the Hub layout (per expert), or with
    `fused=True` transformers 5's own (save_original_format=False)."""
    made: dict[tuple[str, torch.dtype, bool], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32, fused: bool = False) -> Path:
        if (name, dtype, fused) not in made:
            spec = SPECS[name]
            directory = tmp_path_factory.mktemp(f"{name}-{'fused' if fused else 'hub'}")
            made[name, dtype, fused] = save_checkpoint(build_model(spec.model_type, **spec.kwargs), directory, dtype,
                                                       save_original_format=not fused)
        return made[name, dtype, fused]

    return get


EXPERTS = ("grouped_mm", "eager")  # transformers' experts implementations: its default, and expert by expert


def their_model(directory: Path, dtype: torch.dtype = torch.float32, experts: str = "grouped_mm") -> torch.nn.Module:
    """transformers with eager attention and the experts implementation asked (its default unless told),
    where its model offers a choice (DBRX's does not)."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="eager").eval()
    if type(model)._can_set_experts_implementation():
        model.set_experts_implementation(experts)
    return model


# ------------------------------------------------------------------------------------------------ the test batch
def chosen_experts(model: torch.nn.Module) -> dict[str, set[int]]:
    chosen: dict[str, set[int]] = {}
    routers = {n: m for n, m in model.named_modules() if isinstance(m, Router)}
    handles = [m.register_forward_hook(lambda _m, _a, out, n=n: chosen.setdefault(n, set()).update(
        out[2].flatten().tolist())) for n, m in routers.items()]
    with torch.no_grad():
        model(IDS)
    for handle in handles:
        handle.remove()
    return chosen


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_every_expert_is_chosen_in_the_test_batch(name: str, saved: Callable[..., Path]) -> None:
    """The perturbed routers send IDS to every expert of every sparse layer, so each expert's
    weights reach the logits the family tests compare."""
    model = lmconvert.load(saved(name), attention="eager")
    chosen = chosen_experts(model)
    moe = model.cfg.moe
    # every router: the mixtures', and a mixture of attention heads' (JetMoE's), each over its own experts
    routers = {n: m.moe for n, m in model.named_modules() if isinstance(m, Router)}
    sparse = sum(moe.sparse(i) for i in range(model.cfg.n_layers))
    assert len([n for n in chosen if n.endswith(".mlp.router")]) == sparse > 0
    assert chosen.keys() == routers.keys()
    assert all(c == set(range(routers[n].n_experts)) for n, c in chosen.items()), chosen
    assert all(r.top_k < r.n_experts for r in routers.values())


# ------------------------------------------------------------------------------------------------ the block alone
def _qwen2_moe_block(norm_topk: bool, experts: str = "eager") -> torch.nn.Module:
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    config = AutoConfig.for_model("qwen2_moe", hidden_size=16, num_experts=5, num_experts_per_tok=3,
                                  moe_intermediate_size=16, shared_expert_intermediate_size=20,
                                  norm_topk_prob=norm_topk)
    config._experts_implementation = experts
    return Qwen2MoeSparseMoeBlock(config)


def _mixtral_block(norm_topk: bool, experts: str = "eager") -> torch.nn.Module:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = AutoConfig.for_model("mixtral", hidden_size=16, num_local_experts=5, num_experts_per_tok=3,
                                  intermediate_size=16)
    config._experts_implementation = experts
    return MixtralSparseMoeBlock(config)


# (transformers' block, our MoeConfig, and whether transformers' class can express it)
BLOCKS = {
    "qwen2_moe": (_qwen2_moe_block, dict(shared="gated", d_shared=20)),
    "qwen2_moe_renormalised": (lambda _, experts: _qwen2_moe_block(True, experts),
                               dict(shared="gated", d_shared=20, norm_topk=True)),
    "mixtral": (_mixtral_block, dict(weights_fp32=True, norm_topk=True)),
}


def _ours_from(theirs: torch.nn.Module, settings: dict) -> MoE:
    moe = MoeConfig(**{"n_experts": 5, "top_k": 3, "d_expert": 16, "norm_topk": False, **settings})
    cfg = ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=4, moe=moe)
    ours = MoE(cfg)
    state = {"router.weight": theirs.gate.weight}
    for e in range(moe.n_experts):
        gate, up = theirs.experts.gate_up_proj[e].chunk(2)
        state.update({f"experts.{e}.gate.weight": gate, f"experts.{e}.up.weight": up,
                      f"experts.{e}.down.weight": theirs.experts.down_proj[e]})
    if moe.d_shared is not None:
        state.update({f"shared.{n}.weight": getattr(theirs.shared_expert, f"{n}_proj").weight
                      for n in ("gate", "up", "down")})
        state["shared_gate.weight"] = theirs.shared_expert_gate.weight
    ours.load_state_dict(state)
    return ours


def their_gemms_are_ours(theirs: torch.nn.Module, x: torch.Tensor, experts: str) -> bool:
    """Whether this CPU's fp32 GEMMs give transformers' products the bits of ours, on the rows routed to
    each expert: its one product over the fused `gate_up_proj` against ours, gate and up apart, and (for
    its default, grouped_mm, which multiplies by the transposed weight) its down projection against our
    linear. MKL's AVX-512 sgemm gives them; its AVX2 one (MKL_ENABLE_INSTRUCTIONS=AVX2, docs/testing.md:
    the dual-ISA run) sums otherwise on some shapes. bf16's GEMM (oneDNN) is exact on both."""
    def product(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if experts == "eager":
            return F.linear(rows, weight)
        return F.grouped_mm(rows, weight.t()[None], offs=torch.tensor([rows.shape[0]], dtype=torch.int32))

    rows = x.reshape(-1, x.shape[-1])
    chosen = theirs.gate(rows)[2]
    for e, (fused, down) in enumerate(zip(theirs.experts.gate_up_proj, theirs.experts.down_proj, strict=True)):
        mine = rows[(chosen == e).any(dim=-1)]
        gate, up = fused.chunk(2)
        inner = torch.randn(mine.shape[0], down.shape[1], generator=torch.Generator().manual_seed(e))
        if not (torch.equal(product(mine, fused), torch.cat([F.linear(mine, gate), F.linear(mine, up)], -1))
                and torch.equal(product(inner, down), F.linear(inner, down))):
            return False
    return True


@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_block_equals_transformers_block_bit_for_bit(block: str, dtype: torch.dtype, experts: str) -> None:
    """Mixtral's router (renormalised, weights kept fp32) and Qwen2-MoE's (renormalised or not,
    weights cast back; a sigmoid-gated shared expert), top-3 of 5, so that the order in which the
    experts' outputs are added shows in bf16; under each of transformers' experts implementations."""
    make, settings = BLOCKS[block]
    torch.manual_seed(0)
    theirs = make(settings.get("norm_topk", False), experts)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    ours = _ours_from(theirs, settings).to(dtype)
    ours.experts.implementation = experts
    theirs = theirs.to(dtype)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        if dtype == torch.bfloat16:
            assert torch.equal(ours(x), theirs(x))
            return
        # fp32: torch's CPU matmul splits a strided weight's (transformers' fused experts) sums over
        # threads otherwise than a contiguous one's: one ulp apart with 2 threads, bit for bit with one
        # where the GEMM splits gate | up exactly (else the 1e-5 bar alone, said as a warning)
        ref = theirs(x)
        assert float((ours(x) - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            if their_gemms_are_ours(theirs, x, experts):
                assert torch.equal(ours(x), theirs(x))
            else:
                warnings.warn("fp32 bits not compared: this CPU's fp32 GEMM sums the fused gate_up_proj otherwise "
                              "than gate and up apart (MKL's AVX2 sgemm); held to the 1e-5 bar", stacklevel=1)
        finally:
            torch.set_num_threads(threads)


def check_block(theirs: torch.nn.Module, ours: torch.nn.Module, dtype: torch.dtype) -> None:
    """bf16: bit for bit; fp32: the 1e-5 bar (the fused experts' GEMM sums otherwise than gate and up apart)."""
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        if dtype == torch.bfloat16:
            assert torch.equal(ours(x), theirs(x))
        else:
            ref = theirs(x)
            assert float((ours(x) - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))


def _topk_softmax_block(kind: str, experts: str = "eager") -> tuple[torch.nn.Module, MoE]:
    """transformers' GraniteMoE block (softmax over the top k in fp32) or Aria's (in the activation
    dtype, with shared experts and experts stored [in, out]), perturbed, and ours holding its weights."""
    from transformers.models.aria.modeling_aria import AriaTextMoELayer
    from transformers.models.granitemoe.modeling_granitemoe import GraniteMoeMoE

    if kind == "granitemoe":
        config = AutoConfig.for_model("granitemoe", hidden_size=16, num_local_experts=5, num_experts_per_tok=3,
                                      intermediate_size=16)
    else:
        config = AutoConfig.for_model("aria_text", hidden_size=16, num_attention_heads=2, moe_num_experts=5, moe_topk=3,
                                      intermediate_size=16, moe_num_shared_experts=2)
    config._experts_implementation = experts
    theirs = GraniteMoeMoE(config) if kind == "granitemoe" else AriaTextMoELayer(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    aria = kind == "aria_text"
    moe = MoeConfig(n_experts=5, top_k=3, d_expert=16, router="topk_softmax", norm_topk=False,
                    softmax_fp32=not aria, sum_order=experts, **(dict(shared="plain", d_shared=32) if aria else {}))
    ours = MoE(ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, moe=moe))
    state = {"router.weight": theirs.router.weight}
    for e in range(5):
        gate_up, down = theirs.experts.gate_up_proj[e], theirs.experts.down_proj[e]
        gate, up = (gate_up.T if aria else gate_up).chunk(2)
        state.update({f"experts.{e}.gate.weight": gate, f"experts.{e}.up.weight": up,
                      f"experts.{e}.down.weight": down.T if aria else down})
    if aria:
        state.update({f"shared.{n}.weight": getattr(theirs.shared_experts, f"{n}_proj").weight
                      for n in ("gate", "up", "down")})
    ours.load_state_dict(state)
    return theirs, ours


@pytest.mark.parametrize("kind", ["granitemoe", "aria_text"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.bitexact
def test_topk_softmax_block_equals_transformers_block_bit_for_bit(kind: str, dtype: torch.dtype, experts: str) -> None:
    """router="topk_softmax": the top 3 of 5 chosen on the logits, weighted by the softmax over
    those 3 (GraniteMoE's in fp32, Aria's in the activation dtype), against transformers' own blocks
    under each of its experts implementations."""
    theirs, ours = _topk_softmax_block(kind, experts)
    check_block(theirs, ours, dtype)


def _cohere2_moe_block(selection: str, combination: str, experts: str = "eager") -> tuple[torch.nn.Module, MoE]:
    """transformers' Cohere2-MoE block (a softmax over the top k in fp32, or their sigmoids
    renormalised; two shared experts summed or averaged), perturbed, and ours holding its weights."""
    from transformers.models.cohere2_moe.modeling_cohere2_moe import Cohere2MoeSparseMoeBlock

    config = AutoConfig.for_model("cohere2_moe", hidden_size=16, num_attention_heads=2, head_dim=8, num_experts=5,
                                  num_experts_per_tok=3, intermediate_size=16, num_shared_experts=2,
                                  expert_selection_fn=selection, shared_expert_combination_strategy=combination)
    config._experts_implementation = experts
    theirs = Cohere2MoeSparseMoeBlock(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    router = {"softmax": "topk_softmax", "sigmoid": "topk_sigmoid"}[selection]
    moe = MoeConfig(n_experts=5, top_k=3, d_expert=16, router=router, norm_topk=selection == "sigmoid",
                    shared={"sum": "plain", "average": "averaged"}[combination], d_shared=32, sum_order=experts)
    ours = MoE(ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, moe=moe))
    state = {"router.weight": theirs.gate.weight}
    for e in range(5):
        gate, up = theirs.experts.gate_up_proj[e].chunk(2)
        state.update({f"experts.{e}.gate.weight": gate, f"experts.{e}.up.weight": up,
                      f"experts.{e}.down.weight": theirs.experts.down_proj[e]})
    state.update({f"shared.{n}.weight": getattr(theirs.shared_experts, f"{n}_proj").weight
                  for n in ("gate", "up", "down")})
    ours.load_state_dict(state)
    return theirs, ours


def _dbrx_block(p: float | None) -> tuple[torch.nn.Module, MoE]:
    """transformers' DBRX FFN (a softmax in the activation dtype, the top k divided by their p-norm,
    experts as row blocks of w1, v1, w2 computed split), perturbed, and ours holding its weights."""
    from transformers import DbrxConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    config = DbrxConfig(d_model=16, n_heads=2, attn_config={"rope_theta": 1e4},
                        ffn_config={"ffn_hidden_size": 12, "moe_num_experts": 5, "moe_top_k": 3,
                                    "moe_normalize_expert_weights": p})
    theirs = DbrxFFN(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for q in theirs.parameters():
            q.normal_(0, 0.5)
    moe = MoeConfig(n_experts=5, top_k=3, d_expert=12, norm_topk=p is not None, norm_p=p, softmax_fp32=False,
                    experts_split=True, sum_order="eager")
    ours = MoE(ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=12, moe=moe))
    mlp = theirs.experts.mlp
    state = {"router.weight": theirs.router.layer.weight}
    for e in range(5):
        rows = slice(12 * e, 12 * (e + 1))
        state.update({f"experts.{e}.gate.weight": mlp.w1[rows], f"experts.{e}.up.weight": mlp.v1[rows],
                      f"experts.{e}.down.weight": mlp.w2[rows].T})
    ours.load_state_dict(state)
    return theirs, ours


COHERE2_MOE_BLOCKS = [f"cohere2_moe-{c}-{e}" for c in ("softmax-average", "sigmoid-sum") for e in EXPERTS]


@pytest.mark.parametrize("block", [*COHERE2_MOE_BLOCKS, "dbrx-1", "dbrx-2", "dbrx-none"])  # DBRX's: eager only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_cohere2_moe_and_dbrx_blocks_equal_transformers_bit_for_bit(block: str, dtype: torch.dtype) -> None:
    """Cohere2-MoE's routers (topk_softmax, topk_sigmoid renormalised) and shared-expert
    combinations (summed, averaged), DBRX's (an act-dtype softmax, renormalised by the 1-norm, the
    2-norm, or not), top 3 of 5, against transformers' own blocks (Cohere2-MoE's under each of its
    experts implementations)."""
    family, *choice = block.split("-")
    if family == "dbrx":
        theirs, ours = _dbrx_block(None if choice[0] == "none" else float(choice[0]))
    else:
        theirs, ours = _cohere2_moe_block(*choice)
    check_block(theirs, ours, dtype)


def _gpt_oss_block(experts: str, limit: float = 1.5) -> tuple[torch.nn.Module, MoE]:
    """transformers' gpt-oss MLP (a biased router, top 3 of 5 softmaxed in the activation dtype; experts stored
    [in, out] with gate and up columns interleaved, biases added after each product, the clamped SwiGLU),
    perturbed, and ours holding its weights."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = AutoConfig.for_model("gpt_oss", hidden_size=16, intermediate_size=16, num_local_experts=5,
                                  num_experts_per_tok=3, swiglu_limit=limit, swiglu_alpha=1.25)
    config._experts_implementation = experts
    theirs = GptOssMLP(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    moe = MoeConfig(n_experts=5, top_k=3, d_expert=16, router="topk_softmax", norm_topk=False, softmax_fp32=False,
                    router_bias=True, expert_bias=True, glu="clamped_swiglu", glu_alpha=1.25, glu_limit=limit,
                    sum_order=experts)
    ours = MoE(ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, moe=moe))
    state = {"router.weight": theirs.router.weight, "router.bias": theirs.router.bias}
    ex = theirs.experts
    for e in range(5):
        state.update({f"experts.{e}.gate.weight": ex.gate_up_proj[e][:, ::2].T,
                      f"experts.{e}.up.weight": ex.gate_up_proj[e][:, 1::2].T,
                      f"experts.{e}.gate.bias": ex.gate_up_proj_bias[e][::2],
                      f"experts.{e}.up.bias": ex.gate_up_proj_bias[e][1::2],
                      f"experts.{e}.down.weight": ex.down_proj[e].T, f"experts.{e}.down.bias": ex.down_proj_bias[e]})
    ours.load_state_dict(state)
    return theirs, ours


@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_gpt_oss_block_equals_transformers_block_bit_for_bit(dtype: torch.dtype, experts: str) -> None:
    """router_bias, expert_bias and glu="clamped_swiglu" against GptOssMLP under each of transformers'
    experts implementations: bf16 bit for bit (products, then biases, each rounded; the clamps and the
    (up + 1) in bf16), fp32 within the 1e-5 bar (its one [in, 2 x width] product sums otherwise than ours)."""
    theirs, ours = _gpt_oss_block(experts)
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        ref = theirs(x)[0]
        if dtype == torch.bfloat16:
            assert torch.equal(ours(x), ref)
        else:
            assert float((ours(x) - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))


def test_gpt_oss_settings_bite() -> None:
    """The clamps bite on the test input (gate above the limit, up beyond it), and each of the
    router's bias, the experts' biases, the limit and alpha changes the output."""
    theirs, ours = _gpt_oss_block("eager")
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gate_up = x.reshape(-1, 16) @ theirs.experts.gate_up_proj[0] + theirs.experts.gate_up_proj_bias[0]
        assert (gate_up[:, ::2] > 1.5).any() and (gate_up[:, 1::2].abs() > 1.5).any()
        base = ours(x)
        unclamped = _gpt_oss_block("eager", limit=100.0)[1]
        assert not torch.allclose(base, unclamped(x))
        for name in ("router.bias", "experts.0.gate.bias", "experts.1.up.bias", "experts.2.down.bias"):
            changed = _gpt_oss_block("eager")[1]
            changed.get_parameter(name).zero_()
            assert not torch.allclose(base, changed(x)), name
        ours.experts[0].glu_alpha = 1.702
        assert not torch.allclose(base, ours(x))


def test_topk_softmax_settings_bite() -> None:
    """The softmax over the chosen k is not the softmax over all experts (unrenormalised), and a
    softmax in bf16 rather than fp32 changes bf16 outputs where the weights are then renormalised
    (in bf16: DBRX's order). (Over the chosen k alone, torch's bf16 softmax, computed in fp32 and
    rounded once, gives fp32's bits cast: Aria's setting is kept to follow it op for op.)"""
    from dataclasses import replace

    theirs, ours = _topk_softmax_block("granitemoe")
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = ours(x)
        ours.router.moe = replace(ours.router.moe, router="softmax")
        assert not torch.allclose(base, ours(x))
        ours.router.moe = replace(ours.router.moe, norm_topk=True)
        half = ours.bfloat16()
        x = x.bfloat16()
        fp32 = half(x)
        half.router.moe = replace(half.router.moe, softmax_fp32=False)
        assert not torch.equal(fp32, half(x))


def test_fused_shared_expert_is_granitemoeshared_mlp_bit_for_bit() -> None:
    """shared_fused: the shared expert's gate and up as the halves of one projection's output, as
    GraniteMoeShared's shared_mlp computes them, equal to it bit for bit in fp32 (one thread); the
    plain MLP, whose activation runs on a contiguous gate, is not (on AVX-512 CPUs, in the last bit)."""
    from transformers.models.granitemoeshared.modeling_granitemoeshared import GraniteMoeSharedMLP

    config = AutoConfig.for_model("granitemoeshared", hidden_size=64, shared_intermediate_size=48)
    torch.manual_seed(0)
    theirs = GraniteMoeSharedMLP(config)
    moe = MoeConfig(n_experts=2, top_k=1, d_expert=4, shared="plain", d_shared=48, shared_fused=True)
    block = MoE(ArchConfig(vocab_size=8, d_model=64, n_layers=1, n_heads=2, d_ff=4, moe=moe))
    gate, up = theirs.input_linear.weight.chunk(2)
    block.shared.load_state_dict({"gate.weight": gate, "up.weight": up, "down.weight": theirs.output_linear.weight})
    plain = MoE(ArchConfig(vocab_size=8, d_model=64, n_layers=1, n_heads=2, d_ff=4,
                           moe=MoeConfig(n_experts=2, top_k=1, d_expert=4, shared="plain", d_shared=48))).shared
    plain.load_state_dict(block.shared.state_dict())
    x = torch.randn(4, 7, 64, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            assert torch.equal(block.shared(x), theirs(x))
            if torch.equal(plain(x), theirs(x)):  # the difference is the vectorised SiLU's on this CPU
                warnings.warn("this CPU's SiLU rounds a strided and a contiguous gate alike here", stacklevel=1)
    finally:
        torch.set_num_threads(threads)


def test_router_settings_bite() -> None:
    """Each router setting changes the output: renormalising, and keeping the weights in fp32 (in
    bf16), so a family read with the wrong one fails its parity test."""
    torch.manual_seed(0)
    theirs = _qwen2_moe_block(False)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1))
    base = dict(shared="gated", d_shared=20)
    with torch.no_grad():
        plain = _ours_from(theirs, base)(x)
        assert not torch.allclose(plain, _ours_from(theirs, {**base, "norm_topk": True})(x))
        half = x.bfloat16()
        cast = _ours_from(theirs, base).bfloat16()(half)
        assert not torch.equal(cast, _ours_from(theirs, {**base, "weights_fp32": True}).bfloat16()(half))
        no_gate = _ours_from(theirs, base)
        no_gate.shared_gate = None
        assert not torch.allclose(plain, no_gate(x))


def test_ungated_shared_experts_are_added_as_they_are() -> None:
    """shared="plain" (DeepSeek's n_shared_experts): routed experts' sum plus the shared FFN's
    output, written out by hand."""
    cfg = ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=4,
                     moe=MoeConfig(n_experts=4, top_k=2, d_expert=6, shared="plain", d_shared=10))
    torch.manual_seed(0)
    block = MoE(cfg)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        h = x.reshape(-1, 16)
        probs = torch.softmax(block.router.weight @ h.T, dim=0).T
        top, idx = probs.topk(2)
        top = top / top.sum(-1, keepdim=True)
        routed = torch.stack([sum(top[t, k] * block.experts[int(idx[t, k])](h[t]) for k in range(2))
                              for t in range(h.shape[0])])
        expected = (routed + block.shared(h)).reshape(x.shape)
        assert float((block(x) - expected).abs().max()) < 1e-5


# ------------------------------------------------------------------------------------------------ layouts
# DBRX's checkpoints hold every expert in w1, v1 and w2, which transformers 5 keeps: it has no other layout
FUSED_LAYOUT = [name for name in MOE_FAMILIES if not SPECS[name].hub_experts_only]


@pytest.mark.parametrize("name", FUSED_LAYOUT)
def test_transformers_fused_layout_is_read_and_written_back_as_the_hubs(name: str, saved: Callable[..., Path],
                                                                        tmp_path: Path) -> None:
    """transformers 5's own layout (one gate_up_proj and one down_proj per layer) gives the same
    canonical tensors as the Hub's per-expert files, and converts back to exactly those files."""
    fused, hub = saved(name, torch.bfloat16, fused=True), saved(name, torch.bfloat16)
    fused_names = set(tensors_of(fused))
    # GraniteMoE's block: block_sparse_moe; Nemotron-H's ungated experts: up_proj alone
    assert any(n.endswith((".experts.gate_up_proj", ".mixer.experts.up_proj")) for n in fused_names)
    assert not any(".experts.0." in n for n in fused_names)
    to_canonical(fused, tmp_path / "from-fused")
    to_canonical(hub, tmp_path / "from-hub")
    a, b = tensors_of(tmp_path / "from-fused"), tensors_of(tmp_path / "from-hub")
    assert sorted(a) == sorted(b) and any(".experts.3.down.weight" in n for n in a)
    assert all(torch.equal(raw_bytes(a[n]), raw_bytes(b[n])) for n in a)
    to_hf(tmp_path / "from-fused", tmp_path / "back")
    written, original = tensors_of(tmp_path / "back"), tensors_of(hub)
    assert sorted(written) == sorted(original)
    assert all(torch.equal(raw_bytes(written[n]), raw_bytes(original[n])) for n in original)


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_fused_layout_parity(name: str, saved: Callable[..., Path]) -> None:
    src = saved(name, fused=True)
    with torch.no_grad():
        reference = their_model(src)(IDS).logits
        ours = lmconvert.load(src, attention="eager")(IDS)
    assert float((ours - reference).abs().max()) <= FP32_TOL


@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.parametrize("name", [n for n in MOE_FAMILIES if SPECS[n].bf16_exact])  # the others: see their specs
@pytest.mark.bitexact
def test_bf16_logits_are_transformers_experts_bit_for_bit(name: str, experts: str,
                                                          saved: Callable[..., Path]) -> None:
    """Same op order as each of transformers' experts implementations: routing weights cast where
    it casts them; its default (grouped_mm) sums each token's top-k at once in fp32, its eager
    experts add expert after expert with index_add_ in bf16. The two differ (Mixtral's fp32
    weights; any top-k above 2), so each is followed on its own."""
    src = saved(name, torch.bfloat16)
    theirs = their_model(src, torch.bfloat16, experts)
    ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")
    if type(theirs)._can_set_experts_implementation():
        ours.set_experts(experts)
    else:  # its experts module has one order (DBRX's, expert by expert; Llama 4's, every expert summed at once in
        # fp32 as grouped_mm sums them; JetMoE's, one index_add over the rows sorted by expert), which the family's
        # sum_order follows
        assert ours.cfg.moe.sum_order == ("grouped_mm" if ours.cfg.moe.weight_input else
                                          "sorted" if ours.cfg.moe.sum_bias else "eager")
    with torch.no_grad():
        assert torch.equal(ours(IDS), theirs(IDS).logits)


def test_the_two_sums_round_differently_in_bf16(saved: Callable[..., Path]) -> None:
    """Each order matters: on Mixtral (fp32 routing weights, top-2) transformers' two experts
    implementations give different bf16 logits, and so do ours."""
    src = saved("mixtral", torch.bfloat16)
    ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")
    with torch.no_grad():
        theirs = [their_model(src, torch.bfloat16, e)(IDS).logits for e in EXPERTS]
        mine = [ours.set_experts(e)(IDS) for e in EXPERTS]
    assert not torch.equal(*theirs) and not torch.equal(*mine)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unstack_and_stack_are_exact_inverses(dtype: torch.dtype) -> None:
    """Every bit pattern (NaNs and -0.0 included) comes back: each expert's gate, up and down
    out of the fused tensors, and the fused tensors stacked back from them."""
    experts, width, hidden = 5, 3, 4
    bits = torch.randint(-2**15, 2**15, (experts, 2 * width, hidden), generator=torch.Generator().manual_seed(0))
    gate_up = bits.to(torch.int16).view(dtype) if dtype != torch.float32 else \
        torch.randint(-2**31, 2**31 - 1, (experts, 2 * width, hidden), dtype=torch.int32).view(dtype)
    parts = [[Unstack(part, 2).bind({"index": e}).forward(gate_up) for e in range(experts)] for part in (0, 1)]
    assert all(p.shape == (width, hidden) for pieces in parts for p in pieces)
    assert same_bits(stack(parts), gate_up)
    assert same_bits(Unstack().bind({"index": 2}).forward(gate_up), gate_up[2])
    assert same_bits(Unstack(part=1, parts=2).bind({"index": 0}).inverse(parts), gate_up)


# ------------------------------------------------------------------------------------------------ the card
@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_card_counts_total_and_active_parameters(name: str, saved: Callable[..., Path]) -> None:
    """Total: every parameter of transformers' model. Active: less, in each sparse layer, the
    experts a token does not use, counted from transformers' own fused expert tensors."""
    spec = SPECS[name]
    theirs = build_model(spec.model_type, **spec.kwargs)
    # with the selection bias (e_score_correction_bias) and Gemma 4's layer_scalar, which transformers holds as
    # buffers (stored in the checkpoint, parameters of ours)
    total = sum(p.numel() for p in theirs.parameters()) + sum(
        b.numel() for n, b in theirs.named_buffers() if n.endswith((*SELECTION_BIAS_BUFFERS, "layer_scalar")))
    cfg = lmconvert.load(saved(name)).cfg
    k, n = cfg.moe.top_k, cfg.moe.n_experts  # transformers' keys for them differ by family (Aria's moe_topk)
    # the modules holding every expert's weights (MixtralExperts, DbrxExperts, JetMoE's parallel experts of its
    # attention and its MLP), not the modules around them (JetMoeMoA holds its router and bias too)
    unused = sum(sum(p.numel() for p in m.parameters()) * (n - k) // n
                 for m in theirs.modules() if type(m).__name__.endswith("Experts"))
    assert parameter_counts(cfg) == (total, total - unused)
    assert f"parameters: {total:,} total, {total - unused:,} active per token" in variants(cfg)


# ------------------------------------------------------------------------------------------------ config
CFG = dict(vocab_size=8, d_model=16, n_layers=3, n_heads=2, d_ff=4)


@pytest.mark.parametrize(("moe", "fragment"), [
    (dict(n_experts=4, top_k=5, d_expert=4), "cannot exceed n_experts=4"),
    (dict(n_experts=4, top_k=2, d_expert=0), "moe.d_expert=0"),
    (dict(n_experts=4, top_k=2, d_expert=4, router="relu"), "router"),
    (dict(n_experts=6, top_k=2, d_expert=4, n_group=4), "must divide n_experts=6"),
    (dict(n_experts=8, top_k=2, d_expert=4, n_group=4, topk_group=5), "cannot exceed n_group=4"),
    (dict(n_experts=8, top_k=2, d_expert=4, router="sigmoid", n_group=8), "each group needs two"),
    (dict(n_experts=8, top_k=2, d_expert=4, selection_bias=True, n_group=2), "groups with a selection bias"),
    (dict(n_experts=8, top_k=2, d_expert=4, router="logits", n_group=2), "does not limit its choice to groups"),
    (dict(n_experts=8, top_k=2, d_expert=4, norm_min=-1.0), "moe.norm_min=-1.0"),
    (dict(n_experts=8, top_k=2, d_expert=4, norm_min=0.1, norm_topk=False), "norm_topk=False"),
    (dict(n_experts=8, top_k=2, d_expert=4, kept_fp32=("bias",)), "must list some of weight, selection_bias"),
    (dict(n_experts=8, top_k=2, d_expert=4, kept_fp32=("selection_bias",)), "does not have"),
    (dict(n_experts=8, top_k=2, d_expert=4, scale=0.0), "moe.scale=0.0"),
    (dict(n_experts=4, top_k=2, d_expert=4, shared="gated"), "d_shared=None"),
    (dict(n_experts=4, top_k=2, d_expert=4, d_shared=8), "d_shared=8"),
    (dict(n_experts=4, top_k=2, d_expert=4, shared="eh", d_shared=8), "shared"),
    (dict(n_experts=4, top_k=2, d_expert=4, dense_layers=[3]), "n_layers=3"),
    (dict(n_experts=4, top_k=2, d_expert=4, dense_layers=["0"]), "layer indices"),
    (dict(n_experts=4, top_k=2, d_expert=4, router="topk_softmax"), "sum to 1"),
    (dict(n_experts=4, top_k=2, d_expert=4, shared_fused=True), "needs a shared expert"),
    (dict(n_experts=4, top_k=2, d_expert=4, router="topk_softmax", norm_topk=False, n_group=2),
     "does not limit its choice to groups"),
    (dict(n_experts=4, top_k=2, d_expert=4, beside_dense=True), "output_norm=False"),
    (dict(n_experts=4, top_k=2, d_expert=4, beside_dense=True, output_norm=True, shared="plain", d_shared=4),
     "shared='plain'"),
    (dict(n_experts=4, top_k=2, d_expert=4, beside_dense=True, output_norm=True, sum_bias=True), "sum_bias=True"),
    (dict(n_experts=4, top_k=2, d_expert=4, beside_dense="yes"), "true or false"),
])
def test_bad_moe_settings_are_refused(moe: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match="moe") as caught:
        ArchConfig(**CFG, moe=moe)
    assert fragment in str(caught.value)


def test_moe_needs_gated_unbiased_ffns_unless_split() -> None:
    """Fused experts are gated and bias-free; split ones (Nemotron-H's) may be ungated, and are built bias-free
    whatever mlp_bias says (it gives the dense MLPs and the shared expert theirs)."""
    moe = dict(n_experts=4, top_k=2, d_expert=4)
    with pytest.raises(ConfigError, match="gated=True"):
        ArchConfig(**CFG, moe=moe, gated=False)
    with pytest.raises(ConfigError, match="mlp_bias=False"):
        ArchConfig(**CFG, moe=moe, mlp_bias=True)
    split = ArchConfig(**CFG, moe=dict(moe, experts_split=True, shared="plain", d_shared=8), gated=False,
                       mlp_bias=True)
    layer = Decoder(split).layers[0].mlp
    assert layer.experts[0].gate is None and layer.experts[0].up.bias is None and layer.experts[0].down.bias is None
    assert layer.shared.gate is None and layer.shared.up.bias is not None


def test_moe_beside_the_dense_mlp_needs_sequential_sublayers() -> None:
    """The block passes the stream beside the FFN norm's output only where its sublayers run in turn."""
    moe = dict(n_experts=4, top_k=2, d_expert=4, beside_dense=True, output_norm=True)
    for placement in ("parallel_shared", "post"):
        with pytest.raises(ConfigError, match="moe.beside_dense=True.*sequential sublayers"):
            ArchConfig(**CFG, moe=moe, norm_placement=placement)
    ArchConfig(**CFG, moe=moe, norm_placement="sandwich")


def test_moe_config_survives_json_and_dense_json_is_unchanged() -> None:
    cfg = ArchConfig(**CFG, moe=dict(n_experts=4, top_k=2, d_expert=4, shared="gated", d_shared=6,
                                     dense_layers=[2, 0]))
    assert cfg.moe.dense_layers == (0, 2)
    assert ArchConfig.from_json(cfg.to_json()) == cfg
    dense = ArchConfig(**CFG)
    assert "moe" not in json.loads(dense.to_json())  # lmconvert.json of a dense model reads as before


@pytest.mark.parametrize("settings", [
    dict(n_experts=3, top_k=1, d_expert=5),
    dict(n_experts=4, top_k=2, d_expert=6, shared="gated", d_shared=7, dense_layers=(1,)),
    dict(n_experts=2, top_k=2, d_expert=3, shared="plain", d_shared=9, dense_layers=(0, 2)),
    dict(n_experts=2, top_k=1, d_expert=3, shared="plain", d_shared=9, dense_layers=(1,), output_norm=True),
])
def test_shapes_list_every_expert_as_the_decoder_holds_it(settings: dict) -> None:
    cfg = ArchConfig(**CFG, moe=settings)
    with torch.device("meta"):
        model = Decoder(cfg)
    assert list(parameter_shapes(cfg).items()) == [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    names = parameter_shapes(cfg)
    sparse = [i for i in range(3) if i not in settings.get("dense_layers", ())]
    for i in sparse:
        assert f"layers.{i}.mlp.router.weight" in names
        assert all(f"layers.{i}.mlp.experts.{e}.{p}.weight" in names
                   for e in range(settings["n_experts"]) for p in ("gate", "up", "down"))
    assert all(f"layers.{i}.mlp.gate.weight" in names for i in settings.get("dense_layers", ()))


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_a_fused_tensor_is_read_once_not_once_per_expert(name: str, saved: Callable[..., Path]) -> None:
    """Streaming stays bounded and linear: each stored tensor is read once, however many experts
    it holds, and memory holds one stored tensor beyond the one being written."""
    from lmconvert.formats.checkpoint import open_checkpoint

    with open_checkpoint(saved(name, fused=True)) as ckpt:
        reads: list[str] = []
        source = ckpt.source.tensors
        original = source.get
        source.get = lambda n: reads.append(n) or original(n)  # type: ignore[method-assign]
        produced = dict(ckpt.tensors())
    moe, sparse = ckpt.arch.moe, sum(ckpt.arch.moe.sparse(i) for i in range(ckpt.arch.n_layers))
    sources = [stored for stored, _ in ckpt.plan.values()]
    # every expert's gate and up out of the fused tensors (transformers 5's gate_up_proj, DBRX's w1 and v1; up alone
    # for ungated experts, Nemotron-H's up_proj)
    gate_up = [stored for name, (stored, _) in ckpt.plan.items()
               if ".mlp.experts." in name and name.endswith((".gate.weight", ".up.weight"))]
    projections = 2 if ckpt.arch.gated else 1
    assert len(gate_up) == projections * moe.n_experts * sparse and len(set(gate_up)) <= 2 * sparse
    assert len(reads) == len(set(sources)) and sorted(reads) == sorted(set(sources))
    assert len(produced) == len(ckpt.plan)


@pytest.mark.parametrize("shape", [(5, 6, 4), (3, 7, 2), (2, 4, 3, 2)])
def test_an_experts_rows_are_the_run_of_bytes_its_span_names(shape: tuple[int, ...]) -> None:
    """What lets a conversion copy an expert out of a fused tensor byte for byte: forward's result
    is exactly the elements [start, stop) of its input, and out_shape is forward's shape, for
    gate/up halves, whole experts, rows `chunk` cuts unevenly (7 into 4 + 3) and a 4-D tensor."""
    from lmconvert.mappings.tables.transforms import out_shape

    fused = torch.arange(torch.Size(shape).numel(), dtype=torch.int32).reshape(shape)
    for parts in (1, 2):
        for part in range(parts):
            for e in range(shape[0]):
                forward = Unstack(part, parts).bind({"index": e}).forward
                start, stop = forward.span(shape)
                assert torch.equal(forward(fused).flatten(), fused.flatten()[start:stop])
                assert out_shape(forward, shape) == tuple(forward(fused).shape)


@pytest.mark.parametrize("cast", [None, "float32"])
def test_fused_experts_are_copied_as_runs_of_bytes_never_read_whole(cast: str | None, saved: Callable[..., Path],
                                                                    tmp_path: Path) -> None:
    """Each expert's rows are copied from the file as a raw run of bytes, so a fused tensor is never
    read into memory (the memory and speed of a conversion from transformers' layout are then
    those of the Hub's); a cast reads and splits it as before. Both give the Hub layout's tensors."""
    from lmconvert.formats.checkpoint import open_checkpoint

    fused, hub = saved("qwen3_moe", torch.bfloat16, fused=True), saved("qwen3_moe", torch.bfloat16)
    with open_checkpoint(fused) as ckpt:
        reads: list[str] = []
        original = ckpt.source.tensors.get
        ckpt.source.tensors.get = lambda n: reads.append(n) or original(n)  # type: ignore[method-assign]
        to_canonical(ckpt, tmp_path / "from-fused", dtype=cast)
    assert any(n.endswith(".experts.gate_up_proj") for n in reads) == (cast is not None)
    to_canonical(hub, tmp_path / "from-hub", dtype=cast)
    a, b = tensors_of(tmp_path / "from-fused"), tensors_of(tmp_path / "from-hub")
    assert sorted(a) == sorted(b) and all(torch.equal(raw_bytes(a[n]), raw_bytes(b[n])) for n in a)


def test_a_nan_in_a_fused_experts_tensor_is_refused_by_its_name(saved: Callable[..., Path], tmp_path: Path) -> None:
    """The finite check of a fused tensor copied piece by piece still covers every expert, and
    names the fused tensor the user has, not the canonical piece."""
    from safetensors.torch import load_file, save_file

    from lmconvert.formats.errors import InputError

    src = tmp_path / "nan"
    shutil.copytree(saved("qwen3_moe", torch.bfloat16, fused=True), src)
    file = next(src.glob("*.safetensors"))
    tensors = load_file(file)
    name = "model.layers.1.mlp.experts.down_proj"
    tensors[name][-1, 3, 2] = float("nan")  # the last expert's down rows
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(InputError, match=f"{name}.*1 NaN/Inf"):
        to_canonical(src, tmp_path / "out")
    to_canonical(src, tmp_path / "allowed", allow_nonfinite=True)


# ------------------------------------------------------------------------------------------------ DeepSeek
MLA = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
           v_head_dim=10)
DEEPSEEK: dict[str, tuple[str, dict]] = {
    # sigmoid router, selection bias, best 2 of 4 groups, renormalised, scaled; layer 0 dense
    "v3": ("deepseek_v3", dict(MLA, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                               num_experts_per_tok=3, moe_intermediate_size=24, n_shared_experts=2,
                               routed_scaling_factor=2.5, n_group=4, topk_group=2, norm_topk_prob=True)),
    # softmax router, best 2 of 4 groups (group_limited_greedy), scaled, never renormalised
    "v2_grouped": ("deepseek_v2", dict(MLA, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                                       num_experts_per_tok=3, moe_intermediate_size=24, n_shared_experts=2,
                                       routed_scaling_factor=1.5, topk_method="group_limited_greedy", n_group=4,
                                       topk_group=2)),
    "v2_greedy": ("deepseek_v2", dict(MLA, num_hidden_layers=2, first_k_dense_replace=0, n_routed_experts=6,
                                      num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=1)),
}


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple[str, torch.dtype, bool], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32, fused: bool = False) -> Path:
        if (name, dtype, fused) not in made:
            model_type, kwargs = DEEPSEEK[name]
            model = build_model(model_type, **kwargs)
            generator = torch.Generator().manual_seed(2)
            with torch.no_grad():  # a buffer, which build_model's perturbation of parameters leaves at 0
                for buffer_name, buffer in model.named_buffers():
                    if buffer_name.endswith(SELECTION_BIAS_BUFFERS):
                        buffer.add_(torch.randn(buffer.shape, generator=generator) * 0.1)
            directory = tmp_path_factory.mktemp(f"{name}-{'fused' if fused else 'hub'}")
            made[name, dtype, fused] = save_checkpoint(model, directory, dtype, save_original_format=not fused)
        return made[name, dtype, fused]

    return get


@pytest.mark.parametrize("name", list(DEEPSEEK))
@pytest.mark.parametrize("fused", [False, True], ids=["hub", "fused"])
def test_deepseek_moe_parity(name: str, fused: bool, deepseek: Callable[..., Path]) -> None:
    """Against transformers' eager experts, from the Hub's per-expert files and from transformers
    5's fused ones; the batch reaches every expert of every MoE layer, and layer 0 of the grouped
    ones stays dense."""
    src = deepseek(name, fused=fused)
    ours = lmconvert.load(src, attention="eager")
    with torch.no_grad():
        assert float((ours(IDS) - their_model(src)(IDS).logits).abs().max()) <= FP32_TOL
    moe = ours.cfg.moe
    chosen = chosen_experts(ours)
    assert len(chosen) == sum(moe.sparse(i) for i in range(ours.cfg.n_layers))
    assert all(c == set(range(moe.n_experts)) for c in chosen.values()), chosen
    assert moe.shared == "plain" and moe.router_fp32 and moe.weights_fp32


def test_deepseek_v3_router_settings_bite(deepseek: Callable[..., Path]) -> None:
    """Each V3 router setting reaches the logits: without the group limit, the selection bias,
    the renormalisation or the scaling factor they differ from transformers'."""
    import dataclasses

    src = deepseek("v3")
    model = lmconvert.load(src, attention="eager")
    with torch.no_grad():
        reference = their_model(src)(IDS).logits
    state, moe = model.state_dict(), model.cfg.moe
    for change in (dict(n_group=1, topk_group=1), dict(topk_group=4), dict(norm_topk=False), dict(scale=1.0)):
        cfg = dataclasses.replace(model.cfg, moe=dataclasses.replace(moe, **change))
        other = Decoder(cfg).eval()
        other.load_state_dict(state)
        with torch.no_grad():
            assert float((other(IDS) - reference).abs().max()) > 1e-3, change
    assert all(bool(v.abs().min() > 0) for k, v in state.items() if k.endswith("selection_bias"))
    unbiased = {k: torch.zeros_like(v) if k.endswith("selection_bias") else v for k, v in state.items()}
    model.load_state_dict(unbiased)
    with torch.no_grad():
        assert float((model(IDS) - reference).abs().max()) > 1e-3


@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.bitexact
def test_deepseek_v3_bf16_is_transformers_experts_bit_for_bit(experts: str, deepseek: Callable[..., Path]) -> None:
    src = deepseek("v3", torch.bfloat16)
    with torch.no_grad():
        reference = their_model(src, torch.bfloat16, experts)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager").set_experts(experts)(IDS)
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("name", list(DEEPSEEK))
def test_deepseek_moe_bf16_faithfulness(name: str, deepseek: Callable[..., Path]) -> None:
    from family_specs import FAITHFULNESS

    src = deepseek(name, torch.bfloat16)
    with torch.no_grad():
        exact = their_model(src, torch.float32)(IDS).logits
        reference_error = float((their_model(src, torch.bfloat16)(IDS).logits.float() - exact).abs().mean())
        ours_error = float((lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS).float() - exact)
                           .abs().mean())
    assert 0 < reference_error and ours_error <= FAITHFULNESS * reference_error, (ours_error, reference_error)


@pytest.mark.parametrize("name", list(DEEPSEEK))
def test_deepseek_moe_round_trip_and_cache(name: str, deepseek: Callable[..., Path], tmp_path: Path) -> None:
    from hf_models import check_cached_decoding, check_round_trip

    model_type = DEEPSEEK[name][0]
    config = check_round_trip(deepseek(name, torch.bfloat16), tmp_path, FAMILIES[model_type].architecture)
    assert config["n_routed_experts"] == DEEPSEEK[name][1]["n_routed_experts"]
    check_cached_decoding(deepseek(name), IDS, 6, "eager", tol=FP32_TOL)


def test_deepseek_v3_every_point_is_compared(deepseek: Callable[..., Path]) -> None:
    """verify finds transformers' module behind the router, the routed experts (fused), the
    shared experts, and agrees exactly at each."""
    from lmconvert.verify.run import verify
    from lmconvert.verify.trace import point_modules

    src = deepseek("v3")
    report = verify(src, seq_len=20, generate=4)
    cfg = lmconvert.load(src).cfg
    expected = set(point_modules(cfg)) | {"embed", "final_norm"} | {f"layers.{i}" for i in range(cfg.n_layers)}
    expected |= {f"layers.{i}.mlp.experts.{e}" for i in (1, 2) for e in range(cfg.moe.n_experts)}
    assert {p.name for p in report.points} == expected
    assert {"layers.1.mlp.router", "layers.1.mlp.experts", "layers.1.mlp.experts.7",
            "layers.1.mlp.shared.down"} <= expected
    assert report.passed and all(p.max_abs == 0.0 for p in report.points)


def test_deepseek_card() -> None:
    cfg = FAMILIES["deepseek_v3"].arch_config({"model_type": "deepseek_v3"})  # DeepSeek-V3's own sizes
    lines = variants(cfg)
    assert "mixture of experts: 256 experts, top-8, d_expert 2048 (layers [3, 4, 5" in "\n".join(lines)
    assert ("router: sigmoid then top-k, renormalised, weights in fp32, best 4 of 8 groups, selection bias, "
            "scaled x2.5, logits in fp32") in lines
    assert "shared experts, ungated, width 2048" in lines
    total, active = parameter_counts(cfg)
    assert 6.6e11 < total < 6.8e11 and 3.6e10 < active < 3.9e10  # 671B total, 37B active, as DeepSeek says


# ------------------------------------------------------------------------------------------------ training loss
@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_load_balancing_loss_is_transformers(name: str, tmp_path: Path) -> None:
    """With output_router_logits, transformers' training loss adds router_aux_loss_coef times
    the load-balancing loss; ours adds moe.aux_loss times the same, read from those keys. Off (and
    the loss plain cross-entropy) by default."""
    spec = SPECS[name]
    aux = spec.aux_loss_key in FAMILIES[family_of(name)].config.keys  # dots1 has none: its loss is plain
    theirs = build_model(spec.model_type, **spec.kwargs, output_router_logits=True, **{spec.aux_loss_key: 0.05})
    src = save_checkpoint(theirs, tmp_path / "hf")
    ours = lmconvert.load(src, attention="eager")
    # DBRX's coefficient is ffn_config.moe_loss_weight (0.01 in its spec model), not router_aux_loss_coef
    coefficient = getattr(theirs, "router_aux_loss_coef", 0.0) if name == "dbrx" else 0.05
    aux = aux or name == "dbrx"
    assert ours.cfg.moe.aux_loss == (coefficient if aux else 0.0)
    with torch.no_grad():
        reference = theirs(IDS, labels=IDS).loss
        _, loss = ours(IDS, labels=IDS)
        plain = lmconvert.load(saved_plain := save_checkpoint(build_model(spec.model_type, **spec.kwargs),
                                                              tmp_path / "plain"), attention="eager")
        _, without = plain(IDS, labels=IDS)
    assert float((loss - reference).abs()) <= FP32_TOL
    assert plain.cfg.moe.aux_loss == 0.0 and (float(loss - without) > 0.01) == aux  # the same weights, the term on
    # (AriaTextConfig has no such key: its loss is plain)
    assert json.loads((saved_plain / "config.json").read_text()).get("output_router_logits", False) is False


# ------------------------------------------------------------------------------------------------ verify
@pytest.mark.parametrize(("break_it", "where"), [
    (lambda t: t["layers.1.mlp.experts.2.down.weight"].mul_(1.5), "layers.1.mlp.experts.2"),
    (lambda t: t["layers.1.mlp.router.weight"].add_(0.5), "layers.1.mlp.router"),
])
def test_verify_locates_a_broken_expert_or_router(break_it: Callable, where: str, saved: Callable[..., Path],
                                                  tmp_path: Path) -> None:
    """One expert's weights, or the router's, wrong in a converted checkpoint: verify's first
    failure is that expert, named (each expert is compared alone on every token, against
    transformers' experts module routing every token to it), after the layer's router and the
    other experts agreed; or the router."""
    from safetensors.torch import load_file, save_file

    from lmconvert.verify.run import verify

    hf = saved("qwen3_moe")
    to_canonical(hf, tmp_path / "canon")
    tensors = load_file(tmp_path / "canon" / "model.safetensors")
    break_it(tensors)
    save_file(tensors, tmp_path / "canon" / "model.safetensors", metadata={"format": "pt"})
    report = verify(tmp_path / "canon", hf, seq_len=20, generate=0)
    failure = report.first_failure
    assert not report.passed and failure is not None and failure.name == where
    by_name = {p.name: p for p in report.points}
    assert all(p.passed for p in report.points if p.layer == 0)
    if where.endswith("experts.2"):
        assert by_name["layers.1.mlp.router"].passed
        assert all(by_name[f"layers.1.mlp.experts.{e}"].passed for e in (0, 1, 3, 4, 5))
        assert not by_name["layers.1.mlp.experts"].passed
        assert "layer 1, mlp.experts.2" in report.table()


# ------------------------------------------------------------------------------------------------ streamed
@pytest.mark.parametrize(("name", "fused"), [("qwen2_moe", False), ("mixtral", True), ("olmoe", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_streamed_forward_is_bit_identical(name: str, fused: bool, dtype: torch.dtype,
                                           saved: Callable[..., Path]) -> None:
    """One block at a time (verify --max-memory's side), from per-expert files or fused ones: the
    same logits and points as the whole model, and nothing left loaded."""
    from lmconvert.runtime.streamed import streamed
    from lmconvert.verify.trace import our_trace

    path = saved(name, fused=fused)
    model = lmconvert.load(path, dtype=dtype, attention="eager")
    with streamed(path, dtype) as stream:
        assert torch.equal(stream(IDS), model(IDS))
        ours, whole = our_trace(stream.model, stream, IDS), our_trace(model, model, IDS)
        assert list(ours.points) == list(whole.points) and any(p.endswith("mlp.experts") for p in ours.points)
        assert all(torch.equal(ours.points[k], whole.points[k]) for k in ours.points)
        assert all(p.is_meta for p in stream.model.parameters())


def test_verify_max_memory_streams_moe_blocks(saved: Callable[..., Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from lmconvert.cli import main

    result = CliRunner().invoke(main, ["verify", str(saved("qwen2_moe")), "--max-memory", "20KB", "--seq-len", "16",
                                       "--generate", "4", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["streamed"] and report["max_abs"] == 0.0
    assert all(p["max_abs"] == 0.0 for p in report["points"])
    assert {"layers.0.mlp.router", "layers.0.mlp.experts", "layers.0.mlp.shared_gate"} <= {p["name"]
                                                                                          for p in report["points"]}


@pytest.mark.parametrize("streamed_load", [False, True], ids=["whole", "streamed"])
def test_deepseek_router_stays_fp32_in_a_bf16_load(streamed_load: bool, deepseek: Callable[..., Path],
                                                   tmp_path: Path) -> None:
    """A file with the router's weight and selection bias in fp32 and the rest in bf16 (as
    DeepSeek-V3's keeps its e_score_correction_bias): loaded in bf16, the router keeps them fp32,
    as transformers does, and the logits are transformers' bit for bit."""
    import shutil

    from safetensors.torch import load_file, save_file

    from lmconvert.runtime.streamed import streamed

    src = tmp_path / "mixed"
    shutil.copytree(deepseek("v3"), src)
    tensors = load_file(src / "model.safetensors")
    kept = (".mlp.gate.weight", ".e_score_correction_bias")
    mixed = {n: t if n.endswith(kept) else t.bfloat16() for n, t in tensors.items()}
    fp32 = [n for n in mixed if n.endswith(kept)]
    assert len(fp32) == 4 and all(mixed[n].dtype == torch.float32 for n in fp32)
    assert not any(tensors[n].bfloat16().float().equal(tensors[n]) for n in fp32)  # bits bf16 would lose
    save_file(mixed, src / "model.safetensors", metadata={"format": "pt"})
    with torch.no_grad():
        reference = their_model(src, torch.bfloat16)(IDS).logits
        if streamed_load:
            with streamed(src, torch.bfloat16) as stream:
                ours = stream(IDS)
        else:
            model = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")
            assert model.layers[1].mlp.router.selection_bias.dtype == torch.float32
            ours = model(IDS)
    assert torch.equal(ours, reference)


# ------------------------------------------------------------------------------------------------ GGUF
GGUF_ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
# llama.cpp writes Mixtral as `llama` with stacked experts; OLMoE's feed_forward_length is its expert width
EMULATED_ARCH = {**GGUF_ARCH, "mixtral": "llama", "olmoe": "olmoe"}
# transformers' GGUF loader reads no expert widths (it keeps its config class's defaults), so the
# models it is compared with have those widths
GGUF_MODELS = {
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, norm_topk_prob=False),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=768, head_dim=16,
                      norm_topk_prob=True),
}


def write_moe_gguf(model: torch.nn.Module, path: Path, quant: str | None = None, name: str = "tiny") -> Path:
    """What llama.cpp's converter writes for a Qwen MoE model (or Mixtral, as `llama`: q/k rows
    permuted, no expert width of its own): its metadata, the experts of each layer and projection
    stacked (`ffn_gate_exps` [experts, width, hidden]), the shared-expert gate as a vector; 2-D and
    3-D weights quantized to `quant` if given."""
    import gguf
    from test_formats_gguf import permute

    cfg = model.config
    arch = EMULATED_ARCH[cfg.model_type]
    writer = gguf.GGUFWriter(str(path), arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_name(name)
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    for add, value in ((writer.add_context_length, cfg.max_position_embeddings),
                       (writer.add_embedding_length, cfg.hidden_size), (writer.add_block_count, cfg.num_hidden_layers),
                       (writer.add_feed_forward_length, cfg.intermediate_size),
                       (writer.add_head_count, cfg.num_attention_heads),
                       (writer.add_head_count_kv, cfg.num_key_value_heads),
                       (writer.add_layer_norm_rms_eps, cfg.rms_norm_eps), (writer.add_key_length, head_dim),
                       (writer.add_value_length, head_dim),
                       (writer.add_rope_freq_base, cfg.rope_parameters["rope_theta"]),
                       (writer.add_expert_count, cfg.num_experts),
                       (writer.add_expert_used_count, cfg.num_experts_per_tok),
                       (writer.add_vocab_size, cfg.vocab_size)):
        add(value)
    if arch in GGUF_ARCH.values():
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant else gguf.LlamaFileType.ALL_F32)
    key = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(key, cfg.num_hidden_layers)
    tensors: dict[str, torch.Tensor] = {}
    for hf_name, t in model.state_dict().items():
        t, layer = t.detach().float().clone(), hf_name.split(".")[2] if ".layers." in hf_name else ""
        if hf_name.endswith("experts.gate_up_proj"):
            gate, up = t.chunk(2, dim=1)
            tensors |= {f"blk.{layer}.ffn_gate_exps.weight": gate, f"blk.{layer}.ffn_up_exps.weight": up}
        elif hf_name.endswith("experts.down_proj"):
            tensors[f"blk.{layer}.ffn_down_exps.weight"] = t
        else:
            base, _, suffix = hf_name.rpartition(".")
            gguf_name = f"{names.get_name(base)}.{suffix}"
            if arch == "llama" and ".attn_q." in gguf_name:
                t = permute(t, cfg.num_attention_heads, cfg.num_attention_heads)
            elif arch == "llama" and ".attn_k." in gguf_name:
                t = permute(t, cfg.num_attention_heads, cfg.num_key_value_heads)
            tensors[gguf_name] = t.squeeze(0) if "shared_expert_gate" in base else t
    return write_tensors(writer, tensors, quant, path)


@pytest.mark.parametrize("name", list(GGUF_ARCH))
def test_gguf_import_equals_the_original_model(name: str, tmp_path: Path) -> None:
    """llama.cpp's stacked experts read one expert at a time: F32 logits equal the model's.
    (llama.cpp's qwen2moe / qwen3moe have no dense layers and no window, and hard-code whether the
    top-k weights are renormalised: never for qwen2moe, always for qwen3moe.)"""
    spec = SPECS[name]
    model = build_model(spec.model_type, **{**spec.kwargs, "use_sliding_window": False, "decoder_sparse_step": 1,
                                            "mlp_only_layers": [], "norm_topk_prob": name == "qwen3_moe"})
    path = write_moe_gguf(model, tmp_path / f"{name}.gguf")
    ours = lmconvert.load(path, attention="eager")
    assert ours.cfg.moe == lmconvert.load(saved_hf := save_checkpoint(model, tmp_path / "hf")).cfg.moe
    with torch.no_grad():
        assert float((ours(IDS) - their_model(saved_hf)(IDS).logits).abs().max()) <= FP32_TOL


@pytest.mark.parametrize("name", list(GGUF_ARCH))
@pytest.mark.parametrize("quant", [None, "Q8_0"])
def test_gguf_experts_equal_transformers_gguf_loader(name: str, quant: str | None, tmp_path: Path) -> None:
    """Every expert's dequantized weights are the ones transformers' own GGUF loader stacks, bit
    for bit, and the logits agree."""
    path = write_moe_gguf(build_model(name, **GGUF_MODELS[name]), tmp_path / f"{name}.gguf", quant)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32,
                                                  attn_implementation="eager", experts_implementation="eager").eval()
    ours = lmconvert.load(path, attention="eager")
    state = theirs.state_dict()
    for i in range(ours.cfg.n_layers):
        experts = ours.layers[i].mlp.experts
        gate_up = torch.stack([torch.cat([x.gate.weight, x.up.weight]) for x in experts])
        assert torch.equal(gate_up, state[f"model.layers.{i}.mlp.experts.gate_up_proj"])
        assert torch.equal(torch.stack([x.down.weight for x in experts]),
                           state[f"model.layers.{i}.mlp.experts.down_proj"])
    with torch.no_grad():
        assert float((ours(IDS) - theirs(IDS).logits).abs().max()) <= FP32_TOL


@pytest.mark.parametrize("fused", [False, True], ids=["hub", "fused"])
def test_experts_move_in_source_order_as_one_run_per_file(fused: bool, saved: Callable[..., Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of small expert tensors cost what a dense checkpoint's few large ones do: the output
    lays tensors out in the order their source bytes lie (not the index's or the names' order), so
    that tensors stored back to back, a fused tensor's experts included, move as one job per file
    (each file here is smaller than a run), both ways, with a digest per tensor still."""
    from lmconvert.formats import shards
    from lmconvert.formats.canonical import read_meta
    from lmconvert.formats.digest import tensor_digest
    from lmconvert.formats.safetensors_dir import data_offsets

    src = saved("qwen3_moe", torch.bfloat16, fused=fused)
    jobs: list[int] = []
    submit = shards.Movers.submit
    monkeypatch.setattr(shards.Movers, "submit", lambda self, work, file, nbytes: jobs.append(nbytes) or submit(
        self, work, file, nbytes))
    to_canonical(src, tmp_path / "canonical")
    assert len(jobs) == len(list((tmp_path / "canonical").glob("*.safetensors"))) == 1
    meta, ours = read_meta(tmp_path / "canonical"), tensors_of(tmp_path / "canonical")
    assert len(meta.tensors) == len(ours) > 90 and all(meta.tensors[n] == tensor_digest(t) for n, t in ours.items())
    (stored,) = src.glob("*.safetensors")
    source_order = sorted(data_offsets(stored).values(), key=lambda e: e[2])
    out_order = sorted(data_offsets(tmp_path / "canonical" / "model.safetensors").items(), key=lambda e: e[1][2])
    if not fused:  # same tensors, renamed: the same order of shapes
        assert [e[1] for e in source_order] == [e[1][1] for e in out_order]
    jobs.clear()
    to_hf(tmp_path / "canonical", tmp_path / "back")
    assert len(jobs) == 1


def test_mellum_s_multi_token_prediction_layer_is_dropped_by_name(tmp_path: Path) -> None:
    """Mellum's MTP layer (tensors under `mtp.`), which transformers does not load, is left out of the
    import and recorded as dropped; the logits are transformers' (which ignores it too)."""
    from hf_models import edited_weights

    spec = SPECS["mellum"]
    src = save_checkpoint(build_model("mellum", **spec.kwargs), tmp_path / "hf")

    def add_mtp(tensors: dict[str, torch.Tensor]) -> None:
        tensors["mtp.layers.0.input_layernorm.weight"] = torch.ones(64)
        tensors["mtp.eh_proj.weight"] = torch.ones(64, 128)

    with_mtp = edited_weights(src, tmp_path / "mtp", add_mtp)
    meta = to_canonical(with_mtp, tmp_path / "canon")
    assert sorted(meta.source["dropped_tensors"]) == ["mtp.eh_proj.weight", "mtp.layers.0.input_layernorm.weight"]
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(with_mtp, dtype=torch.float32).eval()(IDS).logits
        ours = lmconvert.load(tmp_path / "canon", dtype=torch.float32)(IDS)
    assert float((ours - ref).abs().max()) <= FP32_TOL


def test_mellum_s_own_sliding_rope_is_refused_for_llama_cpp(tmp_path: Path) -> None:
    """llama.cpp's mellum graph reads rope.freq_base_swa but rotates the sliding layers with the full
    layers' theta: a Mellum whose sliding layers have a theta of their own (the published 1e4 beside 5e5)
    is refused for GGUF, naming the separate RoPE, rather than written to run otherwise in llama.cpp."""
    from lmconvert.convert import convert
    from lmconvert.formats.errors import InputError

    spec = SPECS["mellum"]
    src = save_checkpoint(build_model("mellum", **{**spec.kwargs, **spec.gguf, "rope_parameters": None}),
                          tmp_path / "hf")
    to_canonical(src, tmp_path / "canon")
    with pytest.raises(InputError, match="rope_local"):
        convert(tmp_path / "canon", tmp_path / "m.gguf", "gguf", quant="f32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.01, 0.3])
def test_sparsemixer_router_is_phimoe_s_bit_for_bit(dtype: torch.dtype, eps: float) -> None:
    """router="sparsemixer" gives transformers' `sparsemixer` (its inference path) weights and experts bit for
    bit, with the relative mask cutting some experts and not others (eps 0: only the best of each step)."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    cfg = ArchConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=8,
                     moe=MoeConfig(n_experts=8, top_k=2, d_expert=8, router="sparsemixer", norm_topk=False,
                                   sparsemixer_eps=eps))
    router = Router(cfg, cfg.moe).to(dtype)
    torch.manual_seed(0)
    h = torch.randn(64, 16, dtype=dtype)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 16) * 0.3)
        logits, weights, chosen = router(h)
        theirs, experts = sparsemixer(logits, jitter_eps=eps, training=False)
    assert torch.equal(chosen, experts) and torch.equal(weights, theirs)
    assert weights.dtype == dtype and (chosen[:, 0] != chosen[:, 1]).all()
    if eps == 0.3:  # the mask bites: some first weights are below 1, others exactly 1
        assert (weights[:, 0] < 1).any() and (weights[:, 0] == 1).any()
# ------------------------------------------------------------------------------------------------ buffer biases
# families whose transformers model holds e_score_correction_bias as a buffer, which build_model's perturbation
# of parameters leaves at 0 (their spec's `selection_bias_buffer`): here it is perturbed, so that choosing on the
# selection bias is compared too
BUFFER_BIASED = [name for name in SPECS if SPECS[name].selection_bias_buffer]


@pytest.fixture(scope="module")
def biased(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple[str, torch.dtype, bool], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32, fused: bool = False) -> Path:
        if (name, dtype, fused) not in made:
            model = build_model(SPECS[name].model_type, **SPECS[name].kwargs)
            generator = torch.Generator().manual_seed(3)
            with torch.no_grad():
                buffers = [b for n, b in model.named_buffers() if n.endswith(SELECTION_BIAS_BUFFERS)]
                assert buffers
                for buffer in buffers:
                    buffer.add_(torch.randn(buffer.shape, generator=generator) * 0.1)
            directory = tmp_path_factory.mktemp(f"{name}-biased-{'fused' if fused else 'hub'}")
            made[name, dtype, fused] = save_checkpoint(model, directory, dtype, save_original_format=not fused)
        return made[name, dtype, fused]

    return get


@pytest.mark.parametrize("name", BUFFER_BIASED)
@pytest.mark.parametrize("fused", [False, True], ids=["hub", "fused"])
def test_selection_bias_held_as_a_buffer_parity(name: str, fused: bool, biased: Callable[..., Path]) -> None:
    """With a non-zero bias, from the Hub's names and transformers 5's fused ones: transformers' eager
    experts in fp32, every expert reached, and the bias biting (zeroed, the logits move)."""
    src = biased(name, fused=fused)
    ours = lmconvert.load(src, attention="eager")
    with torch.no_grad():
        reference = their_model(src)(IDS).logits
        assert float((ours(IDS) - reference).abs().max()) <= FP32_TOL
    moe = ours.cfg.moe
    assert all(c == set(range(moe.n_experts)) for c in chosen_experts(ours).values())
    state = ours.state_dict()
    assert all(bool(v.abs().min() > 0) for k, v in state.items() if k.endswith("selection_bias"))
    ours.load_state_dict({k: torch.zeros_like(v) if k.endswith("selection_bias") else v for k, v in state.items()})
    with torch.no_grad():
        assert float((ours(IDS) - reference).abs().max()) > 1e-3


@pytest.mark.parametrize("experts", EXPERTS)
@pytest.mark.parametrize("name", BUFFER_BIASED)
@pytest.mark.bitexact
def test_selection_bias_held_as_a_buffer_bf16_is_transformers_bit_for_bit(name: str, experts: str,
                                                                         biased: Callable[..., Path]) -> None:
    src = biased(name, torch.bfloat16)
    with torch.no_grad():
        reference = their_model(src, torch.bfloat16, experts)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager").set_experts(experts)(IDS)
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_input_weighted_moe_is_llama4s_bit_for_bit(dtype: torch.dtype) -> None:
    """MoeConfig(router="topk_sigmoid_fp32", weight_input=True) with a plain shared expert: Llama4TextMoe's
    router (top-k of the logits, their sigmoid in fp32, no renormalisation), the router weight on each
    expert's input, every expert summed in increasing order, the shared expert added."""
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    config = Llama4TextConfig(hidden_size=32, intermediate_size=24, num_local_experts=5, num_experts_per_tok=3,
                              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    theirs = Llama4TextMoe(config)
    torch.nn.init.normal_(theirs.experts.gate_up_proj, std=0.3)
    torch.nn.init.normal_(theirs.experts.down_proj, std=0.3)
    cfg = ArchConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=48,
                     moe=MoeConfig(n_experts=5, top_k=3, d_expert=24, router="topk_sigmoid_fp32", norm_topk=False,
                                   shared="plain", d_shared=24, weight_input=True))
    ours = MoE(cfg)
    with torch.no_grad():
        ours.router.weight.copy_(theirs.router.weight)
        for e, expert in enumerate(ours.experts):
            expert.gate.weight.copy_(theirs.experts.gate_up_proj[e, :, :24].T)
            expert.up.weight.copy_(theirs.experts.gate_up_proj[e, :, 24:].T)
            expert.down.weight.copy_(theirs.experts.down_proj[e].T)
        for name in ("gate", "up", "down"):
            getattr(ours.shared, name).weight.copy_(getattr(theirs.shared_expert, f"{name}_proj").weight)
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    # one torch thread (as `make test` runs): with two, fp32 GEMMs over a subset of the rows split their sums
    # otherwise than transformers' bmm over them, 4.8e-7 apart
    with torch.no_grad(), one_torch_thread():
        expected, logits = theirs(x)
        assert torch.equal(ours(x), expected.view(2, 7, 32))
        assert torch.equal(ours.router(x.reshape(-1, 32))[0], logits)


@pytest.mark.bitexact
def test_flint_keeps_its_fp32_sinks_in_bf16(saved: Callable[..., Path], tmp_path: Path) -> None:
    """transformers keeps Flint's sinks in fp32 in a bf16 model (`_keep_in_fp32_modules_strict`), as a checkpoint
    it saves stores them; the decoder keeps them too (`sinks_fp32`), so a bf16 checkpoint holding fp32 sinks runs
    bit for bit. Rounded to bf16, as a decoder holding them in the model's dtype would, the logits differ."""
    from safetensors.torch import load_file, save_file

    src = saved("flint", torch.bfloat16)
    mixed = tmp_path / "mixed"
    shutil.copytree(src, mixed)
    fp32 = load_file(str(saved("flint") / "model.safetensors"))
    tensors = load_file(str(mixed / "model.safetensors"))
    sinks = [n for n in tensors if n.endswith("softmax_offset") or n.endswith("self_attn.sinks")]
    assert sinks
    for n in sinks:  # the full-precision values, stored in fp32 beside the bf16 weights
        tensors[n] = fp32[n].float() + 1e-3  # off the bf16 grid, so a rounding would show
    save_file(tensors, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    theirs = their_model(mixed, torch.bfloat16)
    ours = lmconvert.load(mixed, dtype=torch.bfloat16, attention="eager")
    assert all(p.dtype == torch.float32 for n, p in ours.named_parameters() if n.endswith("attn.sinks"))
    with torch.no_grad():
        assert torch.equal(ours(IDS), theirs(IDS).logits)
        for block in ours.layers:
            block.attn.sinks.data = block.attn.sinks.data.to(torch.bfloat16).float()
        assert not torch.equal(ours(IDS), theirs(IDS).logits)


@pytest.mark.bitexact
def test_flint_router_is_transformers_bit_for_bit(saved: Callable[..., Path]) -> None:
    """`FlintTopKRouter`: the sigmoid of the whole row of fp32 logits, then a sorted top-k of those sigmoids,
    renormalised. Its weights, choice and order, not merely its logits, bit for bit: on 40 random tokens (a
    sigmoid over the k gathered logits rounds otherwise on some CPUs, where torch's vectorised loop leaves a
    tail of them to its scalar loop: AVX-512 on AMD EPYC) and on tokens whose logits all lie past the point
    where their sigmoids round to 1 in fp32, where transformers' choice among the tied sigmoids is not the
    top-k of the logits."""
    theirs = their_model(saved("flint")).model.layers[2].mlp.gate
    ours = lmconvert.load(saved("flint"), attention="eager").layers[2].mlp.router
    weight = theirs.weight.detach()
    targets = torch.tensor([[20.0, 30.0, 25.0, 18.0], [18.0, 19.0, 40.0, 35.0]])  # past sigmoid's 1.0 in fp32
    saturated = torch.linalg.lstsq(weight, targets.T).solution.T  # tokens whose logits are (about) these
    h = torch.cat([torch.randn(40, weight.shape[1], generator=torch.Generator().manual_seed(2)), saturated])
    with torch.no_grad():
        expected, got = theirs(h), ours(h)
    assert bool((expected[0][40:] > 17.5).all())  # saturated indeed
    for name, a, b in zip(("logits", "weights", "chosen"), got, expected, strict=True):
        assert torch.equal(a, b), name
