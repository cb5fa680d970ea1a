"""MXFP4 as gpt-oss ships its experts (`*_blocks`, `*_scales`, `quant_method: "mxfp4"`): read and
dequantized exactly as transformers 5.25 dequantizes on CPU, checked against its own
`convert_moe_packed_tensors` and against transformers loading the MXFP4 files with
`Mxfp4Config(dequantize=True)`.

The tiny checkpoint is packed by hand in the published layout (transformers packs MXFP4 only with
triton kernels, on a GPU): each expert's rows in groups of 32 values along the input dimension,
each group a shared E8M0 exponent and 32 E2M1 nibbles, the low nibble first, with
openai/gpt-oss-20b's quantization_config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_specs import SPECS
from hf_models import build_model, save_checkpoint
from safetensors.torch import load_file, save_file
from test_cli import run
from test_fp8 import SEQ_LEN, edited, one_line_refusal
from test_quantized import kept, quantization_config, same_tensors, state
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

import lmconvert
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.verify.run import verify

GPT_OSS_20B_QUANTIZATION = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}


def pack(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[experts, in, out] (transformers' fused layout) -> blocks [experts, out, in / 32, 16] and scales
    [experts, out, in / 32]: per group of 32 inputs, the exponent that brings its largest magnitude
    within E2M1's 6, each value rounded to the nearest E2M1 value."""
    rows = weight.transpose(1, 2).to(torch.float32)  # [experts, out, in]
    experts, out, width = rows.shape
    groups = rows.reshape(experts, out, width // 32, 32)
    largest = groups.abs().amax(-1).clamp(min=2.0 ** -120)
    exponent = torch.ceil(torch.log2(largest / 6.0)).to(torch.int32)
    scaled = groups / torch.ldexp(torch.ones(exponent.shape), exponent).unsqueeze(-1)
    table = torch.tensor(FP4_VALUES)
    codes = (scaled.unsqueeze(-1) - table).abs().argmin(-1).to(torch.uint8)  # nearest, +0 before -0
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exponent + 127).to(torch.uint8)


def mxfp4_copy(src: Path, dst: Path) -> Path:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name + "_blocks"], out[name + "_scales"] = pack(tensor)
        else:
            out[name] = tensor
    dst.mkdir()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = GPT_OSS_20B_QUANTIZATION
    (dst / "config.json").write_text(json.dumps(config))
    for side in src.iterdir():
        if side.name not in ("config.json", "model.safetensors"):
            shutil.copy(side, dst / side.name)
    return dst


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mxfp4")
    plain = save_checkpoint(build_model("gpt_oss", **{**SPECS["gpt_oss"].kwargs, "hidden_size": 64,
                                                      "intermediate_size": 96}),
                            root / "plain", torch.bfloat16, save_original_format=True)
    return mxfp4_copy(plain, root / "mxfp4")


GGUF_KWARGS = {**SPECS["gpt_oss"].kwargs, **SPECS["gpt_oss"].gguf, "hidden_size": 64, "intermediate_size": 96}


