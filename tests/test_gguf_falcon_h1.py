"""Falcon-H1 in GGUF (llama.cpp's falcon-h1): llama.cpp's converter folds the muP multipliers into the weights
(FalconH1Model.modify_tensors), and so does lmconvert's export, so the file states no multiplier and reads back as
a Falcon-H1 whose multipliers are all 1. Proven here against the converter's own arithmetic, transcribed (FOLDS):
every tensor of the file is the source's folded so, bit for bit at the file's type; the config read back is that
of the same model with the multipliers left out of its config.json; and the model read back computes the source's
logits within fp32's bar, not bit for bit: each folded weight is rounded once where transformers multiplies an
activation (a product of two rounded values is not the rounded product of the exact ones). llama.cpp itself runs
the files (tests/test_llamacpp.py: logits, greedy decoding, and every tensor equal to its converter's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import build_model, save_checkpoint, token_batch
from test_export_gguf import FLOATS, FP32_MAX_ABS, MODELS, STORED_AS_EXP, as_float32, canonical_of, exported
from test_formats_gguf import cli, logits_of

import lmconvert
from lmconvert.convert import to_canonical
from lmconvert.mappings.tables.transforms import NEG_EXP

KWARGS = MODELS["falcon_h1"]
MULTIPLIERS = ("embedding_multiplier", "lm_head_multiplier", "attention_in_multiplier", "attention_out_multiplier",
               "key_multiplier", "ssm_out_multiplier", "ssm_in_multiplier", "ssm_multipliers", "mlp_multipliers")


def _in_proj(tensor: torch.Tensor, c: dict[str, Any]) -> torch.Tensor:
    """FalconH1Model.modify_tensors' in_proj lines, as llama.cpp's converter has them."""
    tensor = tensor * c["ssm_in_multiplier"]
    zxbcdt_multipliers = c["ssm_multipliers"]
    intermediate_size = c["mamba_d_ssm"]
    groups_time_state_size = c["mamba_n_groups"] * c["mamba_d_state"]
    tensor[:intermediate_size, :] *= zxbcdt_multipliers[0]
    tensor[intermediate_size:2 * intermediate_size, :] *= zxbcdt_multipliers[1]
    tensor[2 * intermediate_size:2 * intermediate_size + groups_time_state_size, :] *= zxbcdt_multipliers[2]
    tensor[2 * intermediate_size + groups_time_state_size:2 * intermediate_size + 2 * groups_time_state_size,
           :] *= zxbcdt_multipliers[3]
    tensor[2 * intermediate_size + 2 * groups_time_state_size:, :] *= zxbcdt_multipliers[4]
    return tensor


# canonical tensor (its ending) -> the converter's fold of it, given config.json (FalconH1Model.modify_tensors)
FOLDS = {
    **{f"mlp.down.{p}": lambda t, c: t * c["mlp_multipliers"][1] for p in ("weight", "bias")},
    **{f"mlp.gate.{p}": lambda t, c: t * c["mlp_multipliers"][0] for p in ("weight", "bias")},
    "attn.k.weight": lambda t, c: t * c["key_multiplier"] * c["attention_in_multiplier"],
    "attn.q.weight": lambda t, c: t * c["attention_in_multiplier"],
    "attn.v.weight": lambda t, c: t * c["attention_in_multiplier"],
    "attn.o.weight": lambda t, c: t * c["attention_out_multiplier"],
    "mixer.out_proj.weight": lambda t, c: t * c["ssm_out_multiplier"],
    "mixer.in_proj.weight": _in_proj,
    "lm_head.weight": lambda t, c: t * c["lm_head_multiplier"],
    "embed.weight": lambda t, c: t * c["embedding_multiplier"],
}


def _folded(name: str, tensor: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    """The converter's tensor: bfloat16 cast to float32 first (its prepare_tensors), then its fold, if any."""
    tensor = tensor if tensor.dtype in (torch.float16, torch.float32) else tensor.float()
    fold = next((f for end, f in FOLDS.items() if name.endswith(end)), None)
    return fold(tensor.clone(), config) if fold else tensor


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("falcon_h1")
    canonical = canonical_of(build_model("falcon_h1", **KWARGS), root)
    return canonical, json.loads((root / "hf" / "config.json").read_text())


