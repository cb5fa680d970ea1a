"""Every bad input ends the same way: one line naming the file or argument, the problem and what
to do; exit 2; no traceback; nothing at OUT. Format-specific cases (pickles, GGUF, Meta) live
beside their readers' tests."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest
import torch
from bad_input import Result, assert_clean_failure, lmconvert, lmconvert_process
from hf_models import make_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lmconvert.formats.safetensors_dir import TensorSource


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("good") / "hf")


@pytest.fixture
def src(good: Path, tmp_path: Path) -> Path:
    """A fresh copy of a good checkpoint for a test to break."""
    return Path(shutil.copytree(good, tmp_path / "src"))


def convert(src: Path, tmp_path: Path, *args: str) -> tuple[Result, Path]:
    out = tmp_path / "out"
    return lmconvert("convert", src, out, *args), out


def write_raw(path: Path, header: bytes, data: bytes, length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# ---------------------------------------------------------------- safetensors files

def test_truncated_safetensors(src: Path, tmp_path: Path) -> None:
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "re-download", out=out)


def test_header_length_past_end_of_file(src: Path, tmp_path: Path) -> None:
    write_raw(src / "model.safetensors", b"{}", b"", length=10_000)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "invalid header length", out=out)


def test_header_claims_more_than_100_mb(src: Path, tmp_path: Path) -> None:
    write_raw(src / "model.safetensors", b"{}", b"", length=200_000_000)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "header too large", out=out)


def test_header_not_json(src: Path, tmp_path: Path) -> None:
    write_raw(src / "model.safetensors", b"{not json}      ", b"")
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "invalid JSON", out=out)


@pytest.mark.parametrize("header", [
    {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)},
    {"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)},
], ids=["overlapping", "gapped"])
def test_overlapping_or_gapped_offsets(src: Path, tmp_path: Path, header: dict) -> None:
    write_raw(src / "model.safetensors", json.dumps(header).encode(), b"\0" * 12)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "invalid offset", out=out)


def test_dtype_and_byte_length_disagree(src: Path, tmp_path: Path) -> None:
    write_raw(src / "model.safetensors", json.dumps({"a": entry("F32", [3], 0, 8)}).encode(), b"\0" * 8)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "invalid shape, data type, or offset", out=out)


def test_unknown_dtype(src: Path, tmp_path: Path) -> None:
    write_raw(src / "model.safetensors", json.dumps({"a": entry("Q9", [2], 0, 8)}).encode(), b"\0" * 8)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors", "Q9", out=out)


# ---------------------------------------------------------------- sharded index

def shard(src: Path) -> dict[str, torch.Tensor]:
    """Split src's single file into two shards with an index; return the tensors."""
    tensors = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, part in parts.items():
        save_file({n: tensors[n] for n in part}, str(src / file))
    weight_map = {n: f for f, part in parts.items() for n in part}
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tensors


def edit_index(src: Path, fn) -> None:  # noqa: ANN001
    path = src / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    fn(index["weight_map"])
    path.write_text(json.dumps(index))


def test_index_points_to_missing_shard(src: Path, tmp_path: Path) -> None:
    shard(src)
    (src / "model-00002-of-00002.safetensors").unlink()
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors.index.json", "model-00002-of-00002.safetensors", out=out)


@pytest.mark.parametrize("target", ["../model-00001-of-00002.safetensors", "/etc/passwd", "sub/x.safetensors"])
def test_index_paths_are_never_followed(src: Path, tmp_path: Path, target: str) -> None:
    shard(src)
    edit_index(src, lambda m: m.update({"model.norm.weight": target}))
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "refusing to follow", target, out=out)


def test_tensor_listed_in_two_shards(src: Path, tmp_path: Path) -> None:
    shard(src)
    text = (src / "model.safetensors.index.json").read_text()
    first = '"model.norm.weight": "model-00001-of-00002.safetensors", '
    duplicated = text.replace('"weight_map": {', '"weight_map": {' + first)
    (src / "model.safetensors.index.json").write_text(duplicated)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.norm.weight", "listed twice", out=out)


def test_shard_holds_unlisted_tensor(src: Path, tmp_path: Path) -> None:
    shard(src)
    edit_index(src, lambda m: m.pop("model.norm.weight"))
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "does not list", "model.norm.weight", out=out)


# ---------------------------------------------------------------- tensors against config

def test_missing_required_tensor(src: Path, tmp_path: Path) -> None:
    tensors = load_file(src / "model.safetensors")
    del tensors["lm_head.weight"]  # untied embeddings need it
    save_file(tensors, str(src / "model.safetensors"))
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "lm_head", "lacks", out=out)


