"""`verify` names where parity breaks: a mapping broken on purpose in one layer of a perturbed tiny
model is reported at that layer and sublayer, in fp32 and in low precision, with the figures
transformers' own modules give; every family's points are all found from its tensor table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from family_specs import SPECS
from hf_models import build_model, load_reference, module_outputs, perturb, save_checkpoint
from hf_models import edited_weights as broken_copy

import lmconvert
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.cli import main
from lmconvert.convert import to_canonical
from lmconvert.mappings import MappingError, family_for
from lmconvert.mappings.tables.table import TensorTable
from lmconvert.verify.layouts import unobserved
from lmconvert.verify.prompts import random_batch
from lmconvert.verify.run import verify
from lmconvert.verify.trace import bias_outside, point_modules, sublayer_of

GEMMA2 = SPECS["gemma2"]
LLAMA = dict(head_dim=16, attention_bias=True)  # 2 KV heads of 16 dims, biases to swap as well


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """(HF directory, canonical directory) per model, built once."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in cache:
            model_type, kwargs = {"gemma2": ("gemma2", GEMMA2.kwargs), "llama": ("llama", LLAMA)}[name]
            root = tmp_path_factory.mktemp(name)
            hf = save_checkpoint(build_model(model_type, **kwargs), root / "hf")
            to_canonical(hf, root / "canonical")
            cache[name] = hf, root / "canonical"
        return cache[name]

    return get


def drop_norm_offset(tensors: dict[str, torch.Tensor]) -> None:
    """Gemma stores w and computes (1 + w): a mapping that forgot the offset computes w alone."""
    tensors["layers.1.mlp_norm.weight"] -= 1.0


def swap_kv_heads(tensors: dict[str, torch.Tensor]) -> None:
    """KV heads 0 and 1 of layer 1 trade places in k and v (weights and biases)."""
    for name in ("k", "v"):
        for part in ("weight", "bias"):
            t = tensors[f"layers.1.attn.{name}.{part}"]
            tensors[f"layers.1.attn.{name}.{part}"] = torch.cat((t[16:32], t[:16], t[32:]))


