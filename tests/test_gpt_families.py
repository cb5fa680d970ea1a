"""The variants the GPT-2-era families brought, each against transformers' own code: `gelu_new`,
fairseq's sinusoidal table, the position offset, and the operation orders that make bf16 exact
(q scaled before q.k, fp32 scores, an unrounded embedding scale). Each order is
shown to matter: with the family's value our bf16 logits are transformers' bit for bit, with the
other value they are not. Then the layouts family_specs does not hold: OPT pre-norm (with and
without the final norm, affine or not), GPT-2's `reorder_and_upcast_attn` and unscaled scores,
GPT-2's and OPT's original checkpoint names. Last, each family's decoder with a hand-written
ArchConfig and hand-renamed weights (no lmconvert.mappings) against transformers."""

from __future__ import annotations

import dataclasses
import math
import os
import re
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
from transformers.models.ctrl.modeling_ctrl import positional_encoding as ctrl_positional_encoding
from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

import lmconvert
from lmconvert.arch import ArchConfig, ConfigError, Decoder, NormConfig
from lmconvert.arch.activations import ACTIVATIONS
from lmconvert.arch.positions import POSITION_TABLES, sinusoidal, sinusoidal_fairseq, sinusoidal_halves
from lmconvert.convert import to_canonical, to_hf
from lmconvert.mappings import FAMILIES, MappingError
from lmconvert.mappings.tables.transforms import Chain, Piece, Transpose
from lmconvert.runtime.streamed import _stage_of, streamed
from lmconvert.verify.trace import our_trace


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
@pytest.mark.bitexact
def test_gelu_new_is_transformers_new_gelu_bit_for_bit(dtype: torch.dtype) -> None:
    x = torch.linspace(-6, 6, 4001).to(dtype)
    assert torch.equal(ACTIVATIONS["gelu_new"](x), NewGELUActivation()(x))


@pytest.mark.bitexact
def test_gelu_new_and_gelu_tanh_round_differently_in_bf16() -> None:
    """The same formula: within fp32 rounding of each other, but not the same bf16 numbers."""
    x = torch.linspace(-6, 6, 4001)
    assert float((ACTIVATIONS["gelu_new"](x) - ACTIVATIONS["gelu_tanh"](x)).abs().max()) < 1e-6
    x = x.bfloat16()
    assert not torch.equal(ACTIVATIONS["gelu_new"](x), ACTIVATIONS["gelu_tanh"](x))


# ------------------------------------------------------------------------------------------------ positions
@pytest.mark.parametrize("dim", [48, 63])
@pytest.mark.bitexact
def test_fairseq_table_is_xglms_bit_for_bit(dim: int) -> None:
    """XGLM's table at row p + 2 (its padding offset) for positions 0..99, odd widths included."""
    theirs = XGLMSinusoidalPositionalEmbedding.get_embedding(102, dim)
    positions = torch.arange(100)
    assert torch.equal(sinusoidal_fairseq(positions + 2, dim, torch.float32), theirs[2:])
    assert not torch.allclose(sinusoidal(positions + 2, dim, torch.float32), theirs[2:], atol=1e-3)


@pytest.mark.parametrize("dim", [48, 63])
@pytest.mark.bitexact
def test_halves_table_is_ctrls_bit_for_bit(dim: int) -> None:
    """CTRL's `positional_encoding` over 256 positions, odd widths included, and at scattered rows;
    neither the interleaved nor fairseq's table."""
    theirs = ctrl_positional_encoding(256, dim, torch.float)
    positions = torch.arange(256)
    assert torch.equal(sinusoidal_halves(positions, dim, torch.float32), theirs)
    rows = torch.tensor([[3, 200, 17], [0, 255, 1]])
    assert torch.equal(sinusoidal_halves(rows, dim, torch.float32), theirs[rows])
    for other in (sinusoidal, sinusoidal_fairseq):
        assert not torch.allclose(other(positions, dim, torch.float32), theirs, atol=1e-3)