def test_unexpected_extra_tensor(src: Path, tmp_path: Path) -> None:
    tensors = load_file(src / "model.safetensors")
    tensors["model.layers.7.mlp.up_proj.weight"] = torch.zeros(96, 64)  # the config has 2 layers
    save_file(tensors, str(src / "model.safetensors"))
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "layers.7", "does not use", out=out)


def test_shape_disagrees_with_config(src: Path, tmp_path: Path) -> None:
    config = json.loads((src / "config.json").read_text())
    config["vocab_size"] = 100
    (src / "config.json").write_text(json.dumps(config))
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "[128, 64]", "[100, 64]", out=out)


# ---------------------------------------------------------------- config.json

def edit_config(src: Path, **changes: object) -> None:
    config = json.loads((src / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (src / "config.json").write_text(json.dumps(config))


def test_config_missing_key(src: Path, tmp_path: Path) -> None:
    config = json.loads((src / "config.json").read_text())
    del config["hidden_size"]
    (src / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    proc, out = convert(src, tmp_path)
    # LlamaConfig has a default (4096), under which the weights no longer fit: named with both shapes
    assert_clean_failure(proc, "4096", out=out)


def test_config_wrong_type(src: Path, tmp_path: Path) -> None:
    edit_config(src, num_hidden_layers="two")
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "config.json", "num_hidden_layers", "int", out=out)


def test_unknown_model_type_lists_families(src: Path, tmp_path: Path) -> None:
    edit_config(src, model_type="mamba9")
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "mamba9", "supported", "llama", out=out)


def test_unknown_rope_type(src: Path, tmp_path: Path) -> None:
    edit_config(src, rope_parameters={"rope_type": "spiral", "rope_theta": 10000.0})
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "spiral", "supported", out=out)


def test_inconsistent_heads(src: Path, tmp_path: Path) -> None:
    edit_config(src, num_key_value_heads=3)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "config.json", "4", "3", out=out)


def test_config_not_json(src: Path, tmp_path: Path) -> None:
    (src / "config.json").write_text("{\"model_type\": ")
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "config.json", "not valid JSON", out=out)


# ---------------------------------------------------------------- non-finite weights

def poison(src: Path, value: float) -> None:
    tensors = load_file(src / "model.safetensors")
    tensors["model.layers.1.self_attn.k_proj.weight"][0, 0] = value
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_weights_are_named(src: Path, tmp_path: Path, value: float) -> None:
    poison(src, value)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.layers.1.self_attn.k_proj.weight", "--allow-nonfinite", out=out)


def test_nonfinite_allowed_on_request(src: Path, tmp_path: Path) -> None:
    poison(src, float("nan"))
    proc, out = convert(src, tmp_path, "--allow-nonfinite")
    assert proc.returncode == 0, proc.stderr
    assert torch.isnan(load_file(out / "model.safetensors")["layers.1.attn.k.weight"][0, 0])


# ---------------------------------------------------------------- output path

