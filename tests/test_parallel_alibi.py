"""The variants GPT-NeoX, GPT-J, Phi, BLOOM, MPT and Falcon brought, each against transformers' own
code: parallel-block sum orders, gelu_new and BLOOM's GeLU, an absolute rotary width, fused qkv
layouts, each family's ALiBi, q·k in fp32, Falcon's separate linear biases, and the layouts the
family specs do not cover (GPT-NeoX sequential; Falcon-7B, Falcon with one parallel norm, Falcon
sequential with biases, Falcon-RW's ALiBi). Where a variant changes only bf16 rounding, the test
shows our bf16 logits equal transformers' bit for bit with it and differ without it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from family_specs import FP32_TOL, IDS, SEQ, SPECS
from hf_models import build_model, check_cached_decoding, check_round_trip, load_reference, save_checkpoint
from torch import nn
from transformers import AutoConfig

import lmconvert
from lmconvert.arch import ArchConfig, ConfigError, Decoder, RopeConfig
from lmconvert.arch.activations import ACTIVATIONS
from lmconvert.arch.block import SeparateBias
from lmconvert.arch.positions import alibi_bias, alibi_slopes, mpt_alibi_slopes
from lmconvert.mappings import FAMILIES
from lmconvert.mappings.tables.transforms import QkvGroups, groups_to_qkv

# layouts the family specs leave out
LAYOUTS: dict[str, tuple[str, dict]] = {
    "gpt_neox-sequential": ("gpt_neox", dict(use_parallel_residual=False, eos_token_id=1)),
    "falcon-7b": ("falcon", dict(eos_token_id=1)),  # multi_query, parallel_attn, one norm
    "falcon-one-norm": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1,
                                       eos_token_id=1)),
    "falcon-sequential": ("falcon", dict(parallel_attn=False, multi_query=False, bias=True, eos_token_id=1)),
    "falcon-rw": ("falcon", dict(num_attention_heads=6, hidden_size=72, parallel_attn=False, multi_query=False,
                                 bias=True, alibi=True, eos_token_id=1)),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple[str, torch.dtype], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> Path:
        if (name, dtype) not in made:
            model_type, kwargs = LAYOUTS[name] if name in LAYOUTS else (SPECS[name].model_type, SPECS[name].kwargs)
            made[name, dtype] = save_checkpoint(build_model(model_type, **kwargs),
                                                tmp_path_factory.mktemp(name), dtype)
        return made[name, dtype]

    return get


@torch.no_grad()
def theirs(path: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return load_reference(path, dtype)(IDS).logits


@torch.no_grad()
def ours(model: Decoder) -> torch.Tensor:
    return model(IDS)


def bf16_model(path: Path) -> Decoder:
    return lmconvert.load(path, dtype=torch.bfloat16, attention="eager")


# ------------------------------------------------------------------------------------------------ layouts
@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.bitexact
def test_layout_parity_and_bf16_bit_exactness(name: str, checkpoint: Callable[..., Path]) -> None:
    src = checkpoint(name)
    ref = theirs(src)
    got = ours(lmconvert.load(src, attention="eager"))
    assert float((got - ref).abs().max()) <= FP32_TOL
    half = checkpoint(name, torch.bfloat16)
    assert torch.equal(ours(bf16_model(half)), theirs(half, torch.bfloat16))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_round_trip_and_cached_decoding(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    family = FAMILIES[LAYOUTS[name][0]]
    check_round_trip(checkpoint(name, torch.bfloat16), tmp_path, family.architecture)
    check_cached_decoding(checkpoint(name), IDS, 6, "eager", "eager", FP32_TOL)


# ------------------------------------------------------------------------------------------------ bf16 order
ORDERS = {"gptj": "attn+mlp+h", "phi": "attn+mlp+h", "gpt_neox": "mlp+attn+h", "falcon": "mlp+attn+h",
          "falcon-7b": "mlp+attn+h"}


@pytest.mark.parametrize("name", list(ORDERS))
def test_parallel_blocks_sum_in_the_references_order(name: str, checkpoint: Callable[..., Path]) -> None:
    """fp32 cannot tell the orders apart; bf16 can: ours equals transformers' bit for bit in the
    family's order and not in the one parallel blocks used before."""
    src = checkpoint(name, torch.bfloat16)
    model = bf16_model(src)
    assert model.cfg.parallel_sum == ORDERS[name]
    ref = theirs(src, torch.bfloat16)
    assert torch.equal(ours(model), ref)
    for block in model.layers:
        block.parallel_sum = "h+attn+mlp"
    assert not torch.equal(ours(model), ref)