@pytest.mark.parametrize("kind", ["sinusoidal", "sinusoidal_fairseq", "sinusoidal_halves"])
def test_sinusoidal_tables_take_the_position_offset(kind: str) -> None:
    table = POSITION_TABLES[kind]
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
@pytest.mark.bitexact
def test_each_operation_order_decides_bf16_bits(family: str, field: str, other: Any,
                                                checkpoint: Callable[..., Path]) -> None:
    kwargs, _ = ORDERS[family]
    src = checkpoint(family, torch.bfloat16, **kwargs)
    ref = reference(src, torch.bfloat16)
    assert torch.equal(ours(src, torch.bfloat16), ref)
    assert not torch.equal(ours(src, torch.bfloat16, **{field: other}), ref), (family, field)


@pytest.mark.parametrize("family", ["opt", "xglm", "gpt_neox"])
@pytest.mark.bitexact
def test_layernorm_weight_order_decides_bf16_bits(family: str, checkpoint: Callable[..., Path]) -> None:
    """torch's LayerNorm kernel applies weight and bias in fp32 before the one cast back: in that
    order these families are transformers' bit for bit in bf16, with the weight applied after the
    cast they are not."""
    spec = SPECS[family]
    src = checkpoint(spec.model_type, torch.bfloat16, **spec.kwargs)
    ref = reference(src, torch.bfloat16)
    norm = lmconvert.load(src).cfg.norm
    assert norm.dtype_order == "scale_then_cast"
    assert torch.equal(ours(src, torch.bfloat16), ref)
    wrong = dataclasses.replace(norm, dtype_order="cast_then_scale")
    assert not torch.equal(ours(src, torch.bfloat16, norm=wrong), ref), family


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.bitexact
def test_conv1d_layout_gives_gpt2_s_half_bits(dtype: torch.dtype, checkpoint: Callable[..., Path]) -> None:
    """GPT-2's Conv1D multiplies by a weight stored [in, out]; ours (`conv1d_linears`) by the same layout:
    bit for bit in bf16 and fp16 on every kernel path. On AVX2 kernels (oneDNN's half-precision GEMMs)
    `linear` over the canonical [out, in] layout rounds otherwise; AVX-512's round these shapes alike,
    so there the layout's effect is not claimed (`make test` runs this again on AVX2's)."""
    src = checkpoint("gpt2", dtype, **SPECS["gpt2"].kwargs)
    ref = reference(src, dtype)
    assert torch.equal(ours(src, dtype), ref)
    if onednn_runs_avx2():
        assert not torch.equal(ours(src, dtype, conv1d_linears=False), ref)