def test_output_exists_without_force(good: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = lmconvert("convert", good, out)
    assert_clean_failure(proc, str(out), "--force")
    assert out.is_dir() and not any(out.iterdir())


def test_output_inside_input(src: Path) -> None:
    proc = lmconvert("convert", src, src / "nested")
    assert_clean_failure(proc, "inside the input", out=src / "nested")


def test_output_not_writable(good: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root ignores mode bits; /proc/sys refuses new entries even to root
        parent = Path("/proc/sys")
    else:
        parent = tmp_path / "locked"
        parent.mkdir(mode=0o500)
    proc = lmconvert("convert", good, parent / "out")
    assert_clean_failure(proc, str(parent), "not writable", out=parent / "out")


def test_output_parent_missing(good: Path, tmp_path: Path) -> None:
    proc = lmconvert("convert", good, tmp_path / "no" / "such" / "out")
    assert_clean_failure(proc, "does not exist", out=tmp_path / "no" / "such" / "out")


def test_disk_fills_mid_write(good: Path, tmp_path: Path) -> None:
    """A write that fails half-way (file size limit, as a full disk would): no OUT, no temp files."""
    out = tmp_path / "out"
    limit = (good / "model.safetensors").stat().st_size // 2

    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = lmconvert_process("convert", good, out, preexec_fn=limit_writes)
    stdout, stderr = proc.communicate()
    assert_clean_failure(Result(proc.returncode, stdout, stderr), str(out), "File too large", "nothing was written",
                         out=out)


# ---------------------------------------------------------------- interruption

@pytest.fixture(scope="module")
def larger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Big enough (~100 MB) that a conversion is still running when it is interrupted."""
    return make_checkpoint(tmp_path_factory.mktemp("larger") / "hf", hidden_size=512, intermediate_size=1536,
                           num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, vocab_size=16000)


@pytest.mark.slow
def test_interrupted_conversions_leave_nothing_half_written(larger: Path, tmp_path: Path) -> None:
    """SIGINT or SIGKILL at random points of the writing: OUT is either absent or complete, and a
    re-run succeeds."""
    import random
    import time

    rng = random.Random(0)
    out = tmp_path / "out"

    def started() -> subprocess.Popen:
        proc = lmconvert_process("convert", larger, out, "--force")
        deadline = time.monotonic() + 60
        while proc.poll() is None and not list(tmp_path.glob(".out.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.001)  # until the writing has started
        return proc

    first = started()  # how long the writing takes here, to aim the signals inside it
    begin = time.monotonic()
    first.communicate()
    writing = time.monotonic() - begin
    interrupted = 0
    for attempt in range(6):
        proc = started()
        time.sleep(rng.uniform(0.0, 0.6 * writing))
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT if attempt % 2 == 0 else signal.SIGKILL)
        proc.communicate()
        interrupted += proc.returncode != 0
        if out.exists():  # it finished before the signal, or the rename had happened
            assert lmconvert("verify", out, "--files").returncode == 0
    assert interrupted >= 3, "the signals arrived too late to interrupt anything"
    shutil.rmtree(out, ignore_errors=True)
    proc = lmconvert("convert", larger, out)
    assert proc.returncode == 0, proc.stderr
    assert lmconvert("verify", out, "--files").returncode == 0
    assert not list(tmp_path.glob(".out.tmp-*")), "a killed run's temporary directory was not cleaned up"


# ---------------------------------------------------------------- integrity

def test_flipped_byte_is_named(good: Path, tmp_path: Path) -> None:
    out = tmp_path / "can"
    assert lmconvert("convert", good, out).returncode == 0
    assert lmconvert("verify", out, "--files").returncode == 0
    path = out / "model.safetensors"
    data = bytearray(path.read_bytes())
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
    start = struct.unpack("<Q", data[:8])[0] + 8
    header = json.loads(data[8:start])
    victim = names[len(names) // 2]
    data[start + header[victim]["data_offsets"][0] + 1] ^= 0x01
    path.write_bytes(bytes(data))
    proc = lmconvert("verify", out, "--files")
    assert proc.returncode == 1
    assert f"changed tensor: {victim}" in proc.stdout and "changed file: model.safetensors" in proc.stdout
    assert victim in proc.stderr


def test_changed_header_or_appended_bytes_are_named(good: Path, tmp_path: Path) -> None:
    """A shard's header and length are recorded too: a renamed tensor or bytes appended after the
    last tensor leave every tensor's bytes intact, and are still caught."""
    out = tmp_path / "can"
    assert lmconvert("convert", good, out).returncode == 0
    path = out / "model.safetensors"
    original = path.read_bytes()
    path.write_bytes(original + b"\0" * 8)
    proc = lmconvert("verify", out, "--files")
    assert proc.returncode == 1 and "changed file: model.safetensors" in proc.stdout
    (length,) = struct.unpack("<Q", original[:8])
    header = original[8:8 + length]
    assert b'"format":"pt"' in header
    path.write_bytes(original[:8] + header.replace(b'"format":"pt"', b'"format":"pu"') + original[8 + length:])
    proc = lmconvert("verify", out, "--files")
    assert proc.returncode == 1 and "changed file: model.safetensors" in proc.stdout


def test_version_1_descriptions_with_whole_file_sums_still_verify(good: Path, tmp_path: Path) -> None:
    import hashlib

    """Format 1 recorded sha256 throughout, and whole-file sums for the shards."""
    out = tmp_path / "can"
    assert lmconvert("convert", good, out).returncode == 0
    meta_file = out / "lmconvert.json"
    meta = json.loads(meta_file.read_text())
    assert meta["format_version"] == 2 and meta["hash"] == "blake3" and set(meta["shards"]) == {"model.safetensors"}
    shard = out / "model.safetensors"
    meta["files"] = {name: hashlib.sha256((out / name).read_bytes()).hexdigest()
                     for name in [*meta["files"], "model.safetensors"]}
    with TensorSource(out) as source:
        meta["tensors"] = {name: hashlib.sha256(source.get(name).view(torch.uint8).numpy().tobytes()).hexdigest()
                           for name in meta["tensors"]}
    del meta["shards"], meta["hash"]
    meta["format_version"] = 1
    meta_file.write_text(json.dumps(meta))
    assert lmconvert("verify", out, "--files").returncode == 0
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    proc = lmconvert("verify", out, "--files")
    assert proc.returncode == 1 and "changed file: model.safetensors" in proc.stdout