@pytest.fixture(scope="module")
def mxfp4_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An MXFP4 gpt-oss whose config llama.cpp's gpt-oss graph expresses (its SwiGLU and YaRN constants),
    and its kept canonical checkpoint."""
    root = tmp_path_factory.mktemp("mxfp4-gguf")
    plain = save_checkpoint(build_model("gpt_oss", **GGUF_KWARGS), root / "plain", torch.bfloat16,
                            save_original_format=True)
    src = mxfp4_copy(plain, root / "mxfp4")
    return src, kept(src, root)


def test_the_copy_is_gpt_oss_published_layout(mxfp4: Path) -> None:
    tensors = load_file(mxfp4 / "model.safetensors")
    assert tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (4, 192, 2, 16)
    assert tensors["model.layers.0.mlp.experts.down_proj_scales"].shape == (4, 64, 3)
    assert "model.layers.0.mlp.experts.gate_up_proj" not in tensors


def test_dequantized_as_transformers_convert_moe_packed_tensors(mxfp4: Path) -> None:
    stored = load_file(mxfp4 / "model.safetensors")
    with open_checkpoint(mxfp4) as checkpoint:
        tensors = checkpoint.source.tensors
        names = [n for n in tensors.names() if n.endswith(("gate_up_proj", "down_proj"))]
        assert len(names) == 4
        for name in names:
            for dtype in (torch.float32, torch.bfloat16):
                ref = convert_moe_packed_tensors(stored[name + "_blocks"], stored[name + "_scales"], dtype=dtype)
                assert torch.equal(tensors.get(name).to(dtype), ref), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verify_against_transformers_loading_mxfp4(mxfp4: Path, dtype: str) -> None:
    """fp32: 0 at every point; bf16: logits bit for bit (gpt-oss's bf16 points are not all 0 for a float
    checkpoint either)."""
    report = verify(mxfp4, seq_len=SEQ_LEN, generate=4, dtype=dtype)
    assert report.passed and report.logits["max_abs"] == 0.0, report.logits
    assert dtype == "bfloat16" or all(p.max_abs == 0.0 for p in report.points)


def test_convert_dequantizes_with_dtype(mxfp4: Path, tmp_path: Path) -> None:
    code, _, err = run("convert", mxfp4, tmp_path / "bf16", "--dtype", "bfloat16")
    assert code == 0, err
    report = verify(tmp_path / "bf16", seq_len=SEQ_LEN, generate=4, dtype="bfloat16")
    assert report.passed and report.logits["max_abs"] == 0.0


@pytest.fixture(scope="module")
def kept_mxfp4(mxfp4: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kept(mxfp4, tmp_path_factory.mktemp("kept"))


def test_kept_canonical_holds_each_experts_rows_of_the_stored_parts(mxfp4: Path, kept_mxfp4: Path) -> None:
    """The canonical checkpoint keeps MXFP4 as stored: expert e's gate is rows 0::2 of its fused
    gate_up blocks and scales, up rows 1::2, down all its rows, each [out, in / 32, 16] and
    [out, in / 32] (the nn.Linear weight [out, in], its groups along the inputs); the biases and every
    other tensor as before, and the quantization_config in lmconvert.json."""
    source, canonical = load_file(mxfp4 / "model.safetensors"), state(kept_mxfp4)
    meta = json.loads((kept_mxfp4 / "lmconvert.json").read_text())
    assert meta["quantization"] == GPT_OSS_20B_QUANTIZATION
    for layer in range(2):
        fused = f"model.layers.{layer}.mlp.experts."
        for e in range(4):
            expert = f"layers.{layer}.mlp.experts.{e}."
            for part in ("blocks", "scales"):
                gate_up, down = source[f"{fused}gate_up_proj_{part}"][e], source[f"{fused}down_proj_{part}"][e]
                assert torch.equal(canonical[f"{expert}gate.weight_{part}"], gate_up[0::2])
                assert torch.equal(canonical[f"{expert}up.weight_{part}"], gate_up[1::2])
                assert torch.equal(canonical[f"{expert}down.weight_{part}"], down)
            assert canonical[f"{expert}gate.weight_blocks"].shape == (96, 2, 16)
            assert canonical[f"{expert}down.weight_scales"].shape == (64, 3)
    assert not any(name.endswith(("gate.weight", "up.weight", "down.weight")) and ".experts." in name
                   for name in canonical)


def test_kept_written_back_bit_for_bit(mxfp4: Path, kept_mxfp4: Path, tmp_path: Path) -> None:
    """`--to hf` from the kept canonical checkpoint, and in one step from the source, writes back the
    source's tensors (blocks and scales fused again, gate and up rows interleaved) and its
    quantization_config, bit for bit."""
    for origin, where in [(kept_mxfp4, "hf"), (mxfp4, "direct")]:
        code, _, err = run("convert", origin, tmp_path / where, "--to", "hf")
        assert code == 0, err
        same_tensors(state(tmp_path / where), load_file(mxfp4 / "model.safetensors"))
        assert quantization_config(tmp_path / where) == GPT_OSS_20B_QUANTIZATION


def test_kept_loads_as_transformers_dequantizes(mxfp4: Path, kept_mxfp4: Path) -> None:
    """`lmconvert.load` of the kept checkpoint holds exactly the experts transformers'
    `convert_moe_packed_tensors` gives (in float32 and bfloat16), split as the family splits them."""
    stored = load_file(mxfp4 / "model.safetensors")
    for dtype in (torch.float32, torch.bfloat16):
        ours = dict(lmconvert.load(kept_mxfp4, dtype=dtype).named_parameters())
        for layer in range(2):
            fused = f"model.layers.{layer}.mlp.experts."
            gate_up = convert_moe_packed_tensors(stored[fused + "gate_up_proj_blocks"],
                                                 stored[fused + "gate_up_proj_scales"], dtype=dtype)
            down = convert_moe_packed_tensors(stored[fused + "down_proj_blocks"], stored[fused + "down_proj_scales"],
                                              dtype=dtype)
            for e in range(4):
                expert = f"layers.{layer}.mlp.experts.{e}."
                assert torch.equal(ours[expert + "gate.weight"], gate_up[e, :, 0::2].t())
                assert torch.equal(ours[expert + "up.weight"], gate_up[e, :, 1::2].t())
                assert torch.equal(ours[expert + "down.weight"], down[e].t())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kept_verifies_against_transformers_loading_mxfp4(kept_mxfp4: Path, dtype: str) -> None:
    report = verify(kept_mxfp4, seq_len=SEQ_LEN, generate=4, dtype=dtype)
    assert report.passed and report.logits["max_abs"] == 0.0, report.logits
    assert dtype == "bfloat16" or all(p.max_abs == 0.0 for p in report.points)


def test_kept_needs_dequantizing_for_meta(kept_mxfp4: Path, tmp_path: Path) -> None:
    assert "--dtype bfloat16" in one_line_refusal(kept_mxfp4, tmp_path / "meta", "--to", "meta")


GU = "model.layers.0.mlp.experts.gate_up_proj"


def _nan(t: dict[str, torch.Tensor]) -> None:
    t[GU + "_scales"][1, 2, 0] = 255


@pytest.mark.parametrize(("config", "tensors", "said"), [
    (lambda q: q.update(swizzle=True), None, "quantization_config.swizzle is an option lmconvert does not handle"),
    (None, _nan, "holds NaN or Inf scales"),
    (None, lambda t: t.update({GU + "_scales": torch.zeros(4, 192, 3, dtype=torch.uint8)}),
     "needs one exponent per group: [4, 192, 2]"),
    (None, lambda t: t.update({GU + "_blocks": torch.zeros(4, 192, 1, 32, dtype=torch.uint8),
                               GU + "_scales": torch.zeros(4, 192, 1, dtype=torch.uint8)}),
     "not [..., rows, groups, 16]"),
    (None, lambda t: t.update({GU + "_blocks": torch.zeros(4, 192, 3, 16, dtype=torch.uint8),
                               GU + "_scales": torch.zeros(4, 192, 3, dtype=torch.uint8)}),
     "but config.json implies"),
    (None, lambda t: t.pop(GU + "_blocks"), "has no 'model.layers.0.mlp.experts.gate_up_proj_blocks' beside it"),
    (None, lambda t: t.update({GU + "_scales": t[GU + "_scales"].to(torch.float32)}), "is float32; MXFP4 blocks"),
], ids=["option", "nan", "scale-shape", "group-size", "claimed-shape", "no-blocks", "float-scales"])
def test_hostile_mxfp4_is_one_line(mxfp4: Path, tmp_path: Path, config: Any, tensors: Any, said: str) -> None:
    src = edited(mxfp4, tmp_path / "src", config=config, tensors=tensors)
    err = one_line_refusal(src, tmp_path / "out", "--dtype", "bfloat16")
    assert said in err, err


def llama_cpp_repacked(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """llama.cpp's own repacking of gpt-oss's MXFP4 experts (`GptOssModel.transform_nibble_layout` and
    `repack_mxfp4` in its converter's conversion/gpt_oss.py, copied as written): the bytes its GGUF holds."""
    t_lo, t_hi = blocks & 0x0F, blocks & 0xF0
    tensor = (t_lo << 4) | (t_hi >> 4)
    blk_a, blk_b = tensor.chunk(2, dim=-1)
    blk_a = torch.stack(((blk_a & 0xF0).reshape(-1, 1), (blk_a << 4).reshape(-1, 1)), dim=2).view(tensor.shape)
    blk_b = torch.stack(((blk_b >> 4).reshape(-1, 1), (blk_b & 0x0F).reshape(-1, 1)), dim=2).view(tensor.shape)
    out = blk_a | blk_b
    out = ((out & 0xF0) >> 4) | ((out & 0x0F) << 4)
    data = torch.cat((scales.unsqueeze(-1), out), dim=-1)
    return data.reshape(data.shape[0], data.shape[1], -1)


def gguf_tensors(path: Path) -> dict[str, Any]:
    import gguf

    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("origin", ["source", "kept"])
def test_gguf_mxfp4_keeps_the_expert_blocks_bit_for_bit(mxfp4_gguf: tuple[Path, Path], tmp_path: Path,
                                                        origin: str) -> None:
    """`--to gguf --quant mxfp4` from the MXFP4 source (in one step) and from its kept canonical
    checkpoint writes each expert tensor as the bytes llama.cpp's own converter makes of the source's
    blocks and scales, and gguf's own MXFP4 dequantizer reads them as transformers dequantizes the
    source."""
    import gguf

    mxfp4, kept_mxfp4 = mxfp4_gguf
    out = tmp_path / "m.gguf"
    code, _, err = run("convert", mxfp4 if origin == "source" else kept_mxfp4, out, "--quant", "mxfp4")
    assert code == 0, err
    stored, written = load_file(mxfp4 / "model.safetensors"), gguf_tensors(out)
    for layer in range(2):
        fused = f"model.layers.{layer}.mlp.experts."
        gate_up = (stored[fused + "gate_up_proj_blocks"], stored[fused + "gate_up_proj_scales"])
        down = (stored[fused + "down_proj_blocks"], stored[fused + "down_proj_scales"])
        expected = {"gate": llama_cpp_repacked(gate_up[0][:, 0::2], gate_up[1][:, 0::2]),
                    "up": llama_cpp_repacked(gate_up[0][:, 1::2], gate_up[1][:, 1::2]),
                    "down": llama_cpp_repacked(*down)}
        floats = {"gate": convert_moe_packed_tensors(*gate_up)[..., 0::2], "up": convert_moe_packed_tensors(*gate_up)[
            ..., 1::2], "down": convert_moe_packed_tensors(*down)}
        for name, want in expected.items():
            tensor = written[f"blk.{layer}.ffn_{name}_exps.weight"]
            assert tensor.tensor_type == gguf.GGMLQuantizationType.MXFP4
            assert torch.equal(torch.from_numpy(np.array(tensor.data)).reshape(want.shape), want), name
            values = gguf.quants.dequantize(np.array(tensor.data), gguf.GGMLQuantizationType.MXFP4)
            assert torch.equal(torch.from_numpy(values), floats[name].transpose(1, 2)), name


def test_gguf_from_mxfp4_dequantizes_then_quantizes(mxfp4_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    """Any other --quant dequantizes the experts, then quantizes them: the file is the one the
    dequantized (float32) canonical checkpoint gives, tensor for tensor."""
    mxfp4 = mxfp4_gguf[0]
    code, _, err = run("convert", mxfp4, tmp_path / "f32", "--dtype", "float32")
    assert code == 0, err
    for quant in ("q8_0", "bf16"):
        for origin, name in [(mxfp4, "direct"), (tmp_path / "f32", "float")]:
            code, _, err = run("convert", origin, tmp_path / f"{name}-{quant}.gguf", "--quant", quant)
            assert code == 0, err
        direct, float_ = gguf_tensors(tmp_path / f"direct-{quant}.gguf"), gguf_tensors(tmp_path / f"float-{quant}.gguf")
        assert set(direct) == set(float_)
        for name, tensor in direct.items():
            assert tensor.tensor_type == float_[name].tensor_type
            assert np.array_equal(np.array(tensor.data), np.array(float_[name].data)), name


def published_config(vocab: int) -> dict[str, Any]:
    """openai/gpt-oss-20b's config.json, every key as published (old-style `rope_scaling`, its own
    `experts_per_token` and `initial_context_length`, the quantization_config), at tiny sizes."""
    layers = 2
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 2, "experts_per_token": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
        "initial_context_length": 32, "initializer_range": 0.02, "intermediate_size": 64,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2), "max_position_embeddings": 1024,
        "model_type": "gpt_oss", "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": layers,
        "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": False, "pad_token_id": 0,
        "quantization_config": GPT_OSS_20B_QUANTIZATION, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 32,
                         "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 8, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": vocab,
    }


