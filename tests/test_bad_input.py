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


# --- resource bounds and file structure (issue 13, sections 4-5) ---
#
# Section 4: what a config claims is bounded by what the files hold, and what verify or generate is
# asked for by the model's positions and the memory it needs, before anything is allocated; every
# JSON input goes through one reader. Section 5: a zero, a wrong type or a missing key in GGUF
# metadata, params.json, lmconvert.json, golden files and tokenizer side files is bad input, said
# in one line. Fuzzers for the same readers are in test_fuzz.py.

from bad_input import TINY_PARAMS, lmconvert_peak, write_tiny_gguf, write_tiny_meta  # noqa: E402
from hf_models import load_reference, save_tiny_tokenizer  # noqa: E402

MB = 2**20


@pytest.fixture(scope="module")
def canonical(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("canonical") / "can"
    assert lmconvert("convert", good, out).returncode == 0
    return out


@pytest.fixture
def can(canonical: Path, tmp_path: Path) -> Path:
    """A fresh copy of a canonical checkpoint for a test to break."""
    return Path(shutil.copytree(canonical, tmp_path / "can"))


def edit_meta(can: Path, fn) -> None:  # noqa: ANN001
    path = can / "lmconvert.json"
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def nested(depth: int = 200_000) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


# ---------------------------------------------------------------- claims bounded by the files


def test_config_claiming_a_million_layers_is_refused_before_building_them(src: Path, tmp_path: Path) -> None:
    edit_config(src, num_hidden_layers=1_000_000)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, str(src), "holds 2 layers", "num_hidden_layers=1000000", out=out)


def test_a_lone_high_layer_index_does_not_buy_layers(src: Path, tmp_path: Path) -> None:
    """One tensor named `layers.999999` beside two real layers: the claim is still capped by the
    number of tensors, so nothing is built for a million layers."""
    tensors = load_file(src / "model.safetensors")
    tensors["model.layers.999999.mlp.up_proj.weight"] = torch.zeros(96, 64)
    save_file(tensors, str(src / "model.safetensors"))
    edit_config(src, num_hidden_layers=1_000_000)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "holds tensors for at most", "num_hidden_layers=1000000", out=out)


def test_canonical_description_claiming_a_million_layers(can: Path) -> None:
    edit_meta(can, lambda m: m["arch"].update(n_layers=1_000_000, layer_kinds=None, layer_positions=None))
    assert_clean_failure(lmconvert("inspect", can), "holds 2 layers", "arch.n_layers=1000000")