def onednn_runs_avx2() -> bool:
    """Whether oneDNN, which runs the half-precision GEMMs, is held to AVX2 kernels: by its own
    ONEDNN_MAX_CPU_ISA, or by a CPU without AVX-512. torch's ATen capability does not decide it
    (ATEN_CPU_CAPABILITY=avx2 alone leaves oneDNN on AVX-512)."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if limit:
        return limit.startswith("AVX2")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx2" in flags and "avx512f" not in flags


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
@pytest.mark.bitexact
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
    steps = [Chain(Transpose(), Piece(("q", "q", "q"), i)).bind({"q": 4}) for i in range(3)]
    pieces = [s.forward(fused) for s in steps]
    assert [p.shape for p in pieces] == [torch.Size([4, 6])] * 3
    assert torch.equal(pieces[1].view(torch.int16), fused[:, 4:8].t().view(torch.int16))
    back = steps[0].inverse(pieces)
    assert torch.equal(back.view(torch.int16), fused.view(torch.int16))


def test_gpt2_exports_c_attn_fused(checkpoint: Callable[..., Path]) -> None:
    plan = FAMILIES["gpt2"].tensors.plan_export(["layers.0.attn.k.weight", "layers.0.attn.q.weight",
                                                 "layers.0.attn.v.weight", "layers.0.attn.v.bias",
                                                 "layers.0.attn.q.bias", "layers.0.attn.k.bias"], {"q": 64})
    assert plan["transformer.h.0.attn.c_attn.weight"][0] == tuple(f"layers.0.attn.{c}.weight" for c in "qkv")
    assert plan["transformer.h.0.attn.c_attn.bias"][0] == tuple(f"layers.0.attn.{c}.bias" for c in "qkv")
    with pytest.raises(MappingError, match="stored as 3 pieces"):  # a piece missing: nothing to join
        FAMILIES["gpt2"].tensors.plan_export(["layers.0.attn.q.bias"], {"q": 64})


def test_embed_dim_shapes_the_embedding_and_head() -> None:
    cfg: ArchConfig = tiny(embed_dim=24, tie_embeddings=False)
    shapes = {n: tuple(t.shape) for n, t in Decoder(cfg).state_dict().items()}
    assert shapes["embed.weight"] == (cfg.vocab_size, 24) and shapes["lm_head.weight"] == (cfg.vocab_size, 24)
    assert shapes["project_in.weight"] == (cfg.d_model, 24) and shapes["project_out.weight"] == (24, cfg.d_model)
    assert "project_in.weight" not in Decoder(tiny()).state_dict()


# ------------------------------------------------------------------------------------------------ by hand
# Each family's ArchConfig written out by hand and its weights renamed here, independent of
# lmconvert.mappings: the decoder alone against transformers.
LN = NormConfig(kind="layer", eps=1e-5, bias=True, dtype_order="scale_then_cast")
BIASES = dict(q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True)
NONE3 = ("none",) * 3
BY_HAND: dict[str, ArchConfig] = {
    "opt": ArchConfig(vocab_size=128, d_model=80, n_layers=3, n_heads=4, d_ff=96, max_positions=128, norm=LN,
                      norm_placement="post", final_norm=False, **BIASES, activation="relu", gated=False,
                      absolute_positions="learned", position_offset=2, layer_positions=NONE3, scale_query=True,
                      tie_embeddings=True, embed_dim=48),
    "xglm": ArchConfig(vocab_size=128, d_model=48, n_layers=3, n_heads=4, d_ff=96, max_positions=128, norm=LN,
                       **BIASES, activation="gelu", gated=False, absolute_positions="sinusoidal_fairseq",
                       position_offset=2, layer_positions=NONE3, scale_query=True, tie_embeddings=True,
                       embed_scale=math.sqrt(48), embed_scale_unrounded=True),
    "gpt_neo": ArchConfig(vocab_size=128, d_model=64, n_layers=3, n_heads=4, d_ff=96, max_positions=128, norm=LN,
                          o_bias=True, mlp_bias=True, activation="gelu_new", gated=False,
                          absolute_positions="learned", layer_positions=NONE3, layer_kinds=("global", "local", "local"),
                          sliding_window=4, attn_scale=1.0, scores_fp32=True, tie_embeddings=True),
    "gpt2": ArchConfig(vocab_size=128, d_model=64, n_layers=3, n_heads=4, d_ff=96, max_positions=128, norm=LN,
                       **BIASES, activation="gelu_new", gated=False, absolute_positions="learned",
                       layer_positions=NONE3, scale_by_inverse_layer=True, tie_embeddings=True, conv1d_linears=True),
}
# \1 is the layer index, matched by the prefix each family puts in front
FAIRSEQ_LAYER = [(r"self_attn\.(q|k|v)_proj\.", r"attn.\2."), (r"self_attn\.out_proj\.", "attn.o."),
                 (r"self_attn_layer_norm\.", "attn_norm."), (r"fc1\.", "mlp.up."), (r"fc2\.", "mlp.down."),
                 (r"final_layer_norm\.", "mlp_norm.")]
RENAMES: dict[str, list[tuple[str, str]]] = {
    "opt": [(r"model\.decoder\.embed_tokens\.", "embed."), (r"model\.decoder\.embed_positions\.", "pos_embed."),
            (r"model\.decoder\.project_(in|out)\.", r"project_\1."),
            *((rf"model\.decoder\.layers\.(\d+)\.{p}", rf"layers.\1.{r}") for p, r in FAIRSEQ_LAYER)],
    "xglm": [(r"model\.embed_tokens\.", "embed."), (r"model\.layer_norm\.", "final_norm."),
             *((rf"model\.layers\.(\d+)\.{p}", rf"layers.\1.{r}") for p, r in FAIRSEQ_LAYER)],
    "gpt_neo": [(r"transformer\.wte\.", "embed."), (r"transformer\.wpe\.", "pos_embed."),
                (r"transformer\.ln_f\.", "final_norm."), (r"transformer\.h\.(\d+)\.ln_1\.", r"layers.\1.attn_norm."),
                (r"transformer\.h\.(\d+)\.ln_2\.", r"layers.\1.mlp_norm."),
                (r"transformer\.h\.(\d+)\.attn\.attention\.(q|k|v)_proj\.", r"layers.\1.attn.\2."),
                (r"transformer\.h\.(\d+)\.attn\.attention\.out_proj\.", r"layers.\1.attn.o."),
                (r"transformer\.h\.(\d+)\.mlp\.c_fc\.", r"layers.\1.mlp.up."),
                (r"transformer\.h\.(\d+)\.mlp\.c_proj\.", r"layers.\1.mlp.down.")],
}


def by_hand_state(family: str, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' state dict under our names, the tied head left out; GPT-2's Conv1D weights
    transposed by hand and c_attn cut into thirds."""
    state: dict[str, torch.Tensor] = {}
    for name, t in hf.items():
        if name == "lm_head.weight":
            continue
        if family == "gpt2":
            name = name.removeprefix("transformer.")
            simple = {"wte.": "embed.", "wpe.": "pos_embed.", "ln_f.": "final_norm."}
            if name.split(".")[0] + "." in simple:
                state[simple[name.split(".")[0] + "."] + name.split(".", 1)[1]] = t
                continue
            _, layer, *module, kind = name.split(".")
            module = ".".join(module)
            if module == "attn.c_attn":
                for c, piece in zip("qkv", (t.t() if kind == "weight" else t).chunk(3, 0), strict=True):
                    state[f"layers.{layer}.attn.{c}.{kind}"] = piece.contiguous()
                continue
            ours = {"ln_1": "attn_norm", "ln_2": "mlp_norm", "attn.c_proj": "attn.o", "mlp.c_fc": "mlp.up",
                    "mlp.c_proj": "mlp.down"}[module]
            conv = kind == "weight" and "." in module
            state[f"layers.{layer}.{ours}.{kind}"] = t.t().contiguous() if conv else t
            continue
        pattern, repl = next((p, r) for p, r in RENAMES[family] if re.match(p, name))
        state[re.sub(pattern, repl, name)] = t
    return state