def published_repo(root: Path) -> dict[str, bytes]:
    """A tiny gpt-oss repo as openai/gpt-oss-20b is laid out: its config.json keys, its tensor names
    (MXFP4 experts as `*_blocks` / `*_scales`, everything else bfloat16) in shards numbered from 0
    (`model-00000-of-00002.safetensors` ...) with their index, and a tokenizer."""
    from hf_models import save_tiny_tokenizer
    from test_pull import files_of

    vocab = save_tiny_tokenizer(root / "tokenizer")
    config = published_config(vocab)
    sizes = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                    "head_dim", "num_hidden_layers", "num_local_experts", "num_experts_per_tok",
                                    "sliding_window", "vocab_size", "layer_types", "swiglu_limit")}
    plain = save_checkpoint(build_model("gpt_oss", **sizes, rope_parameters={**config["rope_scaling"],
                                                                            "rope_theta": 150000.0}),
                            root / "plain", torch.bfloat16, save_original_format=True)
    tensors = load_file(mxfp4_copy(plain, root / "mxfp4") / "model.safetensors")
    shards = [{n: t for n, t in tensors.items() if f"layers.{i}." in n} for i in range(2)]
    shards.insert(0, {n: t for n, t in tensors.items() if ".layers." not in n})
    names = [f"model-{i:05d}-of-00002.safetensors" for i in range(3)]
    (root / "repo").mkdir()
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, root / "repo" / name, metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {n: name for name, shard in zip(names, shards, strict=True) for n in shard}}
    (root / "repo" / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "repo" / "config.json").write_text(json.dumps(config, indent=2))
    return {**files_of(root / "repo"), **files_of(root / "tokenizer")}


@pytest.mark.slow
def test_pull_a_repo_in_gpt_oss_published_layout(tmp_path: Path) -> None:
    """`lmconvert pull --verify` of a repo laid out as openai/gpt-oss-20b (tests/hub_server.py): kept
    as MXFP4, verified against transformers loading the snapshot with Mxfp4Config(dequantize=True),
    and `--to hf` from it gives back the published tensors and quantization_config bit for bit."""
    from test_pull import pull_verified

    meta = pull_verified("openai/gpt-oss-tiny", published_repo(tmp_path), tmp_path)
    assert meta["quantization"] == GPT_OSS_20B_QUANTIZATION
    assert state(tmp_path / "out")["layers.1.mlp.experts.3.up.weight_blocks"].dtype == torch.uint8
    code, _, err = run("convert", tmp_path / "out", tmp_path / "hf-out", "--to", "hf")
    assert code == 0, err
    same_tensors(state(tmp_path / "hf-out"), state(tmp_path / "repo"))
    assert quantization_config(tmp_path / "hf-out") == GPT_OSS_20B_QUANTIZATION
