"""The variants the GPT-2-era families brought, each against transformers' own code: `gelu_new`,
fairseq's sinusoidal table, the position offset, and the operation orders that make bf16 exact
(q scaled before q.k, fp32 scores, an unrounded embedding scale). Each order is
shown to matter: with the family's value our bf16 logits are transformers' bit for bit, with the
other value they are not. Then the layouts family_specs does not hold: OPT pre-norm (with and
without the final norm, affine or not), GPT-2's `reorder_and_upcast_attn` and unscaled scores, and
GPT-2's original checkpoint names."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_helpers import build, tiny, tokens
from family_specs import FP32_TOL, IDS, SPECS
from hf_models import build_model, load_reference, save_checkpoint, tensors_of
from safetensors.torch import save_file
from transformers.activations import NewGELUActivation
from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

import lmconvert
from lmconvert.arch import ArchConfig, ConfigError, Decoder
from lmconvert.arch.activations import ACTIVATIONS
from lmconvert.arch.positions import sinusoidal, sinusoidal_fairseq
from lmconvert.convert import to_canonical, to_hf
from lmconvert.mappings import FAMILIES, MappingError
from lmconvert.mappings.transforms import Chain, Piece, Transpose


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    made: dict[tuple[str, str, torch.dtype], Path] = {}

    def get(model_type: str, dtype: torch.dtype = torch.float32, **kwargs: Any) -> Path:
        key = (model_type, repr(sorted(kwargs.items())), dtype)
        if key not in made:
            made[key] = save_checkpoint(build_model(model_type, **kwargs), tmp_path_factory.mktemp(model_type), dtype)
        return made[key]

    return get


@torch.no_grad()
def reference(src: Path, dtype: torch.dtype) -> torch.Tensor:
    return load_reference(src, dtype)(IDS).logits.float()


@torch.no_grad()
def ours(src: Path, dtype: torch.dtype, **changes: Any) -> torch.Tensor:
    """Our eager logits, under the family's config or one that differs in `changes`."""
    model = lmconvert.load(src, dtype=dtype, attention="eager")
    if changes:
        other = Decoder(dataclasses.replace(model.cfg, **changes))
        other.load_state_dict(model.state_dict(), strict=True)
        model = other.to(dtype).set_attention("eager").eval()
    return model(IDS).float()


# ------------------------------------------------------------------------------------------------ gelu_new
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gelu_new_is_transformers_new_gelu_bit_for_bit(dtype: torch.dtype) -> None:
    x = torch.linspace(-6, 6, 4001).to(dtype)
    assert torch.equal(ACTIVATIONS["gelu_new"](x), NewGELUActivation()(x))


def test_gelu_new_and_gelu_tanh_round_differently_in_bf16() -> None:
    """The same formula: within fp32 rounding of each other, but not the same bf16 numbers."""
    x = torch.linspace(-6, 6, 4001)
    assert float((ACTIVATIONS["gelu_new"](x) - ACTIVATIONS["gelu_tanh"](x)).abs().max()) < 1e-6
    x = x.bfloat16()
    assert not torch.equal(ACTIVATIONS["gelu_new"](x), ACTIVATIONS["gelu_tanh"](x))


# ------------------------------------------------------------------------------------------------ positions
@pytest.mark.parametrize("dim", [48, 63])
def test_fairseq_table_is_xglms_bit_for_bit(dim: int) -> None:
    """XGLM's table at row p + 2 (its padding offset) for positions 0..99, odd widths included."""
    theirs = XGLMSinusoidalPositionalEmbedding.get_embedding(102, dim)
    positions = torch.arange(100)
    assert torch.equal(sinusoidal_fairseq(positions + 2, dim, torch.float32), theirs[2:])
    assert not torch.allclose(sinusoidal(positions + 2, dim, torch.float32), theirs[2:], atol=1e-3)


@pytest.mark.parametrize("kind", ["sinusoidal", "sinusoidal_fairseq"])
def test_sinusoidal_tables_take_the_position_offset(kind: str) -> None:
    table = {"sinusoidal": sinusoidal, "sinusoidal_fairseq": sinusoidal_fairseq}[kind]
    model = build(tiny(absolute_positions=kind, position_offset=2, layer_positions=("none", "none")))
    ids = tokens()
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        added = model.embed_tokens(ids, positions) - model.embed(ids)
    expected = table(positions + 2, model.cfg.d_model, torch.float32)
    torch.testing.assert_close(added, expected.expand_as(added), rtol=0, atol=1e-6)
    assert (added - table(positions, model.cfg.d_model, torch.float32)).abs().max() > 0.1  # the offset moved it


