"""Block-wise FP8 checkpoints as the Hub ships them (DeepSeek-V3, Qwen3-*-FP8): e4m3 `*.weight` beside a
`*.weight_scale_inv` per block, `quantization_config.quant_method = "fp8"`. `convert --dtype` dequantizes
them into a plain float canonical checkpoint exactly as transformers dequantizes on CPU, and `verify` holds
that to transformers loading the FP8 files themselves (`FineGrainedFP8Config(dequantize=True)`).

The tiny FP8 checkpoints are quantized by transformers' own quantizer (`Fp8Quantize`, which runs on CPU
when called directly; `from_pretrained(quantization_config=FineGrainedFP8Config())` asks for a GPU): every
linear weight whose shape the block divides, as transformers' quantizer leaves the others as they are."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_specs import SPECS
from hf_models import build_model, save_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_cli import run
from transformers import AutoModelForCausalLM, FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import Fp8Quantize
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.verify.run import verify

# (family, model kwargs, block): llama's 128x128 blocks leave its 64-row k/v projections unquantized, as
# transformers' quantizer does; qwen3's 32x32 blocks cover every projection
MODELS: dict[str, tuple[str, dict[str, Any], list[int]]] = {
    "llama": ("llama", dict(hidden_size=128, intermediate_size=256, head_dim=32), [128, 128]),
    "qwen3": ("qwen3", SPECS["qwen3"].kwargs, [32, 32]),
}
# DeepSeek-V3 as the Hub ships it: one tensor per expert, each with its scale (transformers fuses the
# experts after dequantizing them); 8x8 blocks divide every projection of the tiny MLA model
DEEPSEEK_V3 = ("deepseek_v3", dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
                                   qk_rope_head_dim=8, v_head_dim=10, num_hidden_layers=3, first_k_dense_replace=1,
                                   n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
                                   n_shared_experts=2, routed_scaling_factor=2.5, n_group=4, topk_group=2,
                                   norm_topk_prob=True), [8, 8])


def fp8_copy(src: Path, dst: Path, block: list[int], scale_dtype: torch.dtype = torch.float32) -> Path:
    """`src` quantized block-wise by transformers' `Fp8Quantize` (the op its FP8 quantizer runs on each
    linear weight: the projections, not the embeddings, head or router), with the config its
    `FineGrainedFP8Config` saves."""
    config = FineGrainedFP8Config(weight_block_size=block, modules_to_not_convert=["lm_head"])
    quantize = Fp8Quantize(FineGrainedFP8HfQuantizer(config))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if name.endswith(".weight") and "proj" in name:
            out.update(quantize._quantize_one(name, tensor))
        else:
            out[name] = tensor
    out = {k: v.to(scale_dtype) if k.endswith("_scale_inv") else v for k, v in out.items()}
    dst.mkdir()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    hf_config = json.loads((src / "config.json").read_text())
    hf_config["quantization_config"] = json.loads(config.to_json_string())
    (dst / "config.json").write_text(json.dumps(hf_config))
    return dst


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    return fp8_maker(tmp_path_factory)


def fp8_maker(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """name (a MODELS key or "deepseek_v3"), scale dtype -> the tiny FP8 checkpoint, made once."""
    made: dict[tuple[str, torch.dtype], Path] = {}

    def get(name: str, scale_dtype: torch.dtype = torch.float32) -> Path:
        if (name, scale_dtype) not in made:
            model_type, kwargs, block = DEEPSEEK_V3 if name == "deepseek_v3" else MODELS[name]
            root = tmp_path_factory.mktemp(f"{name}-fp8")
            plain = save_checkpoint(build_model(model_type, **kwargs), root / "plain", torch.bfloat16,
                                    save_original_format=True)
            made[name, scale_dtype] = fp8_copy(plain, root / "fp8", block, scale_dtype)
        return made[name, scale_dtype]
    return get


def converted(src: Path, out: Path, dtype: str) -> Path:
    code, _, err = run("convert", src, out, "--dtype", dtype)
    assert code == 0, err
    return out


def reference_weights(src: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype,
                                                 quantization_config=FineGrainedFP8Config(dequantize=True))
    return model.state_dict()


def test_the_copy_is_block_wise_fp8(fp8: Callable[..., Path]) -> None:
    with safe_open(fp8("llama") / "model.safetensors", "pt") as f:
        q = f.get_slice("model.layers.0.mlp.gate_proj.weight")
        s = f.get_slice("model.layers.0.mlp.gate_proj.weight_scale_inv")
        assert q.get_dtype() == "F8_E4M3" and q.get_shape() == [256, 128] and s.get_shape() == [2, 1]
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_dtype() == "BF16"  # 64 rows: kept
    assert json.loads((fp8("llama") / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_convert_dequantizes_bit_for_bit_as_transformers(fp8: Callable[..., Path], tmp_path: Path, name: str,
                                                         dtype: str) -> None:
    """Every canonical tensor equals, bit for bit, the one transformers loads from the FP8 files in that
    dtype (the dequantized projections and the float tensors beside them)."""
    src = fp8(name)
    out = converted(src, tmp_path / "canonical", dtype)
    ref = reference_weights(src, getattr(torch, dtype))
    with open_checkpoint(src) as source, open_checkpoint(out) as ours:
        assert set(ours.plan) == set(source.plan)
        for canonical in ours.plan:
            (stored,) = source.stored_names(canonical)
            mine = ours.tensor(canonical)
            assert mine.dtype == getattr(torch, dtype)
            assert torch.equal(mine, source.plan[canonical][1].forward(ref[stored])), canonical
    meta = json.loads((out / "lmconvert.json").read_text())
    assert meta["source"]["quantization"]["config"]["weight_block_size"] == MODELS[name][2]
    assert "quantization" not in meta or not meta["quantization"]  # dequantized: a plain float checkpoint


@pytest.mark.parametrize("name", [*MODELS, "deepseek_v3"])
def test_verify_fp32_parity_against_transformers_dequantizing(fp8: Callable[..., Path], tmp_path: Path,
                                                               name: str) -> None:
    out = converted(fp8(name), tmp_path / "canonical", "float32")
    report = verify(out, seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0
    assert all(p.max_abs == 0.0 for p in report.points)


SEQ_LEN = 28  # longer than qwen3's window


def test_verify_bf16_from_bf16_scales(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """bfloat16 scales (some requantized repos) read as transformers reads them; the bf16 canonical
    checkpoint verifies in bf16 against transformers dequantizing to bf16."""
    out = converted(fp8("qwen3", torch.bfloat16), tmp_path / "canonical", "bfloat16")
    report = verify(out, seq_len=SEQ_LEN, generate=4, dtype="bfloat16")
    assert report.passed and report.logits["max_abs"] == 0.0, report.logits


def one_line_refusal(src: Path, out: Path, *args: str) -> str:
    code, stdout, err = run("convert", src, out, *args)
    assert code == 2, (stdout, err)
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    return err


def test_gguf_dequantizes_then_quantizes(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """GGUF out of an FP8 source (in one step, and from its kept canonical checkpoint) is the file its
    dequantized float32 canonical checkpoint gives, tensor for tensor."""

    same_gguf_as_dequantized(fp8("llama"), tmp_path, ("q8_0", "bf16"))


def same_gguf_as_dequantized(src: Path, tmp_path: Path, quants: tuple[str, ...]) -> None:
    """Each `--quant` GGUF of a quantized `src`, in one step and from its kept canonical checkpoint, is
    the file its float32 canonical checkpoint gives, tensor for tensor."""
    import gguf

    for args, where in [(("--dtype", "float32"), "f32"), ((), "kept")]:
        code, _, err = run("convert", src, tmp_path / where, *args)
        assert code == 0, err
    for quant in quants:
        files = {}
        for origin in (src, tmp_path / "kept", tmp_path / "f32"):
            code, _, err = run("convert", origin, tmp_path / f"{origin.name}-{quant}.gguf", "--quant", quant)
            assert code == 0, err
            files[origin.name] = {t.name: t for t in gguf.GGUFReader(tmp_path / f"{origin.name}-{quant}.gguf").tensors}
        for name, tensor in files["f32"].items():
            for other in (files[src.name], files["kept"]):
                assert other[name].tensor_type == tensor.tensor_type
                assert np.array_equal(np.array(other[name].data), np.array(tensor.data)), name


def test_meta_needs_dequantizing(fp8: Callable[..., Path], tmp_path: Path) -> None:
    assert "--dtype bfloat16" in one_line_refusal(fp8("llama"), tmp_path / "out", "--to", "meta")


def edited(src: Path, dst: Path, config: Callable[[dict[str, Any]], None] | None = None,
           tensors: Callable[[dict[str, torch.Tensor]], None] | None = None) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg["quantization_config"])
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        loaded = load_file(dst / "model.safetensors")
        tensors(loaded)
        save_file(loaded, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(("edit", "said"), [
    (lambda q: q.update(quant_method="hqq"), "quant_method 'hqq'"),
    (lambda q: q.update(fmt="e5m2"), "fmt 'e5m2'"),
    (lambda q: q.update(activation_scheme="static"), "activation_scheme 'static'"),
    (lambda q: q.update(scale_fmt="ue8m0"), "scale_fmt 'ue8m0'"),
    (lambda q: q.update(expert_dtype="fp4"), "expert_dtype 'fp4'"),
    (lambda q: q.update(modules_to_convert=["embed_tokens"]), "modules_to_convert"),
    (lambda q: q.update(weight_block_size=[128]), "weight_block_size [128]"),
    (lambda q: q.update(weight_block_size=[0, 128]), "weight_block_size [0, 128]"),
    (lambda q: q.update(packing="fancy"), "quantization_config.packing"),
], ids=["method", "fmt", "static", "ue8m0", "fp4", "embeddings", "one-size", "zero", "unknown"])
def test_options_not_handled_are_refused_by_name(fp8: Callable[..., Path], tmp_path: Path,
                                                 edit: Callable[[dict[str, Any]], None], said: str) -> None:
    src = edited(fp8("qwen3"), tmp_path / "src", config=edit)
    err = one_line_refusal(src, tmp_path / "out", "--dtype", "bfloat16")
    assert said in err and "config.json" in err
    code, _, err = run("inspect", src)
    assert code == 2 and said in err


def nan_scale(t: dict[str, torch.Tensor]) -> None:
    t["model.layers.1.mlp.up_proj.weight_scale_inv"][0, 0] = float("nan")


def wrong_shape(t: dict[str, torch.Tensor]) -> None:
    t["model.layers.0.self_attn.q_proj.weight_scale_inv"] = torch.ones(3, 2)


def orphan_weight(t: dict[str, torch.Tensor]) -> None:
    del t["model.layers.0.mlp.down_proj.weight_scale_inv"]


def orphan_scale(t: dict[str, torch.Tensor]) -> None:
    t["model.layers.0.self_attn.k_proj.weight_scale_inv"] = torch.ones(1, 1)  # k_proj is bf16


def int_scale(t: dict[str, torch.Tensor]) -> None:
    t["model.layers.0.mlp.down_proj.weight_scale_inv"] = torch.ones(1, 2, dtype=torch.uint8)


def fused_experts_scale(t: dict[str, torch.Tensor]) -> None:
    """transformers' Fp8Quantize names a fused experts tensor's scale so, and its dequantize leaves it unread."""
    t["model.layers.0.mlp.experts.gate_up_proj"] = torch.zeros(4, 256, 128).to(torch.float8_e4m3fn)
    t["model.layers.0.mlp.experts.gate_up_proj_scale_inv"] = torch.ones(4, 2, 1)


@pytest.mark.parametrize(("tensors", "config", "said"), [
    (nan_scale, None, "NaN or Inf scales"),
    (wrong_shape, None, "has shape [3, 2], but 'model.layers.0.self_attn.q_proj.weight' [128, 128] in blocks of "
                        "[128, 128] needs [1, 1]"),
    (None, lambda q: q.update(weight_block_size=[96, 128]), "which weight_block_size [96, 128] does not divide"),
    (orphan_weight, None, "is float8_e4m3fn but has no 'model.layers.0.mlp.down_proj.weight_scale_inv'"),
    (orphan_scale, None, "is bfloat16, not float8_e4m3fn"),
    (int_scale, None, "is uint8; FP8 scales are read as float32 or bfloat16 only"),
    (fused_experts_scale, None, "which is not a module's .weight: transformers 5.25 dequantizes only"),
    (None, lambda q: q.update(weight_block_size=None), "per-tensor FP8 (weight_block_size null) needs one scale"),
], ids=["nan", "scale-shape", "block-does-not-divide", "no-scale", "scaled-float", "uint8-scale", "fused",
        "per-tensor-claim"])
def test_hostile_fp8_inputs_are_one_line(fp8: Callable[..., Path], tmp_path: Path,
                                         tensors: Callable[[dict[str, torch.Tensor]], None] | None,
                                         config: Callable[[dict[str, Any]], None] | None, said: str) -> None:
    src = edited(fp8("llama"), tmp_path / "src", config=config, tensors=tensors)
    err = one_line_refusal(src, tmp_path / "out", "--dtype", "bfloat16")
    assert said in err and "model.safetensors" in err, err


@pytest.mark.slow
def test_inspect_an_fp8_repo_reads_its_headers(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """A Hub FP8 repo's card, from config.json and the safetensors headers over HTTP, is the one its local
    copy has: the pairs are mapped as the float tensors they dequantize to."""
    from hub_server import HubServer
    from test_pull import files_of, hub_env, lmconvert

    local = fp8("qwen3")
    server = HubServer()
    server.add_repo("org/tiny-fp8", [files_of(local)])
    with server:
        env = hub_env(server.url, tmp_path / "hf")
        remote = lmconvert("inspect", "org/tiny-fp8", "--json", env=env)
        assert remote.returncode == 0, remote.stderr
        assert json.loads(remote.stdout) == json.loads(lmconvert("inspect", local, "--json", env=env).stdout)


def test_verify_the_fp8_files_themselves(fp8: Callable[..., Path]) -> None:
    """lmconvert reads the FP8 directory itself dequantized, as transformers does: verify agrees at 0."""
    report = verify(fp8("llama"), seq_len=SEQ_LEN, generate=4)
    assert report.passed and report.logits["max_abs"] == 0.0
    assert all(p.max_abs == 0.0 for p in report.points)


def test_to_hf_writes_plain_float_weights(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """`--to hf --dtype bfloat16` from the FP8 files: a float checkpoint with no quantization_config, whose
    weights transformers loads equal to the ones it dequantizes from the FP8 files."""
    src = fp8("llama")
    code, _, err = run("convert", src, tmp_path / "hf", "--to", "hf", "--dtype", "bfloat16")
    assert code == 0, err
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16).state_dict()
    ref = reference_weights(src, torch.bfloat16)
    assert set(ours) == set(ref)
    assert all(torch.equal(ours[name], ref[name]) for name in ref)
    two_steps = converted(src, tmp_path / "canonical", "bfloat16")  # the same file as through the canonical copy
    code, _, err = run("convert", two_steps, tmp_path / "hf2", "--to", "hf")
    assert code == 0, err
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (tmp_path / "hf2" / "model.safetensors").read_bytes()


def test_scales_in_another_shard(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """Hub FP8 checkpoints are sharded, and a weight's scale may lie in another shard than the weight:
    the converted tensors are those of the same checkpoint in one file."""
    src = fp8("qwen3")
    tensors = load_file(src / "model.safetensors")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(src / "config.json", sharded / "config.json")
    files = {"model-00001-of-00002.safetensors": {k: v for k, v in tensors.items() if not k.endswith("_scale_inv")},
             "model-00002-of-00002.safetensors": {k: v for k, v in tensors.items() if k.endswith("_scale_inv")}}
    for file, held in files.items():
        save_file(held, sharded / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: file for file, held in files.items() for k in held}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    one, two = converted(src, tmp_path / "one", "bfloat16"), converted(sharded, tmp_path / "two", "bfloat16")
    with open_checkpoint(one) as a, open_checkpoint(two) as b:
        assert set(a.plan) == set(b.plan)
        assert all(torch.equal(a.tensor(name), b.tensor(name)) for name in a.plan)


def test_fp8_in_pytorch_model_bin(fp8: Callable[..., Path], tmp_path: Path) -> None:
    """The same pairs in a pytorch_model.bin read as in safetensors."""
    src = fp8("qwen3")
    as_bin = tmp_path / "bin"
    as_bin.mkdir()
    shutil.copy(src / "config.json", as_bin / "config.json")
    torch.save(load_file(src / "model.safetensors"), as_bin / "pytorch_model.bin")
    one, two = converted(src, tmp_path / "one", "float32"), converted(as_bin, tmp_path / "two", "float32")
    with open_checkpoint(one) as a, open_checkpoint(two) as b:
        assert set(a.plan) == set(b.plan)
        assert all(torch.equal(a.tensor(name), b.tensor(name)) for name in a.plan)


def test_e4m3_table_is_torch_s_cast_bit_for_bit() -> None:
    """The lookup that dequantizing reads e4m3 through gives torch's own cast of every code, NaNs and
    -0.0 included, for a strided input too."""
    from lmconvert.formats.fp8 import e4m3_to_float32

    codes = torch.arange(256, dtype=torch.uint8).repeat(3).view(torch.float8_e4m3fn).reshape(3, 256)
    for q in (codes, codes.t()):
        assert torch.equal(e4m3_to_float32(q).view(torch.int32), q.to(torch.float32).view(torch.int32))