def test_gemma2_norm_without_its_offset_is_located(made: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    hf, canonical = made("gemma2")
    broken = broken_copy(canonical, tmp_path / "broken", drop_norm_offset)
    code, out, err = cli("verify", broken, "--reference", hf, "--seq-len", 24, "--json", tmp_path / "r.json")
    assert code == 1 and "first at layers.1.mlp_norm" in err
    report = json.loads((tmp_path / "r.json").read_text())
    failure = report["first_failure"]
    assert (failure["layer"], failure["sublayer"], failure["name"]) == (1, "mlp_norm", "layers.1.mlp_norm")
    assert "layer 1, mlp_norm" in out and "FAIL at mlp_norm  <- first" in out
    # every point before it agrees exactly, every point of layer 0 included
    names = [p["name"] for p in report["points"]]
    before = report["points"][:names.index("layers.1.mlp_norm")]
    assert before and all(p["passed"] and p["max_abs"] == 0.0 for p in before)
    assert any(p["name"] == "layers.0.mlp_norm" for p in before)
    # the reported figures are transformers' pre_feedforward_layernorm output against ours, element by element
    ids = verify_ids()
    theirs = module_outputs(load_reference(hf), "model.layers.1.pre_feedforward_layernorm", ids)
    ours = module_outputs(lmconvert.load(broken, attention="eager"), "layers.1.mlp_norm", ids)
    assert failure["max_abs"] == pytest.approx(float((ours - theirs).abs().max()), rel=1e-6)
    assert failure["mean_abs"] == pytest.approx(float((ours - theirs).abs().mean()), rel=1e-6)


def verify_ids() -> torch.Tensor:
    """The batch verify ran: random ids from seed 0, as no tokenizer is present."""
    return random_batch(128, 2, 24, 0)


def test_gemma2_norm_offset_located_in_bf16_by_faithfulness(made: Callable[[str], tuple[Path, Path]],
                                                           tmp_path: Path) -> None:
    hf, canonical = made("gemma2")
    broken = broken_copy(canonical, tmp_path / "broken", drop_norm_offset)
    report = verify(broken, hf, dtype="bfloat16", seq_len=24, generate=0)
    failure = report.first_failure
    assert not report.passed and failure is not None and failure.name == "layers.1.mlp_norm"
    assert failure.reference_error is not None and failure.mean_abs > 1.25 * failure.reference_error
    assert all(p.passed and p.ratio == 1.0 for p in report.points[:report.points.index(failure)])


def test_llama_swapped_kv_heads_are_located(made: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    hf, canonical = made("llama")
    broken = broken_copy(canonical, tmp_path / "broken", swap_kv_heads)
    report = verify(broken, hf, seq_len=24, generate=8)
    failure = report.first_failure
    assert not report.passed and failure is not None
    assert (failure.layer, failure.sublayer) == (1, "attn.k")
    by_name = {p.name: p for p in report.points}
    assert not by_name["layers.1.attn.v"].passed and not by_name["layers.1.attn.o"].passed
    assert by_name["layers.1.attn.q"].passed and all(p.passed for p in report.points if p.layer == 0)
    ids = verify_ids()
    theirs = module_outputs(load_reference(hf), "model.layers.1.self_attn.k_proj", ids)
    ours = module_outputs(lmconvert.load(broken, attention="eager"), "layers.1.attn.k", ids)
    assert failure.max_abs == pytest.approx(float((ours - theirs).abs().max()), rel=1e-6)
    assert "layer 1, attn.k" in report.table()


def interleaved(table: TensorTable, weight: str) -> bool:
    try:
        return bool(getattr(table.to_hf_name(weight)[1], "interleaves", False))
    except MappingError:  # not a tensor of this family: not a point either
        return False


@pytest.mark.parametrize("name", list(SPECS))
def test_every_point_of_every_family_is_compared(name: str, tmp_path: Path) -> None:
    """The tensor table names transformers' module behind every point; a correct conversion
    agrees exactly at each of them, generation included."""
    spec = SPECS[name]
    hf = save_checkpoint(build_model(spec.model_type, **spec.kwargs), tmp_path / "hf")
    report = verify(hf, seq_len=20, generate=6)
    table = family_for(spec.model_type).tensors
    # a projection fused per KV group (GPT-NeoX's qkv) has no transformers module, nor slice of one, to compare with
    # nor a projection whose bias is added outside its module (GPT-NeoX-Japanese's last-layer dense_bias)
    arch = lmconvert.load(hf).cfg
    # nor a point verify declares it cannot observe (AltUp's router, run twice per block; its scale, called past its
    # module's hooks by transformers)
    expected = {p for p, weight in point_modules(arch).items()
                if not interleaved(table, weight) and not bias_outside(table, weight, parameter_shapes(arch))
                and sublayer_of(p) not in unobserved(arch)}
    expected |= {"embed", "final_norm"}
    expected |= {f"layers.{i}" for i in range(lmconvert.load(hf).cfg.n_layers)}
    moe = lmconvert.load(hf).cfg.moe  # a mixture's experts are compared together and each alone
    if moe is not None:
        expected |= {f"{p}.{e}" for p in expected if p.endswith("mlp.experts") for e in range(moe.n_experts)}
    assert {p.name for p in report.points} == expected
    assert report.passed and all(p.max_abs == 0.0 for p in report.points)
    assert report.generation is not None and report.generation.first_difference is None


def test_gemma3_multimodal_points_found_under_the_alternative_prefix(tmp_path: Path) -> None:
    from family_specs import TEXT, VISION
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=1)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(tmp_path / "mm")
    report = verify(tmp_path / "mm", seq_len=16, generate=0)
    assert report.passed
    names = {p.name for p in report.points}
    assert {"layers.2.attn.q_norm", "layers.2.mlp.down", "layers.2", "embed", "final_norm"} <= names
    assert len(names) == 3 * 14 + 2  # 13 weight-owning modules and the output per layer


def test_json_schema(made: Callable[[str], tuple[Path, Path]]) -> None:
    hf, canonical = made("llama")
    code, out, _ = cli("verify", canonical, "--seq-len", 16, "--generate", 4, "--json", "-")
    report = json.loads(out)
    assert code == 0 and report["schema"] == "lmconvert.verify/2" and report["verdict"] == "PASS"
    for key in ("criterion", "checkpoint", "reference", "dtype", "device", "batch", "seq_len", "tokens", "streamed",
                "max_abs", "mean_abs", "kl", "top1", "top5", "points", "layers", "first_failure", "generation",
                "tolerances", "versions"):
        assert key in report
    assert report["tolerances"] == {"dtype": "float32", "logits_max_abs": 1e-5, "point_rtol": 1e-5,
                                    "faithfulness": None}
    assert report["tensor_parallel"] is None  # one process: the absolute bar above, no logits_rtol
    assert report["versions"]["transformers"] and report["versions"]["torch"]
    assert report["layers"][0]["layer"] == "embed" and report["layers"][-1]["layer"] == "final_norm"
    assert report["generation"]["new_tokens"] == 4 and report["generation"]["passed"] is True
    point = report["points"][1]
    assert set(point) >= {"name", "layer", "sublayer", "max_abs", "mean_abs", "limit", "passed", "ratio"}


def test_transformers_last_hidden_state_is_after_the_final_norm(made: Callable[[str], tuple[Path, Path]]) -> None:
    """What reference_trace relies on, in the installed transformers: entry 0 is the embedding
    output, entries 1..N-1 the blocks' outputs, and the last entry the final norm's output, not
    the last block's (which therefore comes from a hook)."""
    hf, _ = made("llama")
    model = load_reference(hf)
    ids = random_batch(128, 2, 12, 0)
    last_block = module_outputs(model, "model.layers.1", ids)
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
        assert len(states) == 3
        assert torch.equal(states[0], model.model.embed_tokens(ids))
        assert torch.equal(states[1], module_outputs(model, "model.layers.0", ids))
        assert torch.equal(states[2], model.model.norm(last_block)) and not torch.equal(states[2], last_block)