def test_a_position_offset_without_a_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="position_offset=2: offsets an absolute position table"):
        tiny(position_offset=2)


def test_an_embedding_scale_alone_is_rounded_or_not_only_with_a_scale() -> None:
    """Without a scale there is nothing to round: one ArchConfig, so export compares them equal."""
    assert tiny(embed_scale_unrounded=True) == tiny()
    assert tiny(embed_scale=8.0, embed_scale_unrounded=True) != tiny(embed_scale=8.0)


# ------------------------------------------------------------------------------------------------ op orders
# family -> (spec kwargs, the family's values of the op-order fields whose other value changes bf16)
ORDERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gpt2": (SPECS["gpt2"].kwargs, {"activation": "gelu_tanh"}),
    "gpt_neo": (SPECS["gpt_neo"].kwargs, {"scores_fp32": False, "activation": "gelu_tanh"}),
    "opt": (SPECS["opt"].kwargs, {"scale_query": False}),
    "xglm": (SPECS["xglm"].kwargs, {"scale_query": False, "embed_scale_unrounded": False}),
}
CASES = [(family, field, value) for family, (_, other) in ORDERS.items() for field, value in other.items()]


@pytest.mark.parametrize(("family", "field", "other"), CASES)
def test_each_operation_order_decides_bf16_bits(family: str, field: str, other: Any,
                                                checkpoint: Callable[..., Path]) -> None:
    kwargs, _ = ORDERS[family]
    src = checkpoint(family, torch.bfloat16, **kwargs)
    ref = reference(src, torch.bfloat16)
    assert torch.equal(ours(src, torch.bfloat16), ref)
    assert not torch.equal(ours(src, torch.bfloat16, **{field: other}), ref), (family, field)


def test_per_layer_score_scale_bites(checkpoint: Callable[..., Path]) -> None:
    src = checkpoint("gpt2", torch.float32, **SPECS["gpt2"].kwargs)
    ref = reference(src, torch.float32)
    assert float((ours(src, torch.float32) - ref).abs().max()) <= FP32_TOL
    assert float((ours(src, torch.float32, scale_by_inverse_layer=False) - ref).abs().max()) > 1e-3


# ------------------------------------------------------------------------------------------------ other layouts
LAYOUTS = {
    "opt pre-norm": ("opt", dict(num_hidden_layers=3, ffn_dim=96)),
    "opt pre-norm, projected, no final norm": ("opt", dict(num_hidden_layers=3, ffn_dim=96, word_embed_proj_dim=48,
                                                           _remove_final_layer_norm=True)),
    "opt non-affine, no biases, gelu": ("opt", dict(num_hidden_layers=3, ffn_dim=96, enable_bias=False,
                                                    layer_norm_elementwise_affine=False, activation_function="gelu")),
    "gpt2 reorder_and_upcast_attn": ("gpt2", dict(num_hidden_layers=3, n_inner=96, reorder_and_upcast_attn=True,
                                                  scale_attn_by_inverse_layer_idx=True)),
    "gpt2 unscaled scores": ("gpt2", dict(num_hidden_layers=3, n_inner=96, scale_attn_weights=False)),
    "gpt_neo all global": ("gpt_neo", dict(num_hidden_layers=2, attention_types=[[["global"], 2]],
                                           intermediate_size=96)),
    "xglm unscaled embeddings": ("xglm", dict(hidden_size=48, num_hidden_layers=3, ffn_dim=96,
                                              scale_embedding=False)),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_is_exact_in_fp32_and_bf16(name: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    family, kwargs = LAYOUTS[name]
    for dtype in (torch.float32, torch.bfloat16):
        src = checkpoint(family, dtype, **kwargs)
        assert torch.equal(ours(src, dtype), reference(src, dtype)), (name, dtype)
    to_canonical(src, tmp_path / "canon")
    to_hf(tmp_path / "canon", tmp_path / "back")
    assert tensors_of(tmp_path / "back").keys() == tensors_of(src).keys()
    assert all(torch.equal(t, tensors_of(src)[n]) for n, t in tensors_of(tmp_path / "back").items())


def test_gpt2_original_checkpoint_names_are_read(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    """openai-community/gpt2 stores names without `transformer.` and its causal-mask buffers."""
    src = checkpoint("gpt2", torch.float32, **SPECS["gpt2"].kwargs)
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text((src / "config.json").read_text())
    tensors = {n.removeprefix("transformer."): t.contiguous() for n, t in tensors_of(src).items()}
    for i in range(3):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128))
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, str(old / "model.safetensors"), metadata={"format": "pt"})
    ref = reference(src, torch.float32)
    assert torch.equal(reference(old, torch.float32), ref)  # transformers reads them too
    assert torch.equal(ours(old, torch.float32), ref)