def test_gguf_block_count_of_a_million(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", {"llama.block_count": 1_000_000})
    assert_clean_failure(lmconvert("inspect", path), "holds 2 layers", "llama.block_count=1000000")


def test_meta_n_layers_of_a_million(tmp_path: Path) -> None:
    meta = write_tiny_meta(tmp_path / "meta", {**TINY_PARAMS, "n_layers": 1_000_000})
    proc = lmconvert("convert", meta, tmp_path / "out")
    assert_clean_failure(proc, "consolidated.00.pth", "holds 2 layers", "n_layers=1000000", out=tmp_path / "out")


def test_hostile_claims_fail_within_the_memory_the_files_justify(src: Path, can: Path, tmp_path: Path) -> None:
    """Peak RSS of the refusal, against the same command on the good files: before the bound, the
    million-layer config.json alone took 2.7 GB and 30 s to be refused."""
    fine, baseline = lmconvert_peak("inspect", src)
    assert fine.returncode == 0, fine.stderr
    edit_config(src, num_hidden_layers=10_000_000)
    proc, peak = lmconvert_peak("inspect", src)
    assert_clean_failure(proc, "num_hidden_layers=10000000")
    assert peak < baseline + 50 * MB, (peak, baseline)
    edit_meta(can, lambda m: m["arch"].update(n_layers=10_000_000, layer_kinds=None, layer_positions=None))
    proc, peak = lmconvert_peak("inspect", can)
    assert_clean_failure(proc, "arch.n_layers=10000000")
    assert peak < baseline + 50 * MB, (peak, baseline)


def test_verify_requests_fail_within_the_memory_a_good_run_uses(canonical: Path) -> None:
    """A batch of 10**9 sequences is refused before anything is allocated for it: the refusal
    costs no more than a real verify of the tiny model (whose peak is mostly torch itself)."""
    fine, baseline = lmconvert_peak("verify", canonical, "--seq-len", 16, "--generate", 2)
    assert fine.returncode == 0, fine.stderr
    for args in (("--batch", 10**9), ("--seq-len", 10**9), ("--generate", 10**9)):
        proc, peak = lmconvert_peak("verify", canonical, *args)
        assert_clean_failure(proc, args[0])
        assert peak < baseline + 20 * MB, (args, peak, baseline)


# ---------------------------------------------------------------- verify and generate requests


@pytest.mark.parametrize("args, fragments", [
    (("--seq-len", 10**9), ["--seq-len 1000000000", "max_positions 128"]),
    (("--generate", 10**9), ["--generate 1000000000", "max_positions 128"]),
    (("--batch", 10**9), ["--batch 1000000000", "available", "lower --seq-len, --batch or --generate"]),
    (("--batch", 10**6, "--seq-len", 128), ["--batch 1000000", "TB of memory"]),
], ids=["seq-len", "generate", "batch", "batch-times-seq-len"])
def test_verify_request_beyond_positions_or_memory(good: Path, args: tuple, fragments: list[str]) -> None:
    assert_clean_failure(lmconvert("verify", good, *args), *fragments)


def test_memory_bound_follows_the_address_space_limit(good: Path) -> None:
    """Under `ulimit -v` (RLIMIT_AS) of 4 GB, what verify may use is what that limit leaves, however
    much memory the machine has free: 10,000 x 64 tokens (11 GB of hidden states) are refused."""
    limit = 4 * 10**9

    def limit_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = lmconvert_process("verify", good, "--batch", 10_000, "--seq-len", 64, preexec_fn=limit_address_space)
    stdout, stderr = proc.communicate()
    err = assert_clean_failure(Result(proc.returncode, stdout, stderr), "--batch 10000 x --seq-len 64", "available")
    available = err.split("more than the ")[1].split(" available")[0]
    value, unit = available.split()
    assert unit in ("GB", "MB") and float(value) * {"GB": 10**9, "MB": 10**6}[unit] <= limit, err


def test_verify_on_cuda_is_held_to_the_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """What lives on the device at the peak, the logits (B x T x vocab) and one layer's eager
    attention scores (B x heads x T x T), fp32, must fit its free memory as torch.cuda.mem_get_info
    reports it: exactly enough passes, a byte less is refused."""
    from lmconvert.arch import ArchConfig
    from lmconvert.formats.errors import InputError
    from lmconvert.verify import budget

    arch = ArchConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, d_ff=96, max_positions=128)
    on_device = 2 * 64 * 128 * 4 + 2 * 4 * 64 * 64 * 4
    for free in (on_device, on_device - 1):
        monkeypatch.setattr(budget, "device_free", lambda device, free=free: free if device == "cuda:0" else None)
        if free == on_device:
            budget.check_request(arch, 2, 64, 16, "cuda:0")
        else:
            with pytest.raises(InputError, match=f"needs at least {on_device:,} bytes on cuda:0"):
                budget.check_request(arch, 2, 64, 16, "cuda:0")