@pytest.mark.parametrize("quant", ["f32", "bf16"])
def test_the_file_holds_the_weights_folded_as_llama_cpp_s_converter_folds_them(
        quant: str, source: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    canonical, config = source
    assert not any(v == 1 or (isinstance(v, list) and 1 in v) for v in (config[k] for k in MULTIPLIERS))
    ours = lmconvert.load(exported(canonical, tmp_path / "m.gguf", quant), attention="eager").state_dict()
    theirs = lmconvert.load(canonical, attention="eager").state_dict()
    assert set(ours) == set(theirs)
    folded = 0
    for name, tensor in theirs.items():
        if name.endswith(STORED_AS_EXP):  # llama.cpp's -exp(A_log), read back as log(-A): test_export_gguf's bar
            back = torch.log(-NEG_EXP.inverse(tensor.float()))
            assert bool(((back - tensor).abs() <= 2 * torch.finfo(torch.float32).eps * tensor.abs().clamp(min=1))
                        .all()), name
            continue
        expected = _folded(name, tensor, config).to(FLOATS[quant])
        folded += not torch.equal(expected, tensor.to(FLOATS[quant]))
        assert torch.equal(ours[name], expected), name
    assert folded == 2 + 2 * 10  # the embeddings, the LM head and each layer's ten folded tensors changed


def test_it_reads_back_as_the_model_with_unit_multipliers(source: tuple[Path, dict[str, Any]],
                                                          tmp_path: Path) -> None:
    """The config read back is the source's without its multipliers (transformers' defaults, 1), and the model
    computes the source's logits within fp32's bar (measured 4.7e-6, 1.9e-6 x the logits' scale)."""
    canonical, _ = source
    out = exported(canonical, tmp_path / "m.gguf", "f32")
    unit = save_checkpoint(build_model("falcon_h1", **{k: v for k, v in KWARGS.items() if k not in MULTIPLIERS}),
                           tmp_path / "unit")
    to_canonical(unit, tmp_path / "unit-canonical")
    back, ours = lmconvert.load(out, attention="eager"), lmconvert.load(canonical, attention="eager")
    assert as_float32(back.cfg) == as_float32(lmconvert.load(tmp_path / "unit-canonical").cfg)
    ids = token_batch(seq=28)
    theirs, mine = logits_of(back, ids), logits_of(ours, ids)
    diff = (theirs - mine).abs().max()
    print(f"falcon_h1 read back from f32 GGUF: max |Δ| {diff:.1e}, {diff / mine.abs().max():.1e} x scale")
    assert float(diff) <= FP32_MAX_ABS


@pytest.mark.parametrize(("overrides", "fragment"), [
    (dict(attention_bias=True), "does not run attention biases"),
    (dict(mamba_norm_before_gate=True), "does not run the Mamba2 gated norm before the gate"),
    (dict(tie_word_embeddings=True), "folds the tied embedding matrix once, by embedding_multiplier=2.3"),
    (dict(mamba_conv_bias=False), "requires blk.0.ssm_conv1d.bias"),
    (dict(mamba_proj_bias=True), "has no tensor for layers.0.mixer.in_proj.bias"),
    (dict(time_step_limit=[0.01, 3.0]), "metadata cannot express this model's mixer_settings"),
])
def test_what_llama_cpp_s_falcon_h1_does_not_run_is_refused_by_name(overrides: dict[str, Any], fragment: str,
                                                                     tmp_path: Path) -> None:
    canonical = canonical_of(build_model("falcon_h1", **{**KWARGS, **overrides}), tmp_path)
    code, _, err = cli("convert", canonical, tmp_path / "m.gguf", "--to", "gguf")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.slow  # 14 s on 2 cores: verify runs transformers' Mamba2 reference path twice
def test_verify_takes_the_file_s_own_weights_as_its_reference(source: tuple[Path, dict[str, Any]],
                                                              tmp_path: Path) -> None:
    """`verify OUT.gguf` holds the file to transformers' Falcon-H1 of its own config (unit multipliers) and weights
    (exact here, every point), recorded source or not: the source's inner points are not the file's (its
    in_proj output comes before the muP vector, which the file's in_proj holds), so --reference SRC fails there
    while its logits stay within fp32's bar."""
    canonical, _ = source
    out = exported(canonical, tmp_path / "m.gguf", "f32")
    code, stdout, err = cli("verify", out, "--seq-len", 20, "--generate", 4)
    assert code == 0 and "PASS" in stdout and "max |Δlogit|             0.000e+00" in stdout, (stdout, err)
    code, stdout, _ = cli("verify", out, "--reference", canonical.parent / "hf", "--seq-len", 20, "--generate", 0)
    assert code == 1 and "first failure            layer 0, mixer.in_proj" in stdout, stdout
    logits = float(next(line for line in stdout.splitlines() if line.startswith("max |Δlogit|")).split()[-1])
    assert logits <= FP32_MAX_ABS
