"""StableLM's per-head QK LayerNorms beyond what every family gets in test_families.py (its SPECS
entry, "stablelm_qk": fp32 and half parity, bf16 bit-exactness, round trip, cache, both config
styles, card): the weights transformers stores one tensor per head, joined into one canonical
[heads, head_dim] tensor, read from an HF directory by every path (whole, streamed, .bin shards), refused in one
line when a head's tensor is missing, extra or misshapen, and located by verify when the heads are
joined in the wrong order."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from family_specs import SPECS
from hf_models import (
    build_model,
    check_streamed_verify,
    edited_weights,
    load_reference,
    module_outputs,
    save_checkpoint,
)
from safetensors.torch import load_file

import lmconvert
from lmconvert.cli import main
from lmconvert.convert import to_canonical
from lmconvert.verify.prompts import random_batch
from lmconvert.verify.run import verify

SPEC = SPECS["stablelm_qk"]
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16  # the tiny model's (hf_models.TINY)


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(HF directory, canonical directory) of the SPECS model."""
    root = tmp_path_factory.mktemp("stablelm_qk")
    hf = save_checkpoint(build_model(SPEC.model_type, **SPEC.kwargs), root / "hf")
    to_canonical(hf, root / "canonical")
    return hf, root / "canonical"


def test_the_heads_become_the_rows_of_one_canonical_tensor(made: tuple[Path, Path]) -> None:
    hf, canonical = made
    stored, joined = load_file(hf / "model.safetensors"), load_file(canonical / "model.safetensors")
    assert not any("norms." in name for name in joined)
    for which, heads in (("q", HEADS), ("k", KV_HEADS)):
        weight = joined[f"layers.1.attn.{which}_norm.weight"]
        assert weight.shape == (heads, HEAD_DIM) and f"layers.1.attn.{which}_norm.bias" not in joined
        for h in range(heads):
            assert torch.equal(weight[h], stored[f"model.layers.1.self_attn.{which}_layernorm.norms.{h}.weight"])


def test_streamed_verify_reads_the_heads_from_the_hf_directory(made: tuple[Path, Path], tmp_path: Path) -> None:
    """`--max-memory` reads one block's tensors at a time, the joined ones from their rows."""
    hf, _ = made
    assert check_streamed_verify(hf, tmp_path) > 0


def test_heads_spread_over_bin_shards_join_the_same(made: tuple[Path, Path], tmp_path: Path) -> None:
    """A torch .bin checkpoint in three shards, the heads of each layer dealt round them: the rows
    are gathered across files into the same canonical tensors, bit for bit."""
    hf, canonical = made
    state = load_file(hf / "model.safetensors")
    (tmp_path / "bin").mkdir()
    shutil.copy2(hf / "config.json", tmp_path / "bin" / "config.json")
    names, weight_map = sorted(state), {}
    for i in range(3):
        file = f"pytorch_model-{i + 1:05d}-of-00003.bin"
        torch.save({n: state[n] for n in names[i::3]}, tmp_path / "bin" / file)
        weight_map.update(dict.fromkeys(names[i::3], file))
    assert len({weight_map[Q.format(h)] for h in range(HEADS)}) == 3
    (tmp_path / "bin" / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {},
                                                                              "weight_map": weight_map}))
    to_canonical(tmp_path / "bin", tmp_path / "canonical")
    ours, expected = load_file(tmp_path / "canonical" / "model.safetensors"), load_file(canonical / "model.safetensors")
    assert ours.keys() == expected.keys() and all(torch.equal(ours[n], expected[n]) for n in expected)


def drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda tensors: tensors.pop(name)


def add(name: str, like: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[like].clone()
    return edit


def shorten(*names: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        for name in names:
            tensors[name] = tensors[name][:-2].clone()
    return edit


Q = "model.layers.1.self_attn.q_layernorm.norms.{}.weight"
K = "model.layers.0.self_attn.k_layernorm.norms.{}.weight"


@pytest.mark.parametrize(("edit", "fragment"), [
    (drop(Q.format(2)), "lacks row(s) 2 of 'layers.1.attn.q_norm.weight', which config.json says has 4"),
    (add(K.format(2), K.format(0)), "has row(s) 2 the config does not use of 'layers.0.attn.k_norm.weight', which "
                                    "config.json says has 2"),
    (shorten(Q.format(3)), f"tensor '{Q.format(3)}' has shape [14], but '{Q.format(0)}', another row of "
                           "layers.1.attn.q_norm.weight, has [16]"),
    (shorten(*(K.format(h) for h in range(KV_HEADS))), f"tensor '{K.format(0)}' (and 1 more rows of "
                                                       "layers.0.attn.k_norm.weight) has shape [14], but config.json "
                                                       "implies [2, 16]"),
], ids=["missing", "extra", "one-misshapen", "all-misshapen"])
def test_bad_head_tensors_are_refused_in_one_line(made: tuple[Path, Path], tmp_path: Path,
                                                  edit: Callable[[dict[str, torch.Tensor]], None],
                                                  fragment: str) -> None:
    hf, _ = made
    broken = edited_weights(hf, tmp_path / "broken", edit)
    code, _, err = cli("convert", broken, tmp_path / "out")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(broken) in lines[0], err
    assert not (tmp_path / "out").exists()


def swap_query_heads(tensors: dict[str, torch.Tensor]) -> None:
    """Heads 0 and 1 of layer 1's q norm trade places: what joining the rows out of order gives."""
    t = tensors["layers.1.attn.q_norm.weight"]
    tensors["layers.1.attn.q_norm.weight"] = t[[1, 0, 2, 3]].clone()


def test_heads_joined_out_of_order_are_located(made: tuple[Path, Path], tmp_path: Path) -> None:
    hf, canonical = made
    broken = edited_weights(canonical, tmp_path / "broken", swap_query_heads)
    report = verify(broken, hf, seq_len=24, generate=0)
    failure = report.first_failure
    assert not report.passed and failure is not None
    assert (failure.layer, failure.sublayer, failure.name) == (1, "attn.q_norm", "layers.1.attn.q_norm")
    before = report.points[:report.points.index(failure)]
    assert before and all(p.passed and p.max_abs == 0.0 for p in before)
    assert {"layers.1.attn.q", "layers.1.attn.k"} <= {p.name for p in before}
    k_norm = next(p for p in report.points if p.name == "layers.1.attn.k_norm")
    assert k_norm.passed and k_norm.max_abs == 0.0  # the k heads, joined in order, still agree
    # the figures: transformers' q_layernorm (B, H, T, D) against ours (B, T, H, D), element by element
    ids = random_batch(SPEC_VOCAB, 2, 24, 0)
    theirs = module_outputs(load_reference(hf), "model.layers.1.self_attn.q_layernorm", ids).transpose(1, 2)
    ours = module_outputs(lmconvert.load(broken, attention="eager"), "layers.1.attn.q_norm", ids)
    assert failure.max_abs == pytest.approx(float((ours - theirs).abs().max()), rel=1e-6)
    assert float((ours[:, :, 2:] - theirs[:, :, 2:]).abs().max()) == 0.0  # the heads left in place agree


def test_inspect_json_records_the_qk_norm_bias(made: tuple[Path, Path]) -> None:
    _, canonical = made
    arch = json.loads((canonical / "lmconvert.json").read_text())["arch"]
    assert (arch["qk_norm"], arch["qk_norm_weight"], arch["qk_norm_bias"], arch["norm"]["bias"]) == \
        ("head", "per_head", False, True)


SPEC_VOCAB = 128  # hf_models.TINY's vocabulary: verify's random batch draws from it