def test_gptj_scores_in_fp32(checkpoint: Callable[..., Path]) -> None:
    src = checkpoint("gptj", torch.bfloat16)
    model = bf16_model(src)
    ref = theirs(src, torch.bfloat16)
    assert torch.equal(ours(model), ref)
    for block in model.layers:
        block.attn.cfg = dataclasses.replace(block.attn.cfg, scores_fp32=False)
    assert not torch.equal(ours(model), ref)


def test_falcon_biases_are_added_after_the_matmul(checkpoint: Callable[..., Path]) -> None:
    src = checkpoint("falcon-sequential", torch.bfloat16)
    model = bf16_model(src)
    separate = [m for m in model.modules() if isinstance(m, SeparateBias)]
    assert len(separate) == 4 * model.cfg.n_layers + 2 * model.cfg.n_layers  # q, k, v, o; up, down
    ref = theirs(src, torch.bfloat16)
    assert torch.equal(ours(model), ref)
    for module in separate:
        module.__class__ = nn.Linear
    assert not torch.equal(ours(model), ref)


def test_mpt_clip_qkv_bites(checkpoint: Callable[..., Path]) -> None:
    """The spec's clip_qkv clamps real values: without it, ours no longer matches transformers."""
    src = checkpoint("mpt")
    model = lmconvert.load(src, attention="eager")
    assert model.cfg.clip_qkv == 1.5
    ref = theirs(src)
    assert float((ours(model) - ref).abs().max()) <= FP32_TOL
    for block in model.layers:
        block.attn.cfg = dataclasses.replace(block.attn.cfg, clip_qkv=None)
    assert float((ours(model) - ref).abs().max()) > 1e-3


# ------------------------------------------------------------------------------------------------ activations
def test_gelu_new_and_bloom_gelu_are_transformers_own() -> None:
    from transformers.activations import NewGELUActivation
    from transformers.models.bloom.modeling_bloom import bloom_gelu_forward

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(ACTIVATIONS["gelu_new"](x.to(dtype)), NewGELUActivation()(x.to(dtype)))
        assert torch.equal(ACTIVATIONS["gelu_bloom"](x.to(dtype)), bloom_gelu_forward(x.to(dtype)))
    half = x.bfloat16()
    assert not torch.equal(ACTIVATIONS["gelu_new"](half), ACTIVATIONS["gelu_tanh"](half))  # the defect fixed
    assert not torch.equal(ACTIVATIONS["gelu_bloom"](half), ACTIVATIONS["gelu_new"](half))


# ------------------------------------------------------------------------------------------------ rotary width
def test_an_absolute_rotary_width_is_kept() -> None:
    """head_dim 44 with rotary_dim 30: a fraction truncates to 29 (odd, refused); the width does not."""
    assert int(44 * (30 / 44)) == 29
    assert RopeConfig(rotary_dims=30).rotary_dim(44) == 30
    with pytest.raises(ConfigError, match="rotary dims 29 must be even"):
        ArchConfig(vocab_size=8, d_model=176, n_layers=1, n_heads=4, d_ff=8, rope=RopeConfig(fraction=30 / 44))
    cfg = ArchConfig(vocab_size=8, d_model=176, n_layers=1, n_heads=4, d_ff=8, rope=RopeConfig(rotary_dims=30))
    assert Decoder(cfg).layers[0].attn.rotary.dim == 30
    with pytest.raises(ConfigError, match="rotary_dims or fraction"):
        RopeConfig(rotary_dims=30, fraction=0.5)
    with pytest.raises(ConfigError, match="smaller than the rotary dims"):
        ArchConfig(vocab_size=8, d_model=64, n_layers=1, n_heads=4, d_ff=8, rope=RopeConfig(rotary_dims=18))