@pytest.fixture(scope="module")
def talking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF checkpoint with a real tokenizer, for generate."""
    from hf_models import make_checkpoint

    directory = make_checkpoint(tmp_path_factory.mktemp("talking") / "hf", vocab_size=300)
    save_tiny_tokenizer(directory)
    return directory


@pytest.fixture
def speaker(talking: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(talking, tmp_path / "hf"))


def test_prompt_longer_than_max_positions_is_refused(talking: Path) -> None:
    proc = lmconvert("generate", talking, "--prompt", "The capital of France is Paris. " * 60, "--max-new-tokens", 1)
    assert_clean_failure(proc, "--prompt", "more than the model's max_positions 128", "shorten it")


def test_max_new_tokens_past_max_positions_is_refused(talking: Path) -> None:
    proc = lmconvert("generate", talking, "--prompt", "The capital", "--max-new-tokens", 10**9)
    assert_clean_failure(proc, "--max-new-tokens 1000000000", "room for at most", "max_positions 128")


def test_empty_prompt_starts_from_bos(talking: Path) -> None:
    """Documented in --prompt's help: transformers, given BOS alone, continues the same way."""
    from transformers import AutoTokenizer

    proc = lmconvert("generate", talking, "--prompt", "", "--max-new-tokens", 6)
    assert proc.returncode == 0, proc.stderr
    tokenizer = AutoTokenizer.from_pretrained(talking)
    ids = torch.tensor([[tokenizer.bos_token_id]])
    with torch.no_grad():
        theirs = load_reference(talking).generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None,
                                                  pad_token_id=0)
    assert proc.stdout.rstrip("\n") == tokenizer.decode(theirs[0, 1:], skip_special_tokens=True)


def test_empty_prompt_without_bos_is_refused(speaker: Path) -> None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = speaker / name
        if path.exists():
            path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "bos_token"}))
    assert_clean_failure(lmconvert("generate", speaker, "--prompt", ""), "--prompt ''", "no BOS token")


# ---------------------------------------------------------------- JSON inputs: one reader


def test_deeply_nested_config(src: Path, tmp_path: Path) -> None:
    (src / "config.json").write_text(nested())
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "config.json", "not valid JSON", "nested too deeply", out=out)


def test_deeply_nested_description(can: Path) -> None:
    (can / "lmconvert.json").write_text(nested())
    assert_clean_failure(lmconvert("verify", can, "--files"), "lmconvert.json", "nested too deeply")


def test_deeply_nested_index(src: Path, tmp_path: Path) -> None:
    shard(src)
    (src / "model.safetensors.index.json").write_text(nested())
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model.safetensors.index.json", "nested too deeply", out=out)


def test_deeply_nested_params(tmp_path: Path) -> None:
    meta = write_tiny_meta(tmp_path / "meta")
    (meta / "params.json").write_text(nested())
    assert_clean_failure(lmconvert("inspect", meta), "params.json", "nested too deeply")


def test_deeply_nested_generation_config_before_transformers_reads_it(src: Path) -> None:
    """transformers' own reader raises RecursionError on it, from inside verify's reference run."""
    (src / "generation_config.json").write_text(nested())
    assert_clean_failure(lmconvert("verify", src, "--seq-len", 8), "generation_config.json", "nested too deeply")


@pytest.mark.parametrize("content, fragment", [
    (b'{"model_type": "llama", "name": "\xff\xfe"}', "utf-8"),
    (b'{"model_type": "llama", "vocab_size": 1' + b"0" * 5000 + b"}", "digits"),
    (b'{"model_type": "llama", "model_type": "qwen2"}', "listed twice"),
    (b"[1, 2]", "expected a JSON object, found an array"),
], ids=["invalid-utf8", "huge-number", "duplicate-key", "array"])
def test_config_json_that_json_cannot_hold(src: Path, tmp_path: Path, content: bytes, fragment: str) -> None:
    (src / "config.json").write_bytes(content)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "config.json", fragment, out=out)


def test_config_json_larger_than_any_config(src: Path, tmp_path: Path) -> None:
    os.truncate(src / "config.json", 200_000_000)  # sparse: nothing is written, and nothing must be read
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "config.json", "200,000,000 bytes", out=out)