def test_opt_model_checkpoint_names_are_read(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    """Checkpoints saved from OPTModel hold `decoder.*` (the original facebook/opt uploads)."""
    src = checkpoint("opt", torch.float32, **SPECS["opt"].kwargs)
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text((src / "config.json").read_text())
    save_file({n.removeprefix("model."): t.contiguous() for n, t in tensors_of(src).items()},
              str(old / "model.safetensors"), metadata={"format": "pt"})
    ref = reference(src, torch.float32)
    assert torch.equal(reference(old, torch.float32), ref)  # transformers reads them too
    assert torch.equal(ours(old, torch.float32), ref)


def test_xglm_pad_id_that_blanks_a_position_is_refused() -> None:
    """transformers zeroes the table row at pad_token_id: from 2 on, that is a position's row."""
    xglm = FAMILIES["xglm"]
    assert xglm.arch_config({"model_type": "xglm", "pad_token_id": 1}) == xglm.arch_config({"model_type": "xglm"})
    table = XGLMSinusoidalPositionalEmbedding.get_embedding(10, 8, padding_idx=5)
    assert not table[5].any() and table[4].any()  # what the refusal is about
    with pytest.raises(MappingError, match="pad_token_id=5: XGLM zeroes row 5"):
        xglm.arch_config({"model_type": "xglm", "pad_token_id": 5})


# ------------------------------------------------------------------------------------------------ transforms
def test_transpose_and_pieces_invert_bit_for_bit() -> None:
    """c_attn [in, 3*out] -> q, k, v [out, in] and back, for every bit pattern (NaNs, -0.0)."""
    fused = torch.randint(-2**15, 2**15, (6, 12), dtype=torch.int16).view(torch.bfloat16)
    steps = [Chain(Transpose(), Piece(i, 3)).bind({}) for i in range(3)]
    pieces = [s.forward(fused) for s in steps]
    assert [p.shape for p in pieces] == [torch.Size([4, 6])] * 3
    assert torch.equal(pieces[1].view(torch.int16), fused[:, 4:8].t().view(torch.int16))
    back = steps[0].inverse(pieces)
    assert torch.equal(back.view(torch.int16), fused.view(torch.int16))


def test_gpt2_exports_c_attn_fused(checkpoint: Callable[..., Path]) -> None:
    plan = FAMILIES["gpt2"].tensors.plan_export(["layers.0.attn.k.weight", "layers.0.attn.q.weight",
                                                 "layers.0.attn.v.weight", "layers.0.attn.q.bias"])
    assert plan["transformer.h.0.attn.c_attn.weight"][0] == tuple(f"layers.0.attn.{c}.weight" for c in "qkv")
    assert plan["transformer.h.0.attn.c_attn.bias"][0] == "layers.0.attn.q.bias"


def test_embed_dim_shapes_the_embedding_and_head() -> None:
    cfg: ArchConfig = tiny(embed_dim=24, tie_embeddings=False)
    shapes = {n: tuple(t.shape) for n, t in Decoder(cfg).state_dict().items()}
    assert shapes["embed.weight"] == (cfg.vocab_size, 24) and shapes["lm_head.weight"] == (cfg.vocab_size, 24)
    assert shapes["project_in.weight"] == (cfg.d_model, 24) and shapes["project_out.weight"] == (24, cfg.d_model)
    assert "project_in.weight" not in Decoder(tiny()).state_dict()
