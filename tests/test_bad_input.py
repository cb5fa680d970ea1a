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
import sys
from pathlib import Path

import pytest
import torch
from bad_input import Result, assert_clean_failure, left_by_a_killed_run, lmconvert, lmconvert_process, lmconvert_run
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
        while (proc.poll() is None and not list(tmp_path.glob(".out.lmconvert-writing-*"))
               and time.monotonic() < deadline):
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
    assert not list(tmp_path.glob(".out.lmconvert-*")), "a killed run's temporary directory was not cleaned up"


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


# --- config.json values (issue 13, section 5) ---
# Only an absent key (or null, where transformers' config class accepts it) means "default": 0, a
# negative count, a string, a bool or a float where an integer belongs is refused where config.json
# enters, in one line naming the file, the key and the value, before verify could reach transformers.

@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real tiny checkpoint per family the cases below break, built once."""
    root = tmp_path_factory.mktemp("families")
    options = {"mistral": dict(sliding_window=4), "qwen2": dict(use_sliding_window=True, sliding_window=4),
               "gemma2": dict(head_dim=16, sliding_window=4)}
    return {name: make_checkpoint(root / name, name, **kwargs) for name, kwargs in options.items()}


def family_src(good: Path, family_checkpoints: dict[str, Path], family: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good if family == "llama" else family_checkpoints[family], tmp_path / "src"))


def set_config(src: Path, **changes: object) -> None:
    """Unlike edit_config, None writes null (the key stays)."""
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **changes}))


# family, key, value, what the message must say besides config.json and the key
BAD_CONFIG_VALUES = [
    ("llama", "num_key_value_heads", 0, "num_key_value_heads=0 should be a positive integer"),
    ("llama", "head_dim", 0, "head_dim=0 should be a positive integer"),
    ("llama", "num_attention_heads", -4, "num_attention_heads=-4 should be a positive integer"),
    ("llama", "hidden_size", 64.0, "hidden_size=64.0 should be a positive integer"),
    ("llama", "num_hidden_layers", True, "num_hidden_layers=true should be a positive integer"),
    ("llama", "num_key_value_heads", "2", 'num_key_value_heads="2" should be a positive integer'),
    ("llama", "rms_norm_eps", 0, "rms_norm_eps=0 should be a positive number"),
    ("llama", "max_position_embeddings", None, "max_position_embeddings=null is not allowed"),
    ("llama", "tie_word_embeddings", 0, "tie_word_embeddings=0 should be a boolean"),
    ("llama", "attention_bias", "false", 'attention_bias="false" should be a boolean'),
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": 0}, "rope_parameters.rope_theta=0"),
    ("llama", "rope_parameters", {"rope_type": "linear", "factor": 0}, "rope_parameters.factor=0"),
    ("mistral", "sliding_window", 0, "sliding_window=0 should be a positive integer"),
    ("mistral", "num_key_value_heads", None, "num_key_value_heads=null is not allowed"),
    ("qwen2", "max_window_layers", -1, "max_window_layers=-1 should be a non-negative integer"),
    ("qwen2", "use_sliding_window", "true", 'use_sliding_window="true" should be a boolean'),
    ("gemma2", "query_pre_attn_scalar", 0, "query_pre_attn_scalar=0 should be a positive number"),
    ("gemma2", "final_logit_softcapping", 0, "final_logit_softcapping=0 should be a positive number"),
    ("gemma2", "head_dim", None, "head_dim=null is not allowed"),
]


@pytest.mark.parametrize(("family", "key", "value", "says"), BAD_CONFIG_VALUES,
                         ids=[f"{f}-{k}={json.dumps(v)}" for f, k, v, _ in BAD_CONFIG_VALUES])
def test_config_value_is_refused_not_defaulted(good: Path, family_checkpoints: dict[str, Path], tmp_path: Path,
                                               family: str, key: str, value: object, says: str) -> None:
    src = family_src(good, family_checkpoints, family, tmp_path)
    set_config(src, **{key: value})
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, str(src / "config.json"), says, out=out)


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_zero_heads_are_refused_before_transformers_runs(src: Path, command: str) -> None:
    """Before: convert took 0 for "unset", and verify died in transformers with ZeroDivisionError."""
    set_config(src, num_key_value_heads=0)
    assert_clean_failure(lmconvert(command, src), "config.json", "num_key_value_heads=0")


@pytest.mark.parametrize("spelling", ["absent", "null"])
def test_absent_or_null_head_dim_means_hidden_over_heads(src: Path, tmp_path: Path, spelling: str) -> None:
    """LlamaConfig accepts a null head_dim and derives it, as it does for an absent one: so does lmconvert."""
    if spelling == "absent":
        edit_config(src, head_dim=None)
    else:
        set_config(src, head_dim=None)
    proc, out = convert(src, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "lmconvert.json").read_text())["arch"]["head_dim"] == 16


# --- outputs, paths, manifest, exit codes (issue 13, sections 1-3, 6-7) ---

def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` and its bytes (a symlink as its target), to show nothing changed."""
    return {str(p.relative_to(path)): os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.fixture(scope="module")
def meta_ready(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LLaMA whose FFN size Meta's layout can state (multiple_of 32 from dim 64: 192)."""
    return make_checkpoint(tmp_path_factory.mktemp("meta_ready") / "hf", intermediate_size=192)


@pytest.fixture(scope="module")
def canonical_ready(meta_ready: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("canonical_ready") / "can"
    assert lmconvert("convert", meta_ready, out).returncode == 0
    return out


@pytest.fixture
def can(canonical_ready: Path, tmp_path: Path) -> Path:
    """A fresh copy of a canonical checkpoint for a test to break."""
    return Path(shutil.copytree(canonical_ready, tmp_path / "can"))


def edit_description(can: Path, fn) -> None:  # noqa: ANN001
    path = can / "lmconvert.json"
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


# ---------------------------------------------------------------- 1. never destroy what the user did not ask to replace

@pytest.mark.parametrize("spelling", ["parent", "parent through ..", "symlink to parent", "itself",
                                      "symlink to itself"])
def test_force_never_replaces_a_directory_holding_the_input(good: Path, tmp_path: Path, spelling: str) -> None:
    """`convert P/src P --force` used to delete the source model and every other file in P."""
    parent = tmp_path / "P"
    parent.mkdir()
    src = Path(shutil.copytree(good, parent / "src"))
    (parent / "notes.txt").write_text("mine")
    (tmp_path / "link-to-P").symlink_to(parent)
    (tmp_path / "link-to-src").symlink_to(src)
    out = {"parent": parent, "parent through ..": src / "..", "symlink to parent": tmp_path / "link-to-P",
           "itself": src, "symlink to itself": tmp_path / "link-to-src"}[spelling]
    before = tree(parent)
    assert_clean_failure(lmconvert("convert", src, out, "--force"), "the input", "choose another OUT")
    assert tree(parent) == before


@pytest.mark.parametrize("kind", ["user directory", "HF checkpoint", "file", "canonical with an added file",
                                  "export with an added file", "another tool's lmconvert.json"])
def test_force_replaces_only_what_lmconvert_wrote(good: Path, tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    if kind == "user directory":
        out.mkdir()
        (out / "thesis.tex").write_text("years of work")
    elif kind == "HF checkpoint":  # a model lmconvert did not write
        shutil.copytree(good, out)
    elif kind == "file":
        out.write_text("not a directory")
    elif kind == "canonical with an added file":
        assert lmconvert("convert", good, out).returncode == 0
        (out / "README.md").write_text("my notes")
    elif kind == "export with an added file":
        assert lmconvert("convert", good, tmp_path / "can").returncode == 0
        assert lmconvert("convert", tmp_path / "can", out, "--to", "hf").returncode == 0
        (out / "README.md").write_text("my notes")
    else:
        out.mkdir()
        (out / "lmconvert.json").write_text(json.dumps({"format": "something-else", "files": {}}))
    before = tree(out) if out.is_dir() else out.read_bytes()
    assert_clean_failure(lmconvert("convert", good, out, "--force"), str(out), "lmconvert", "--force")
    assert (tree(out) if out.is_dir() else out.read_bytes()) == before
    assert not list(tmp_path.glob(".out.lmconvert-*"))


@pytest.mark.parametrize("to", ["canonical", "hf", "meta"])
def test_force_replaces_an_output_lmconvert_wrote(meta_ready: Path, canonical_ready: Path, tmp_path: Path,
                                                  to: str) -> None:
    """Each output says it is lmconvert's: lmconvert.json, or lmconvert-export.json listing its files."""
    src, args = (meta_ready, []) if to == "canonical" else (canonical_ready, ["--to", to])
    out = tmp_path / "out"
    assert lmconvert("convert", src, out, *args).returncode == 0
    description = "lmconvert.json" if to == "canonical" else "lmconvert-export.json"
    if to != "canonical":
        listed = json.loads((out / description).read_text())["files"]
        assert sorted(listed) == sorted(p.name for p in out.iterdir() if p.name != description)
    before = out.stat().st_ino
    proc = lmconvert("convert", src, out, *args, "--force")
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_ino != before and (out / description).is_file()
    assert not list(tmp_path.glob(".out.lmconvert-*"))


@pytest.mark.parametrize("kind, how", [
    ("replaced", "move"),  # killed between moving OUT aside and the new one in
    ("replaced", "copy"),  # killed before the replaced OUT was removed
    ("writing", "copy"),  # killed while writing
])
def test_names_left_by_a_killed_run_are_cleaned_by_the_next(good: Path, tmp_path: Path, kind: str, how: str) -> None:
    """A replaced OUT is put back when OUT is missing (no model is lost), removed when OUT is there.
    (Names lmconvert did not mark as its own are left alone: tests/test_outputs_safety.py.)"""
    out = tmp_path / "out"
    assert lmconvert("convert", good, out).returncode == 0
    previous = tree(out)
    left_by_a_killed_run(out, kind, how)
    assert_clean_failure(lmconvert("convert", good, out), "already exists", "--force")
    assert tree(out) == previous
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_names_of_a_running_conversion_are_left_alone(good: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    running = tmp_path / f".out.lmconvert-writing-{os.getpid()}-0a1b2c3d"
    running.mkdir()
    (running / "model.safetensors").write_bytes(b"half")
    assert lmconvert("convert", good, out).returncode == 0
    assert (running / "model.safetensors").read_bytes() == b"half"


def stopped_while_writing(src: Path, out: Path, *args: str) -> subprocess.Popen:
    """A conversion paused (SIGSTOP) as soon as it writes, so after it has found OUT free; what it
    writes into is named for what it is and for its pid."""
    import time

    proc = lmconvert_process("convert", src, out, *args)
    deadline = time.monotonic() + 120
    while not list(out.parent.glob(f".{out.name}.lmconvert-writing-{proc.pid}-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.001)
    proc.send_signal(signal.SIGSTOP)
    return proc


@pytest.mark.parametrize("force", [False, True])
def test_two_conversions_to_one_out(larger: Path, good: Path, tmp_path: Path, force: bool) -> None:
    """Both used to exit 0, the second silently replacing the first. Now the one that finishes
    last fails (OUT appeared while it ran) unless it has --force."""
    out = tmp_path / "out"
    first = stopped_while_writing(larger, out, *(["--force"] if force else []))
    try:
        assert not out.exists()
        assert lmconvert("convert", good, out).returncode == 0  # another conversion finishes meanwhile
        other = tree(out)
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate()
    if force:
        assert first.returncode == 0, stderr
        assert json.loads((out / "lmconvert.json").read_text())["source"]["path"] == str(larger.resolve())
    else:
        assert_clean_failure(Result(first.returncode, stdout, stderr), "appeared while", "--force")
        assert tree(out) == other
    assert not list(tmp_path.glob(".out.lmconvert-*"))


# ---------------------------------------------------------------- 2. read nothing outside the checkpoint

@pytest.mark.parametrize("name", ["tokenizer.json", "special_tokens_map.json", "generation_config.json",
                                  "config.json", "model.safetensors"])
def test_files_linked_out_of_the_checkpoint_are_refused(src: Path, tmp_path: Path, name: str) -> None:
    """A symlinked tokenizer.json pointing at /etc/passwd used to be copied into OUT; a valid file
    elsewhere is refused as well."""
    link = src / name
    if name == "tokenizer.json":
        target = Path("/etc/passwd")
    else:
        target = tmp_path / "elsewhere" / name
        target.parent.mkdir()
        target.write_bytes(link.read_bytes() if link.exists() else b"{}")
        link.unlink(missing_ok=True)
    link.symlink_to(target)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, name, "outside the checkpoint", out=out)
    if name == "tokenizer.json":  # every command reads the checkpoint the same way
        assert_clean_failure(lmconvert("inspect", src), name, "outside the checkpoint")


def test_shards_linked_out_of_the_checkpoint_are_refused(src: Path, tmp_path: Path) -> None:
    shard(src)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = shutil.move(src / "model-00002-of-00002.safetensors", elsewhere)
    (src / "model-00002-of-00002.safetensors").symlink_to(moved)
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "model-00002-of-00002.safetensors", "outside the checkpoint", out=out)
    (src / "model-00002-of-00002.safetensors").unlink()
    shutil.move(moved, src)
    torch.save({**load_file(src / "model-00001-of-00002.safetensors"),
                **load_file(src / "model-00002-of-00002.safetensors")}, elsewhere / "pytorch_model.bin")
    for file in src.glob("model*"):
        file.unlink()
    (src / "pytorch_model.bin").symlink_to(elsewhere / "pytorch_model.bin")
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "pytorch_model.bin", "outside the checkpoint", out=out)


def test_meta_and_gguf_files_linked_out_are_refused(tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / "consolidated.00.pth").write_bytes(b"")
    (tmp_path / "params.json").write_text(json.dumps({"dim": 64}))
    (meta / "params.json").symlink_to(tmp_path / "params.json")
    assert_clean_failure(lmconvert("convert", meta, tmp_path / "out"), "params.json", "outside the checkpoint",
                         out=tmp_path / "out")
    directory = tmp_path / "gguf"
    directory.mkdir()
    (tmp_path / "real.gguf").write_bytes(b"GGUF" + b"\0" * 28)
    (directory / "model.gguf").symlink_to(tmp_path / "real.gguf")
    assert_clean_failure(lmconvert("convert", directory, tmp_path / "out"), "model.gguf", "outside the checkpoint",
                         out=tmp_path / "out")
    # a .gguf file named on the command line is the user's choice, wherever its link points
    err = assert_clean_failure(lmconvert("convert", directory / "model.gguf", tmp_path / "out"), out=tmp_path / "out")
    assert "outside the checkpoint" not in err


def test_links_inside_the_checkpoint_are_followed(src: Path, tmp_path: Path) -> None:
    (src / "weights").mkdir()
    (src / "model.safetensors").rename(src / "weights" / "model.safetensors")
    (src / "model.safetensors").symlink_to(Path("weights") / "model.safetensors")
    (src / "generation_config.json").rename(src / "weights" / "generation.json")
    (src / "generation_config.json").symlink_to((src / "weights" / "generation.json").resolve())
    proc, out = convert(src, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (out / "generation_config.json").read_bytes() == (src / "weights" / "generation.json").read_bytes()


def hf_cache_snapshot(checkpoint: Path, hub: Path, repo: str) -> Path:
    """The layout huggingface_hub writes: snapshot files are relative symlinks into the repo's blobs/."""
    import hashlib

    blobs, snapshot = hub / repo / "blobs", hub / repo / "snapshots" / ("0" * 40)
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in checkpoint.iterdir():
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_hf_cache_snapshots_read_their_own_blobs_only(good: Path, tmp_path: Path) -> None:
    snapshot = hf_cache_snapshot(good, tmp_path / "hub", "models--org--tiny")
    proc = lmconvert("convert", snapshot, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert lmconvert("verify", tmp_path / "out", "--files").returncode == 0
    other = hf_cache_snapshot(good, tmp_path / "hub", "models--org--other")
    link = snapshot / "generation_config.json"
    link.unlink()
    link.symlink_to(os.path.relpath((other / "generation_config.json").resolve(), snapshot))
    assert_clean_failure(lmconvert("convert", snapshot, tmp_path / "out2"), "generation_config.json",
                         "outside the checkpoint", out=tmp_path / "out2")


@pytest.mark.parametrize("key", ["files", "shards"])
@pytest.mark.parametrize("entry", ["/etc/passwd", "../../x", "../can/lmconvert.json", "sub/x", ".."])
def test_lmconvert_json_naming_files_outside_is_refused(can: Path, key: str, entry: str) -> None:
    """`verify --files` used to hash whatever path lmconvert.json listed."""
    value: object = "0" * 64 if key == "files" else {"header": "0" * 64, "bytes": 8}
    edit_description(can, lambda meta: meta[key].update({entry: value}))
    assert_clean_failure(lmconvert("verify", can, "--files"), "lmconvert.json lists", repr(entry),
                         "not a plain file name")


def test_listed_files_linked_outside_are_refused(can: Path, tmp_path: Path) -> None:
    original = (can / "generation_config.json").read_bytes()
    (can / "generation_config.json").unlink()
    (can / "generation_config.json").symlink_to("/etc/passwd")
    assert_clean_failure(lmconvert("verify", can, "--files"), "generation_config.json", "outside the checkpoint")
    out = tmp_path / "hf"
    assert_clean_failure(lmconvert("convert", can, out, "--to", "hf"), "generation_config.json",
                         "outside the checkpoint", out=out)
    (can / "generation_config.json").unlink()
    (can / "generation_config.json").write_bytes(original)
    edit_description(can, lambda meta: meta["files"].update({"tokenizer/../../../etc/passwd": "0" * 64}))
    assert_clean_failure(lmconvert("convert", can, out, "--to", "hf"), "tokenizer/../../../etc/passwd",
                         "not a plain file name", out=out)


# ---------------------------------------------------------------- 3. the manifest is enforced

def flip_byte(shard_file: Path, tensor: str) -> None:
    data = bytearray(shard_file.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    start = 8 + length + json.loads(data[8:8 + length])[tensor]["data_offsets"][0]
    data[start + 1] ^= 0x01
    shard_file.write_bytes(bytes(data))


@pytest.mark.parametrize("to, args", [("hf", []), ("hf", ["--dtype", "float16"]), ("meta", []),
                                      ("meta", ["--shards", "2"])], ids=["hf", "hf-cast", "meta", "meta-2-ranks"])
def test_exports_refuse_a_tensor_changed_after_conversion(can: Path, tmp_path: Path, to: str, args: list[str]) -> None:
    """An export checks every tensor against lmconvert.json as it streams it: a raw copy in the
    worker that moves it, a cast or re-laid-out one as it is read. Exit 1, naming it, and no OUT."""
    victim = "layers.1.attn.k.weight"
    flip_byte(can / "model.safetensors", victim)
    out = tmp_path / "exported"
    assert_clean_failure(lmconvert("convert", can, out, "--to", to, *args), victim, "lmconvert.json",
                         "verify --files", out=out, code=1)


def test_exports_refuse_a_shard_header_changed_after_conversion(can: Path, tmp_path: Path) -> None:
    """Two same-shaped tensors renamed into each other: every byte is intact, their meaning is not."""
    path = can / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length].replace(b"layers.0.attn.q.weight", b"layers.0.attn.X.weight")
    header = header.replace(b"layers.0.attn.o.weight", b"layers.0.attn.q.weight")
    header = header.replace(b"layers.0.attn.X.weight", b"layers.0.attn.o.weight")
    assert header != data[8:8 + length]
    path.write_bytes(data[:8] + header + data[8 + length:])
    for to in ("hf", "meta"):
        out = tmp_path / to
        assert_clean_failure(lmconvert("convert", can, out, "--to", to), "model.safetensors", "header",
                             "lmconvert.json", out=out, code=1)


def test_exports_refuse_a_side_file_changed_or_missing(can: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    (can / "generation_config.json").write_text(json.dumps({"eos_token_id": 666}))
    assert_clean_failure(lmconvert("convert", can, out, "--to", "hf"), "generation_config.json", "lmconvert.json",
                         out=out, code=1)
    (can / "generation_config.json").unlink()
    assert_clean_failure(lmconvert("convert", can, out, "--to", "hf"), "generation_config.json", "missing",
                         out=out, code=1)


def test_files_added_after_conversion_are_reported_and_not_shipped(can: Path, tmp_path: Path) -> None:
    (can / "tokenizer.json").write_text("{}")  # a side file an export would ship
    (can / "notes.txt").write_text("added")
    proc = lmconvert("verify", can, "--files")
    assert_clean_failure(proc, "notes.txt", "tokenizer.json", code=1)
    assert "unlisted file: notes.txt" in proc.stdout and "unlisted file: tokenizer.json" in proc.stdout
    assert "verdict: FAIL" in proc.stdout
    out = tmp_path / "hf"
    proc = lmconvert("convert", can, out, "--to", "hf")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "tokenizer.json").exists() and not (out / "notes.txt").exists()
    assert (out / "generation_config.json").read_bytes() == (can / "generation_config.json").read_bytes()


# ---------------------------------------------------------------- 6. exit codes a CI can trust

def test_exit_codes_are_documented_in_help() -> None:
    proc = lmconvert("--help")
    assert proc.returncode == 0
    for line in ("0  success", "1  the parity check", "2  bad input or usage", "3  internal error: a bug"):
        assert line in proc.stdout, proc.stdout
    assert lmconvert("convert").returncode == 2  # click's usage errors


@pytest.mark.parametrize("raised", ["ZeroDivisionError('division by zero')", "KeyError('metadata')",
                                    "RecursionError('maximum recursion depth exceeded')", "AssertionError()"])
def test_an_unexpected_exception_exits_3_as_a_bug(good: Path, raised: str) -> None:
    """Any exception nobody expected used to be a traceback and exit 1, which a CI reads as a parity
    failure. A real process whose `inspect` is made to crash inside:"""
    crashing = (f"import lmconvert.runtime.card as card\ndef crash(path):\n    raise {raised}\ncard.card = crash\n"
                "from lmconvert.cli import main\nmain()")

    def run(*args: object) -> Result:
        proc = subprocess.run([sys.executable, "-c", crashing, *map(str, args)], capture_output=True, text=True)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    kind = raised.split("(")[0]
    assert_clean_failure(run("inspect", good), "internal error", kind, "a bug in lmconvert", "--debug", code=3)
    proc = run("--debug", "inspect", good)
    assert proc.returncode not in (0, 2, 3) and "Traceback" in proc.stderr and kind in proc.stderr


def test_an_error_stays_one_line_whatever_a_file_name_holds(src: Path, tmp_path: Path) -> None:
    shard(src)
    edit_index(src, lambda m: m.update({"model.norm.weight": "evil\nname\r.safetensors"}))
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, "evil\\nname\\r.safetensors", out=out)


# ---------------------------------------------------------------- 7. smaller things

@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_outputs_honour_the_umask(good: Path, tmp_path: Path, umask: int) -> None:
    """As `cp` does: they used to be 0700 whatever the umask."""
    import stat

    can, hf = tmp_path / "can", tmp_path / "hf"
    for args in ((good, can), (can, hf, "--to", "hf")):
        proc = lmconvert_run("convert", *args, umask=umask)
        assert proc.returncode == 0, proc.stderr
    for out in (can, hf):
        assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask, out
        for file in out.iterdir():
            assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask, file


@pytest.mark.parametrize("name, dtype", [
    ("model.embed_tokens.weight", torch.int64), ("model.norm.weight", torch.bool),
    ("model.layers.0.mlp.down_proj.weight", torch.int32), ("lm_head.weight", torch.uint8),
    ("model.layers.1.input_layernorm.weight", torch.float8_e4m3fn),
    ("model.layers.0.self_attn.q_proj.weight", torch.float8_e5m2),
    ("model.layers.0.self_attn.k_proj.weight", torch.int8),
])
def test_non_float_parameters_are_refused(src: Path, tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    tensors = load_file(src / "model.safetensors")
    tensors[name] = tensors[name] != 0 if dtype == torch.bool else tensors[name].to(dtype)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    dtype_name = str(dtype).removeprefix("torch.")
    proc, out = convert(src, tmp_path)
    assert_clean_failure(proc, name, dtype_name, "float", out=out)
    assert_clean_failure(lmconvert("verify", src), name, dtype_name, "float")


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
    edit_description(can, lambda m: m["arch"].update(n_layers=1_000_000, layer_kinds=None, layer_positions=None))
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
    edit_description(can, lambda m: m["arch"].update(n_layers=10_000_000, layer_kinds=None, layer_positions=None))
    proc, peak = lmconvert_peak("inspect", can)
    assert_clean_failure(proc, "arch.n_layers=10000000")
    assert peak < baseline + 50 * MB, (peak, baseline)


@pytest.mark.slow  # nine verify runs, each its own process
def test_verify_requests_fail_within_the_memory_a_good_run_uses(canonical_ready: Path) -> None:
    """A batch of 10**9 sequences is refused before anything is allocated for it: the refusal
    costs no more than a real verify of the tiny model (whose peak is mostly torch itself)."""
    fine, baseline = lmconvert_peak("verify", canonical_ready, "--seq-len", 16, "--generate", 2)
    assert fine.returncode == 0, fine.stderr
    for args in (("--batch", 10**9), ("--seq-len", 10**9), ("--generate", 10**9)):
        proc, peak = lmconvert_peak("verify", canonical_ready, *args)
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


@pytest.mark.slow  # a verify process under RLIMIT_AS: ~3-4.5 s alone (the refusals above stay in test-fast)
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
    edit_description(can, change)
    for command in (("inspect", can), ("verify", can, "--files")):
        assert_clean_failure(lmconvert(*command), "lmconvert.json", *fragments, "convert the source again")


def test_unknown_dtype_is_never_exported(can: Path, tmp_path: Path) -> None:
    """It used to land in the exported config.json as "dtype": "int4"."""
    edit_description(can, lambda m: m.update(dtype="int4"))
    out = tmp_path / "hf"
    assert_clean_failure(lmconvert("convert", can, out, "--to", "hf"), "dtype", "'int4'", out=out)


# ---------------------------------------------------------------- GGUF metadata and params.json


@pytest.mark.parametrize("change, fragment", [
    ({"llama.attention.head_count": 0},  # (Laguna's per-layer counts: an array too)
     "llama.attention.head_count: expected a positive integer or an array of a positive integer, found 0"),
    ({"llama.attention.head_count": "4"},
     "llama.attention.head_count: expected a positive integer or an array of a positive integer, found '4'"),
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
def golden(canonical_ready: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    file = tmp_path_factory.mktemp("golden") / "golden.safetensors"
    proc = lmconvert("verify", canonical_ready, "--seq-len", 12, "--generate", 3, "--save-golden", file)
    assert proc.returncode == 0, proc.stderr
    return file


def rewrite_golden(golden: Path, tmp_path: Path, tensors: dict | None = None, metadata: dict | None = None) -> Path:
    with safe_open(str(golden), framework="pt") as f:
        old_meta, old = f.metadata(), {n: f.get_tensor(n) for n in f.keys()}
    file = tmp_path / "broken.safetensors"
    new = {n: t.contiguous() for n, t in {**old, **(tensors or {})}.items() if t is not None}
    save_file(new, str(file), {k: v for k, v in {**old_meta, **(metadata or {})}.items() if v is not None})
    return file


def test_golden_file_as_recorded_checks(canonical_ready: Path, golden: Path) -> None:
    assert lmconvert("verify", canonical_ready, "--golden", golden).returncode == 0


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
def test_golden_file_structure_is_checked_when_read_back(canonical_ready: Path, golden: Path, tmp_path: Path, tensors,  # noqa: ANN001
                                                         metadata: dict, fragment: str) -> None:
    with safe_open(str(golden), framework="pt") as f:
        old = {n: f.get_tensor(n) for n in f.keys()}
    broken = rewrite_golden(golden, tmp_path, tensors(old), metadata)
    assert_clean_failure(lmconvert("verify", canonical_ready, "--golden", broken), "--golden", fragment)


def test_golden_file_recorded_with_more_positions_than_the_model(canonical_ready: Path, golden: Path,
                                                                 tmp_path: Path) -> None:
    with safe_open(str(golden), framework="pt") as f:
        old = {n: f.get_tensor(n) for n in f.keys()}
    wide = {"ids": old["ids"].repeat(1, 11), "logits": old["logits"].repeat(1, 11, 1),
            "generation.sequences": None, "generation.logits": None}
    wide.update({n: None for n in old if n.startswith("points.")})
    broken = rewrite_golden(golden, tmp_path, wide)
    assert_clean_failure(lmconvert("verify", canonical_ready, "--golden", broken), "132 tokens per sequence",
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