# ------------------------------------------------------------------------------------------------ fused qkv
def split_by_transformers(model_type: str, fused: torch.Tensor, heads: int, kv: int, dim: int,
                          **config: object) -> tuple[torch.Tensor, ...]:
    """q, k, v [B, T, heads|kv, D] from a fused projection output, by each model's own code."""
    B, T = fused.shape[:2]
    if model_type == "gpt_neox":  # GPTNeoXAttention.forward
        q, k, v = fused.view(B, T, -1, 3 * dim).chunk(3, dim=-1)
        return q, k, v
    if model_type == "bloom":
        from transformers.models.bloom.modeling_bloom import BloomAttention

        attention = BloomAttention(AutoConfig.for_model("bloom", hidden_size=heads * dim, n_head=heads), 0)
        return tuple(t.transpose(1, 2) for t in attention._reshape(fused))
    from transformers import AttentionInterface
    from transformers.models.falcon.modeling_falcon import FalconAttention

    # FalconAttention.forward splits the fused output inline: run it on `fused` as its projection's output,
    # with an attention function that keeps what it is given (ALiBi: no RoPE turns q and k first)
    seen: dict[str, torch.Tensor] = {}

    def keep(_module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_args: object,
             **_kwargs: object) -> tuple[torch.Tensor, None]:
        seen.update(q=q, k=k, v=v)
        return q.transpose(1, 2), None

    AttentionInterface.register("lmconvert_keep", keep)
    cfg = AutoConfig.for_model("falcon", hidden_size=heads * dim, num_attention_heads=heads, num_kv_heads=kv,
                               alibi=True, **config)
    cfg._attn_implementation = "lmconvert_keep"
    attention = FalconAttention(cfg, 0)
    attention.query_key_value = nn.Identity()
    attention.forward(fused, attention_mask=None)
    return tuple(seen[n].transpose(1, 2) for n in "qkv")


@pytest.mark.parametrize(("model_type", "heads", "kv", "config"), [
    ("gpt_neox", 4, 4, {}), ("bloom", 6, 6, {}), ("falcon", 4, 4, dict(multi_query=False)),
    ("falcon", 4, 1, dict(multi_query=True)), ("falcon", 8, 2, dict(new_decoder_architecture=True)),
])
def test_fused_qkv_layouts_are_transformers_own(model_type: str, heads: int, kv: int, config: dict) -> None:
    dim, d = 6, 20
    rows = (heads + 2 * kv) * dim
    weight = torch.randn(rows, d, generator=torch.Generator().manual_seed(1))
    x = torch.eye(d)[None]  # one token per input dim: x @ W.T is W.T exactly, whatever the kernel
    refs = split_by_transformers(model_type, x @ weight.T, heads, kv, dim, **config)
    transform = QkvGroups().bind({"heads": heads, "kv_heads": kv, "head_dim": dim})
    q, k, v = transform.forward(weight).split([heads * dim, kv * dim, kv * dim])
    for w, ref in zip((q, k, v), refs, strict=True):
        assert torch.equal((x @ w.T).view(1, d, -1, dim), ref.reshape(1, d, -1, dim))
    assert torch.equal(transform.inverse(transform.forward(weight)), weight)
    assert torch.equal(groups_to_qkv(weight[:, 0], heads, kv, dim), transform.forward(weight)[:, 0])  # biases


# ------------------------------------------------------------------------------------------------ ALiBi
@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6, 8, 12, 16, 20, 71])
def test_alibi_slopes_are_transformers_own(heads: int) -> None:
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    assert torch.equal(alibi_slopes(heads), _get_alibi_slopes(heads, torch.device("cpu")))
    assert torch.equal(mpt_alibi_slopes(heads), build_mpt_alibi_tensor(heads, 2)[:, 0, 0] * -1)
    mask = torch.ones(1, SEQ, dtype=torch.long)
    positions = torch.arange(SEQ)
    falcon = alibi_bias(heads, positions, positions, "falcon")
    assert torch.equal(falcon.to(torch.bfloat16), falcon_alibi(mask, heads, torch.bfloat16).view(heads, 1, SEQ))


