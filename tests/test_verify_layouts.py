"""Each point's layout is declared on both sides and converted by that declaration only.

Gemma 3's transformers module normalises q and k after moving heads before time (B, H, T, D);
ours does it before (B, T, H, D). With T == head_dim, a transposition of time and head_dim keeps
the shape, and a layout guessed from shapes (the permutation closest to ours, as verify used to
pick) matches it exactly. Declared layouts do not guess, so verify fails at the planted point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from family_specs import SPECS
from hf_models import TINY, build_model, load_reference, module_outputs, save_checkpoint
from transformers import AutoConfig

import lmconvert
from lmconvert.mappings import family_for
from lmconvert.verify import layouts, run, trace
from lmconvert.verify.layouts import PointLayoutError, PointLayouts, convert
from lmconvert.verify.prompts import random_batch
from lmconvert.verify.run import verify
from lmconvert.verify.trace import point_modules, sublayer_of

GEMMA3 = SPECS["gemma3"]
HEAD_DIM = GEMMA3.kwargs["head_dim"]
SEQ = HEAD_DIM  # T == head_dim: the two axes a transposition swaps have the same size
PLANTED = "layers.1.attn.q_norm"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(build_model(GEMMA3.model_type, **GEMMA3.kwargs), tmp_path_factory.mktemp("gemma3"))


def transpose_time_and_head_dim(_module: torch.nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
    """Our per-head q norm gives (B, T, H, D); this hands the rest of attention (B, D, H, T) instead,
    the same shape when T == D: a real bug, which changes every later value."""
    assert out.shape[1] == out.shape[3]
    return out.transpose(1, 3)


def planted(load: Callable[..., torch.nn.Module]) -> Callable[..., torch.nn.Module]:
    def loader(*args: object, **kwargs: object) -> torch.nn.Module:
        model = load(*args, **kwargs)
        model.get_submodule(PLANTED).register_forward_hook(transpose_time_and_head_dim)
        return model
    return loader


def closest_permutation(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The guess verify used to make when shapes differed: whichever permutation of `ref` that has
    our shape is closest to ours."""
    candidates = [ref.permute(p) for p in itertools.permutations(range(ref.dim()))
                  if tuple(ref.shape[i] for i in p) == tuple(ours.shape)]
    return min(candidates, key=lambda c: float((c - ours).abs().max()))


def test_a_transposition_between_equal_sizes_is_located(gemma3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify fails at the planted point itself (the closest-permutation guess reported it as exact,
    max |Δ| 0, and first failed at the attention output, one point later)."""
    monkeypatch.setattr(run, "load_checkpoint", planted(run.load_checkpoint))
    report = verify(gemma3, seq_len=SEQ, generate=0)
    failure = report.first_failure
    assert not report.passed and failure is not None and failure.name == PLANTED and failure.problem is None
    assert failure.max_abs > 1e-2
    before = report.points[:report.points.index(failure)]
    assert any(p.name == "layers.0.attn.q_norm" for p in before)
    assert all(p.passed and p.max_abs == 0.0 for p in before)
    assert f"layer 1, attn.q_norm ({PLANTED})" in report.table()


def test_the_old_guess_would_have_hidden_it(gemma3: Path) -> None:
    """On the same values, the closest permutation matches the planted transposition exactly,
    while the declared layout (B H T D -> B T H D) shows the difference; the guess is gone."""
    ids = random_batch(TINY["vocab_size"], 2, SEQ, 0)  # the batch verify runs
    theirs = module_outputs(load_reference(gemma3), "model.layers.1.self_attn.q_norm", ids)  # (B, H, T, D)
    model = lmconvert.load(gemma3, attention="eager")
    model.get_submodule(PLANTED).register_forward_hook(transpose_time_and_head_dim)
    ours = module_outputs(model, PLANTED, ids)  # (B, T, H, D) in shape, (B, D, H, T) in content
    assert torch.equal(closest_permutation(ours, theirs), ours)
    declared = PointLayouts.of(model.cfg, "gemma3_text", *ids.shape).to_ours(PLANTED, theirs)
    assert declared.shape == ours.shape and float((declared - ours).abs().max()) > 1e-2
    assert not hasattr(trace, "align")


def test_a_reference_value_that_does_not_fit_its_declaration_is_not_compared(
        gemma3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A declaration that says Gemma 3's q_norm gives (B, T, H, D): its (B, H, T, D) value does not
    fit, so those points fail with the reason, and nothing else does."""
    monkeypatch.setitem(layouts.TRANSFORMERS_BY_MODEL_TYPE, "gemma3_text",
                        {"attn.q_norm": "B T H D", "attn.k_norm": "B KV T D"})
    report = verify(gemma3, seq_len=SEQ, generate=0)
    failure = report.first_failure
    assert not report.passed and report.logits_passed and failure is not None
    assert failure.name == "layers.0.attn.q_norm" and math.isnan(failure.max_abs)
    assert failure.problem == ("layers.0.attn.q_norm: transformers' (gemma3_text) output does not fit: shape "
                               f"(2, 4, {SEQ}, {HEAD_DIM}) is not (2, {SEQ}, 4, {HEAD_DIM}), "
                               "its declared layout B T H D")
    failed = {p.name for p in report.points if not p.passed}
    assert failed == {f"layers.{i}.attn.q_norm" for i in range(GEMMA3.kwargs["num_hidden_layers"])}
    assert "not compared: layers.0.attn.q_norm" in report.table()
    as_json = next(p for p in report.to_dict()["points"] if p["name"] == failure.name)
    assert as_json["max_abs"] is None and as_json["passed"] is False and "B T H D" in as_json["problem"]


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "olmo2", "phi"])
@pytest.mark.bitexact
def test_qk_norm_families_agree_exactly_where_sizes_repeat(name: str, tmp_path: Path) -> None:
    """With T == head_dim and as many KV heads as query heads, a declaration that swapped T and D
    (or H and KV) would still fit by shape; exact agreement at every point shows each one is right."""
    spec = SPECS[name]
    kwargs = {**spec.kwargs, "head_dim": HEAD_DIM, "num_key_value_heads": 4}
    hf = save_checkpoint(build_model(spec.model_type, **kwargs), tmp_path / "hf")
    report = verify(hf, seq_len=HEAD_DIM, generate=0)
    assert report.passed and all(p.max_abs == 0.0 for p in report.points)
    assert {"layers.0.attn.q_norm", "layers.0.attn.k_norm"} <= {p.name for p in report.points}