@pytest.mark.parametrize("family", list(BY_HAND))
@pytest.mark.bitexact
def test_decoder_by_hand_is_transformers_in_fp32_and_bf16(family: str, checkpoint: Callable[..., Path]) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        src = checkpoint(family, dtype, **SPECS[family].kwargs)
        hf = load_reference(src, dtype)
        model = Decoder(BY_HAND[family])
        model.load_state_dict(by_hand_state(family, hf.state_dict()), strict=True)
        model = model.to(dtype).set_attention("eager").eval()
        with torch.no_grad():
            got, ref = model(IDS).float(), hf(IDS).logits.float()
        if dtype == torch.float32:
            assert float((got - ref).abs().max()) <= FP32_TOL
        assert torch.equal(got, ref), (family, dtype, float((got - ref).abs().max()))


@pytest.mark.parametrize("family", ["opt", "xglm"])
@pytest.mark.bitexact
def test_streamed_forward_is_bit_identical(family: str, checkpoint: Callable[..., Path]) -> None:
    """One stage at a time: OPT-350m's project_in loads with the embedding, project_out with the head."""
    src = checkpoint(family, torch.float32, **SPECS[family].kwargs)
    model = lmconvert.load(src, attention="eager")
    with streamed(src, torch.float32) as stream:
        assert torch.equal(stream(IDS), model(IDS))
        ours, reference = our_trace(stream.model, stream, IDS), our_trace(model, model, IDS)
        assert all(torch.equal(ours.points[k], reference.points[k]) for k in reference.points)
        assert all(p.is_meta for p in stream.model.parameters())
    assert _stage_of("project_in.weight", True) == ("embed",) and _stage_of("project_out.weight", True) == ("head",)