def test_mpt_bias_counts_from_the_last_key() -> None:
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    positions = torch.arange(SEQ)
    assert torch.equal(alibi_bias(6, positions, positions, "mpt"), build_mpt_alibi_tensor(6, SEQ))
    cached = alibi_bias(6, positions[-1:], positions, "mpt")  # one query, every key: the same row
    assert torch.equal(cached, build_mpt_alibi_tensor(6, SEQ))


@pytest.mark.parametrize("name", ["bloom", "mpt", "falcon-rw"])
@pytest.mark.bitexact
def test_each_familys_alibi_is_needed_bit_for_bit(name: str, checkpoint: Callable[..., Path]) -> None:
    """The plain ALiBi (slope x (k - q), added after the scaling) gives the same function in exact
    arithmetic for BLOOM and MPT, so fp32 agrees; bf16 rounds their own way. Falcon-RW's is another
    function altogether (bf16 slopes, divided by sqrt(head_dim))."""
    src, half = checkpoint(name), checkpoint(name, torch.bfloat16)
    model, model_bf16 = lmconvert.load(src, attention="eager"), bf16_model(half)
    ref, ref_bf16 = theirs(src), theirs(half, torch.bfloat16)
    assert torch.equal(ours(model_bf16), ref_bf16)
    for m in (model, model_bf16):
        for block in m.layers:
            block.attn.cfg = dataclasses.replace(block.attn.cfg, alibi="distance")
    assert not torch.equal(ours(model_bf16), ref_bf16)
    plain = float((ours(model) - ref).abs().max())
    assert plain > 1e-2 if name == "falcon-rw" else plain <= FP32_TOL


def test_falcon_rw_alibi_joins_through_the_mask_eagerly_and_through_sdpa(checkpoint: Callable[..., Path]) -> None:
    """transformers' Falcon (5.25 on) adds the bias once, with the mask, in its eager path as in its
    SDPA one (5.24's eager path added it before the scaling too). Each of our backends matches the
    same-named one of transformers'."""
    from transformers import AutoModelForCausalLM

    src = checkpoint("falcon-rw")
    with torch.no_grad():
        sdpa = AutoModelForCausalLM.from_pretrained(src, attn_implementation="sdpa")(IDS).logits
    eager = theirs(src)
    assert float((sdpa - eager).abs().max()) <= FP32_TOL
    assert float((ours(lmconvert.load(src, attention="sdpa")) - sdpa).abs().max()) <= FP32_TOL
    assert math.isclose(float((ours(lmconvert.load(src, attention="eager")) - eager).abs().max()), 0.0,
                        abs_tol=FP32_TOL)


# ------------------------------------------------------------------------------------------------ older keys
@pytest.mark.parametrize("model_type", ["bloom", "falcon"])
def test_n_embed_is_read_as_transformers_reads_it(model_type: str) -> None:
    """Older BLOOM and Falcon files name the width `n_embed`; transformers takes it over
    hidden_size, so does the mapping, and export writes hidden_size."""
    family = FAMILIES[model_type]
    theirs_ = AutoConfig.for_model(model_type, n_embed=72, num_attention_heads=6)
    ours_ = family.arch_config({"model_type": model_type, "n_embed": 72, "num_attention_heads": 6, "n_head": 6})
    assert ours_.d_model == theirs_.hidden_size == 72
    assert "n_embed" not in family.to_hf(ours_) and family.to_hf(ours_)["hidden_size"] == 72
    both = {"model_type": model_type, "n_embed": 72, "hidden_size": 48, "num_attention_heads": 6, "n_head": 6}
    assert family.arch_config(both).d_model == AutoConfig.for_model(**both).hidden_size == 72