def test_config_json_is_a_directory(src: Path, tmp_path: Path) -> None:
    (src / "config.json").unlink()
    (src / "config.json").mkdir()
    proc, out = convert(src, tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


# ---------------------------------------------------------------- lmconvert.json read back


@pytest.mark.parametrize("change, fragments", [
    (lambda m: m.update(tensors=sorted(m["tensors"])), ["tensors: expected an object", "an array"]),
    (lambda m: m.update(files=sorted(m["files"])), ["files: expected an object", "an array"]),
    (lambda m: m.update(shards={k: "x" for k in m["shards"]}), ["shards['model.safetensors']", "a string"]),
    (lambda m: m["shards"]["model.safetensors"].update(bytes=-1), ["bytes", "integer >= 0"]),
    (lambda m: m.update(source="x"), ["source: expected an object"]),
    (lambda m: m.update(source={"path": 3}), ["source.path"]),
    (lambda m: m.update(dtype="int4"), ["dtype", "'int4'", "'bfloat16'"]),
    (lambda m: m.pop("family"), ["lacks 'family'"]),
    (lambda m: m.update(hash="md5"), ["hash", "'blake3'"]),
    (lambda m: m["arch"].update(n_layers="2"), ["arch.n_layers", "positive integer"]),
    (lambda m: m.update(arch=[]), ["arch: expected an object"]),
], ids=["tensors-list", "files-list", "shard-string", "shard-bytes", "source-string", "source-path", "dtype-int4",
        "no-family", "hash", "n_layers-string", "arch-list"])
def test_description_structure_is_checked_when_read_back(can: Path, change, fragments: list[str]) -> None:  # noqa: ANN001
    edit_meta(can, change)
    for command in (("inspect", can), ("verify", can, "--files")):
        assert_clean_failure(lmconvert(*command), "lmconvert.json", *fragments, "convert the source again")


def test_unknown_dtype_is_never_exported(can: Path, tmp_path: Path) -> None:
    """It used to land in the exported config.json as "dtype": "int4"."""
    edit_meta(can, lambda m: m.update(dtype="int4"))
    out = tmp_path / "hf"
    assert_clean_failure(lmconvert("convert", can, out, "--to", "hf"), "dtype", "'int4'", out=out)


# ---------------------------------------------------------------- GGUF metadata and params.json


@pytest.mark.parametrize("change, fragment", [
    ({"llama.attention.head_count": 0}, "llama.attention.head_count: expected a positive integer, found 0"),
    ({"llama.attention.head_count": "4"}, "llama.attention.head_count: expected a positive integer, found '4'"),
    ({"llama.attention.head_count_kv": -2}, "llama.attention.head_count_kv"),
    ({"llama.embedding_length": 64.0}, "llama.embedding_length"),
    ({"llama.attention.layer_norm_rms_epsilon": 0.0}, "layer_norm_rms_epsilon: expected a positive"),
    ({"llama.block_count": True}, "llama.block_count"),
    ({"split.count": "abc"}, "split.count: expected a positive integer, found 'abc'"),
    ({"tokenizer.ggml.bos_token_id": -1}, "tokenizer.ggml.bos_token_id"),
    ({"general.name": 7}, "general.name"),
], ids=["head_count-0", "head_count-string", "kv-negative", "embedding-float", "eps-0", "block_count-bool",
        "split-count-string", "bos-negative", "name-int"])
def test_gguf_metadata_of_the_wrong_value_or_type(tmp_path: Path, change: dict, fragment: str) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", change)
    out = tmp_path / "out"
    assert_clean_failure(lmconvert("convert", path, out), str(path), fragment, out=out)


def test_tiny_gguf_converts(tmp_path: Path) -> None:
    """The files the GGUF cases above break are good ones."""
    assert lmconvert("convert", write_tiny_gguf(tmp_path / "m.gguf"), tmp_path / "out").returncode == 0


@pytest.mark.parametrize("change, fragment", [
    ({"n_heads": 0}, "n_heads: expected a positive integer, found 0"),
    ({"multiple_of": 0}, "multiple_of: expected a positive integer, found 0"),
    ({"dim": "64"}, "dim: expected a positive integer"),
    ({"n_kv_heads": -1}, "n_kv_heads"),
    ({"norm_eps": 0}, "norm_eps: expected a positive"),
    ({"ffn_dim_multiplier": "big"}, "ffn_dim_multiplier"),
    ({"n_layers": None}, "n_layers"),
    ({"use_scaled_rope": "yes"}, "use_scaled_rope: expected true or false"),
], ids=["n_heads-0", "multiple_of-0", "dim-string", "kv-negative", "eps-0", "multiplier-string", "n_layers-null",
        "scaled-string"])
def test_params_json_of_the_wrong_value_or_type(tmp_path: Path, change: dict, fragment: str) -> None:
    meta = write_tiny_meta(tmp_path / "meta", {**TINY_PARAMS, **change})
    out = tmp_path / "out"
    assert_clean_failure(lmconvert("convert", meta, out), "params.json", fragment, out=out)


def test_tiny_meta_converts(tmp_path: Path) -> None:
    assert lmconvert("convert", write_tiny_meta(tmp_path / "meta"), tmp_path / "out").returncode == 0


# ---------------------------------------------------------------- golden files read back


@pytest.fixture(scope="module")
def golden(canonical: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    file = tmp_path_factory.mktemp("golden") / "golden.safetensors"
    proc = lmconvert("verify", canonical, "--seq-len", 12, "--generate", 3, "--save-golden", file)
    assert proc.returncode == 0, proc.stderr
    return file


def rewrite_golden(golden: Path, tmp_path: Path, tensors: dict | None = None, metadata: dict | None = None) -> Path:
    with safe_open(str(golden), framework="pt") as f:
        old_meta, old = f.metadata(), {n: f.get_tensor(n) for n in f.keys()}
    file = tmp_path / "broken.safetensors"
    new = {n: t.contiguous() for n, t in {**old, **(tensors or {})}.items() if t is not None}
    save_file(new, str(file), {k: v for k, v in {**old_meta, **(metadata or {})}.items() if v is not None})
    return file


def test_golden_file_as_recorded_checks(canonical: Path, golden: Path) -> None:
    assert lmconvert("verify", canonical, "--golden", golden).returncode == 0


@pytest.mark.parametrize("tensors, metadata, fragment", [
    (lambda t: {"ids": t["ids"] - t["ids"].max() - 1}, {}, "negative token id"),
    (lambda t: {"ids": t["ids"].float()}, {}, "'ids' is float32, not integer token ids"),
    (lambda t: {"logits": t["logits"][:, :-1]}, {}, "logits has shape"),
    (lambda t: {"logits": t["logits"][..., :-1], "generation.logits": t["generation.logits"][..., :-1]}, {},
     "do not fit"),
    (lambda t: {"logits": t["logits"][0]}, {}, "logits has shape"),
    (lambda t: {"generation.logits": None}, {}, "without the other"),
    (lambda t: {"generation.sequences": t["generation.sequences"] + 1}, {}, "generation.sequences"),
    (lambda t: {"generation.logits": t["generation.logits"][:, :1]}, {}, "generation.logits has shape"),
    (lambda t: {}, {"own_errors": "[1, 2]"}, "own_errors: expected an object"),
    (lambda t: {}, {"own_errors": '{"embed": "x"}'}, "own_errors['embed']"),
    (lambda t: {}, {"prompt_tokens": "-3"}, "prompt_tokens"),
    (lambda t: {}, {"prompt_tokens": "99"}, "generation.sequences"),
    (lambda t: {}, {"reference_error": '"big"'}, "reference_error"),
    (lambda t: {}, {"tolerance": '{"dtype": "float32"}'}, "does not fit dtype float32"),
    (lambda t: {}, {"tolerance": '{"dtype": "float32", "logits_max_abs": -1, "point_rtol": 1}'}, "logits_max_abs"),
    (lambda t: {}, {"info": nested()}, "nested too deeply"),
    (lambda t: {}, {"info": "{not json"}, "metadata 'info': not valid JSON"),
    (lambda t: {}, {"dtype": "int4"}, "dtype"),
], ids=["negative-id", "float-ids", "logits-rows", "logits-vocab", "logits-2d", "half-generation",
        "generation-prompt", "generation-logits", "own-errors-list", "own-errors-string", "prompt-negative",
        "prompt-too-long", "reference-error-string", "tolerance-incomplete", "tolerance-negative", "nested-info",
        "info-not-json", "dtype-int4"])
def test_golden_file_structure_is_checked_when_read_back(canonical: Path, golden: Path, tmp_path: Path, tensors,  # noqa: ANN001
                                                         metadata: dict, fragment: str) -> None:
    with safe_open(str(golden), framework="pt") as f:
        old = {n: f.get_tensor(n) for n in f.keys()}
    broken = rewrite_golden(golden, tmp_path, tensors(old), metadata)
    assert_clean_failure(lmconvert("verify", canonical, "--golden", broken), "--golden", fragment)


def test_golden_file_recorded_with_more_positions_than_the_model(canonical: Path, golden: Path,
                                                                 tmp_path: Path) -> None:
    with safe_open(str(golden), framework="pt") as f:
        old = {n: f.get_tensor(n) for n in f.keys()}
    wide = {"ids": old["ids"].repeat(1, 11), "logits": old["logits"].repeat(1, 11, 1),
            "generation.sequences": None, "generation.logits": None}
    wide.update({n: None for n in old if n.startswith("points.")})
    broken = rewrite_golden(golden, tmp_path, wide)
    assert_clean_failure(lmconvert("verify", canonical, "--golden", broken), "132 tokens per sequence",
                         "max_positions 128", "recorded for another model")


# ---------------------------------------------------------------- tokenizer and generation side files


def test_generation_config_not_json(speaker: Path) -> None:
    (speaker / "generation_config.json").write_text("eos_token_id = 2")
    assert_clean_failure(lmconvert("generate", speaker, "--prompt", "The"), "generation_config.json",
                         "not valid JSON")


def test_generation_config_of_the_wrong_type(speaker: Path) -> None:
    (speaker / "generation_config.json").write_text(json.dumps({"eos_token_id": "2"}))
    assert_clean_failure(lmconvert("generate", speaker, "--prompt", "The"), "generation_config.json",
                         "eos_token_id")


@pytest.mark.parametrize("content, fragment", [
    ('{"model": 3}', "model: expected an object"),
    ('{"version": "1.0"}', "lacks 'model'"),
    ('{"model": {"type": "BPE"}, "added_tokens": [{"id": -1, "content": "x"}]}', "added_tokens[0].id"),
    ("[]", "expected a JSON object"),
    (nested(), "nested too deeply"),
], ids=["model-int", "no-model", "negative-id", "array", "nested"])
def test_tokenizer_json_of_the_wrong_structure(speaker: Path, content: str, fragment: str) -> None:
    (speaker / "tokenizer.json").write_text(content)
    assert_clean_failure(lmconvert("generate", speaker, "--prompt", "The"), "tokenizer.json", fragment)


def test_tokenizer_that_tokenizers_cannot_load_is_one_line(speaker: Path) -> None:
    tokenizer = json.loads((speaker / "tokenizer.json").read_text())
    tokenizer["model"]["type"] = "NoSuchModel"
    (speaker / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert_clean_failure(lmconvert("generate", speaker, "--prompt", "The"), "its tokenizer cannot be loaded")


def test_tokenizer_needing_custom_code_is_refused_in_one_line(speaker: Path) -> None:
    """transformers says so in three lines, and on a terminal asks whether to run the code."""
    path = speaker / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="MyTokenizer", auto_map={"AutoTokenizer": ["tokenization_my.MyTokenizer", None]})
    path.write_text(json.dumps(config))
    assert_clean_failure(lmconvert("generate", speaker, "--prompt", "The"), "tokenizer_config.json",
                         "custom code (auto_map)", "never runs")