@pytest.mark.parametrize("name", list(SPECS))
def test_every_point_kind_of_every_family_is_declared_on_both_sides(name: str) -> None:
    spec = SPECS[name]
    config = AutoConfig.for_model(spec.model_type, **{**TINY, **spec.kwargs})
    arch = family_for(spec.model_type).arch_config(config.to_dict())
    declared = PointLayouts.of(arch, config.get_text_config().model_type, 2, SEQ)
    kinds = {sublayer_of(point) for point in point_modules(arch)} | {"embed", "output", "final_norm"}
    assert kinds <= set(declared.ours) and kinds <= set(declared.theirs)


def test_a_fused_output_gives_each_point_its_segment() -> None:
    """Phi-3's qkv_proj output [q | k | v]: each point takes its bracketed segment, then relays it."""
    sizes = {"B": 2, "T": 3, "H": 2, "KV": 1, "D": 2}
    fused = torch.randn(2, 3, 8)
    assert torch.equal(convert(fused, "B T [H*D]|KV*D|KV*D", "B T H*D", sizes), fused[..., :4])
    assert torch.equal(convert(fused, "B T H*D|[KV*D]|KV*D", "B T KV*D", sizes), fused[..., 4:6])
    assert torch.equal(convert(fused, "B T H*D|KV*D|[KV*D]", "B T KV D", sizes), fused[..., 6:].reshape(2, 3, 1, 2))
    with pytest.raises(PointLayoutError, match=r"does not end in 8, its declared layout B T \[H\*D\]\|KV\*D\|KV\*D"):
        convert(fused[..., :7], "B T [H*D]|KV*D|KV*D", "B T H*D", sizes)


def test_convert_follows_the_declaration_only() -> None:
    sizes = {"B": 2, "T": 3, "H": 3, "D": 3}  # every size but B repeats
    value = torch.randn(2, 3, 3, 3)
    assert torch.equal(convert(value, "B H T D", "B T H D", sizes), value.transpose(1, 2))
    assert torch.equal(convert(value, "B T H D", "B T H*D", sizes), value.reshape(2, 3, 9))
    with pytest.raises(PointLayoutError, match=r"shape \(2, 3, 9\) is not \(2, 3, 3, 3\), its declared layout B H T D"):
        convert(value.reshape(2, 3, 9), "B H T D", "B T H D", sizes)
    with pytest.raises(PointLayoutError, match="do not name the same axes"):
        convert(value, "B H T D", "B T H F", {**sizes, "F": 3})


def test_an_undeclared_point_kind_is_an_error_not_a_guess() -> None:
    """A model type whose QK norms nobody declared (llama has none) cannot have them compared."""
    arch = family_for("qwen3").arch_config(AutoConfig.for_model("qwen3", **TINY, head_dim=16).to_dict())
    with pytest.raises(PointLayoutError, match="no layout is declared for transformers' llama attn.q_norm"):
        PointLayouts.of(arch, "llama", 1, 4).to_ours("layers.0.attn.q_norm", torch.zeros(1, 4, 4, 16))
    value = torch.randn(1, 4, 4, 16)
    assert torch.equal(PointLayouts.of(arch, "qwen3", 1, 4).to_ours("layers.0.attn.q_norm", value), value)
