"""Gemma 4's decoder features against transformers' own modules: the RMSNorm that takes 1/sqrt as a power,
"proportional" RoPE, the KV cache of a model whose last layers share K/V (it holds only the layers that compute
their own, each with its own geometry), and which layer a shared one reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_specs import SPECS
from hf_models import build_model, save_checkpoint, token_batch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm

import lmconvert
from lmconvert.arch import NormConfig, RopeConfig
from lmconvert.arch.norms import Norm
from lmconvert.arch.rope import Rotary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_scale", [True, False])
def test_power_norm_is_gemma4s_bit_for_bit(dtype: torch.dtype, with_scale: bool) -> None:
    theirs = Gemma4RMSNorm(48, eps=1e-6, with_scale=with_scale)
    ours = Norm(48, NormConfig(eps=1e-6, weight=with_scale, dtype_order="scale_then_cast", power=True))
    if with_scale:
        weight = torch.randn(48, generator=torch.Generator().manual_seed(0))
        theirs.weight.data.copy_(weight)
        ours.weight.data.copy_(weight)
    x = (torch.randn(3, 7, 48, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    assert torch.equal(ours(x), theirs(x))


@pytest.mark.parametrize(("fraction", "factor", "head_dim"), [(0.25, 1.0, 32), (0.5, 2.0, 64), (1.0, 1.0, 16)])
def test_proportional_rope_is_transformers(fraction: float, factor: float, head_dim: int) -> None:
    from transformers import Gemma4TextConfig

    config = Gemma4TextConfig(head_dim=head_dim, hidden_size_per_layer_input=0, rope_parameters={
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": fraction, "factor": factor,
                           "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, global_head_dim=head_dim)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type="full_attention")
    rotary = Rotary(RopeConfig(theta=5e5, scaling="proportional", fraction=fraction, factor=factor), head_dim, 128)
    assert rotary.dim == head_dim and scaling == rotary.scaling == 1.0
    assert torch.equal(rotary.inv_freq, inv_freq)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = SPECS["gemma4_unified_text"]
    return save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path_factory.mktemp("g4") / "hf")


def test_kv_cache_holds_only_the_layers_with_their_own_kv(shared: Path) -> None:
    """Layers 4 and 5 reuse layers 2's and 3's K/V: the cache holds layers 0-3, the sliding ones 2 x 16 wide per
    token and the global ones (K = V, one KV head of 32) 1 x 32, both K and V; inspect's figure is that sum."""
    model = lmconvert.load(shared)
    cfg = model.cfg
    assert [cfg.kv_source(i) for i in range(cfg.n_layers)] == [None, None, None, None, 2, 3]
    cache = model.new_cache()
    with torch.no_grad():
        model(token_batch(seq=9), cache=cache)
    assert [None if k is None else tuple(k.shape[1:]) for k in cache.keys] == [
        (2, 9, 16), (1, 9, 32), (2, 9, 16), (1, 9, 32), None, None]
    assert cfg.kv_cache_bytes_per_token(2) == 2 * 2 * (2 * 16 + 32 + 2 * 16 + 32)
    per_token = sum(k.numel() + v.numel() for k, v in zip(cache.keys, cache.values, strict=True)
                    if k is not None) // (2 * 9)
    assert per_token * 2 == cfg.kv_cache_bytes_per_token(2)


def test_shared_layers_have_no_kv_projections_and_double_width(shared: Path) -> None:
    model = lmconvert.load(shared)
    names = dict(model.named_parameters())
    for i in (4, 5):
        assert not any(n.startswith((f"layers.{i}.attn.k", f"layers.{i}.attn.v")) for n in names)
        assert names[f"layers.{i}.mlp.up.weight"].shape[0] == 2 * model.cfg.d_ff
    assert "layers.1.attn.v.weight" not in names and "layers.0.attn.v.weight" in names  # K = V on global layers
    assert names["layers.1.attn.q.weight"].shape == (4 * 32, 64) and names["layers.1.attn.k.weight"].shape == (32, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_router_is_gemma4s_bit_for_bit(dtype: torch.dtype) -> None:
    """MoeConfig(router_norm, expert_scale): the router's input normalised without a weight, times its scale and
    hidden**-0.5, softmax in fp32, top-k renormalised, times the per-expert scale (in fp32), as Gemma4TextRouter;
    every parameter perturbed."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRouter

    from lmconvert.arch import ArchConfig
    from lmconvert.arch.moe import Router

    config = Gemma4TextConfig(hidden_size=48, num_experts=6, top_k_experts=3, enable_moe_block=True,
                              moe_intermediate_size=8, hidden_size_per_layer_input=0)
    theirs = Gemma4TextRouter(config)
    cfg = ArchConfig(vocab_size=8, d_model=48, n_layers=1, n_heads=2, d_ff=8,
                     norm=NormConfig(eps=1e-6, dtype_order="scale_then_cast", power=True),
                     moe=dict(n_experts=6, top_k=3, d_expert=8, weights_fp32=True, router_norm=True,
                              expert_scale=True))
    ours = Router(cfg, cfg.moe)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mine, their in ((ours.weight, theirs.proj.weight), (ours.scale, theirs.scale),
                            (ours.expert_scale, theirs.per_expert_scale)):
            their.copy_(their + 0.3 * torch.randn(their.shape, generator=generator))
            mine.copy_(their)
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    h = (torch.randn(40, 48, generator=generator) * 3).to(dtype)
    with torch.no_grad():
        _, their_weights, their_chosen = theirs(h)
        _, our_weights, our_chosen = ours(h)
    assert torch.equal(our_chosen, their_chosen)
    assert our_weights.dtype == their_weights.dtype == torch.float32 and torch.equal(our_weights, their_weights)
