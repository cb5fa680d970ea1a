"""`pull REPO --file PATTERN` (one file, or a split set, of a GGUF repo) and `inspect REPO_ID` (the card
from config.json and the safetensors headers, fetched over HTTP) against the test Hub server
(tests/hub_server.py), through huggingface_hub's real code path, as test_pull.py does for HF repos.
The GGUF files are lmconvert's own export of a tiny model; the split set its --max-shard-size output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hf_models import build_model, save_checkpoint, save_tiny_tokenizer
from hub_server import HubServer
from safetensors.torch import load_file, save_file
from test_pull import CHUNK, CUT_AT, assert_one_line_error, files_of, lmconvert, snapshot_dir
from test_pull import hub_env as hf_env

from lmconvert.convert import convert
from lmconvert.convert.hub import gguf_out, select_gguf
from lmconvert.convert.ingest import to_canonical
from lmconvert.formats.errors import InputError

GGUF_REPO = "org/tiny-llama-GGUF"
HF_REPO = "org/tiny-llama"
ROOT = Path(__file__).resolve().parents[1]


def hub_env(endpoint: str, home: Path, **extra: str) -> dict[str, str]:
    """test_pull's, with this checkout's lmconvert first on the path: the CLI runs in other folders."""
    return hf_env(endpoint, home, PYTHONPATH=str(ROOT), **extra)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny llama (one safetensors file, and sharded), its canonical conversion, and its GGUF exports:
    q8_0 and f32 as single files, f16 as llama.cpp's split set."""
    root = tmp_path_factory.mktemp("made")
    vocab = save_tiny_tokenizer(root / "tokenizer")
    hf = save_checkpoint(build_model("llama", seed=0, vocab_size=vocab), root / "hf")
    for name, data in files_of(root / "tokenizer").items():
        (hf / name).write_bytes(data)
    # for inspect: weights files all over the 100 kB huggingface_hub asks for first, so that a header's
    # range is never the whole file
    big = build_model("llama", seed=1, vocab_size=2048)
    single, sharded = save_checkpoint(big, root / "single"), save_checkpoint(big, root / "sharded",
                                                                             max_shard_size="300KB")
    to_canonical(hf, root / "canonical")
    for out, quant, shard in (("tiny-Q8_0.gguf", "q8_0", None), ("tiny-F32.gguf", "f32", None),
                              ("parts", "f16", 60_000)):
        convert(root / "canonical", root / out, "gguf", quant=quant, gguf_pre="gpt-2", max_shard_bytes=shard)
    parts = sorted((root / "parts").glob("*.gguf"))
    assert len(parts) >= 3
    # over huggingface_hub's 10 MiB download chunk, which a resumed download can start after
    to_canonical(save_checkpoint(build_model("llama", seed=3, vocab_size=24576), root / "big"), root / "big-canonical")
    convert(root / "big-canonical", root / "big-F32.gguf", "gguf", quant="f32")
    assert (root / "big-F32.gguf").stat().st_size > CUT_AT
    return {"hf": hf, "single": single, "sharded": sharded, "q8_0": root / "tiny-Q8_0.gguf",
            "f32": root / "tiny-F32.gguf", "parts": root / "parts", "big": root / "big-F32.gguf"}


def flipped(data: bytes) -> bytes:
    """One bit flipped halfway through: in the tensor data, which a conversion reads without noticing."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:]


def split_files(made: dict[str, Path]) -> dict[str, bytes]:
    """The split set as a GGUF repo names it: `tiny-F16-0000K-of-0000N.gguf`."""
    parts = sorted(made["parts"].glob("*.gguf"))
    return {f"tiny-F16-{i:05d}-of-{len(parts):05d}.gguf": p.read_bytes() for i, p in enumerate(parts, start=1)}


@pytest.fixture(scope="module")
def hub(made: dict[str, Path]) -> Iterator[HubServer]:
    q8, f32 = made["q8_0"].read_bytes(), made["f32"].read_bytes()
    gguf_repo = {"README.md": b"# tiny GGUF\n", ".gitattributes": b"*.gguf filter=lfs\n", "tiny-Q8_0.gguf": q8,
                 "tiny-F32.gguf": f32, **split_files(made)}
    server = HubServer()
    server.add_repo(GGUF_REPO, [gguf_repo])
    second = sorted(split_files(made))[1]
    server.add_repo("org/half-split-GGUF", [{k: v for k, v in gguf_repo.items() if k != second}])
    server.add_repo("org/tampered-GGUF", [gguf_repo], tampered={"tiny-Q8_0.gguf": flipped(q8)})
    server.add_repo("org/flaky-GGUF", [{"big-F32.gguf": made["big"].read_bytes()}], cut_once={"big-F32.gguf": CUT_AT})
    server.add_repo("org/gated-tiny", [files_of(made["single"])], gated_token="hf_granted")
    server.add_repo(HF_REPO, [files_of(made["single"]), files_of(made["sharded"])], {"main": 1, "single": 0})
    config = json.loads((made["hf"] / "config.json").read_text())
    (made["hf"].parent / "mamba").mkdir(exist_ok=True)
    save_file({"backbone.embeddings.weight": torch.zeros(8, 4)}, made["hf"].parent / "mamba" / "model.safetensors")
    recurrent_gemma = {**config, "model_type": "recurrent_gemma", "architectures": ["RecurrentGemmaForCausalLM"]}
    server.add_repo("org/tiny-rg", [{"config.json": json.dumps(recurrent_gemma).encode(),
                                        "model.safetensors":
                                            (made["hf"].parent / "mamba" / "model.safetensors").read_bytes()}])
    with server:
        yield server


def tensors_and_meta(out: Path) -> tuple[dict[str, torch.Tensor], dict]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors, json.loads((out / "lmconvert.json").read_text())


def assert_same_conversion(pulled: Path, converted: Path, offline: bool = False) -> None:
    """The pulled checkpoint is the local conversion of the same file: every tensor bit for bit, the
    recorded hashes, the architecture and the tokenizer files (offline, transformers' tokenizer_config
    records local_files_only true: the one difference)."""
    a, meta_a = tensors_and_meta(pulled)
    b, meta_b = tensors_and_meta(converted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert meta_a["tensors"] == meta_b["tensors"] and meta_a["arch"] == meta_b["arch"]
    assert meta_a["family"] == meta_b["family"] and meta_a["dtype"] == meta_b["dtype"]
    sidecars = {p.name for p in converted.iterdir()} - {"lmconvert.json"}
    assert {p.name for p in pulled.iterdir()} - {"lmconvert.json"} == sidecars
    for name in sidecars:
        if offline and name == "tokenizer_config.json":
            ours, theirs = (json.loads((d / name).read_text()) for d in (pulled, converted))
            assert ours.pop("local_files_only") is True and theirs.pop("local_files_only") is False
            assert ours == theirs
            continue
        assert (pulled / name).read_bytes() == (converted / name).read_bytes(), name


@pytest.mark.slow
def test_pull_one_gguf_file_equals_converting_it(hub: HubServer, made: dict[str, Path], tmp_path: Path) -> None:
    home, env = tmp_path / "hf", hub_env(hub.url, tmp_path / "hf")
    since = len(hub.requests)
    proc = lmconvert("pull", GGUF_REPO, "--file", "*Q8_0.gguf", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sha = hub.repos[GGUF_REPO].refs["main"]
    assert f"{GGUF_REPO}@{sha}: tiny-Q8_0.gguf" in proc.stdout
    out = tmp_path / "tiny-Q8_0"  # the default OUT: the file's name
    snapshot = snapshot_dir(home, GGUF_REPO, sha)
    assert {p.name for p in snapshot.iterdir()} == {"tiny-Q8_0.gguf"}  # that file only
    assert (snapshot / "tiny-Q8_0.gguf").read_bytes() == made["q8_0"].read_bytes()
    assert [r.path.rsplit("/", 1)[-1] for r in hub.log(since, "hub") if "/resolve/" in r.path] == \
        ["tiny-Q8_0.gguf"] * len([r for r in hub.log(since, "hub") if "/resolve/" in r.path])
    source = json.loads((out / "lmconvert.json").read_text())["source"]
    assert source["repo"] == GGUF_REPO and source["revision"] == sha and source["file"] == "tiny-Q8_0.gguf"
    assert source["format"] == "gguf" and source["path"] == str(snapshot / "tiny-Q8_0.gguf")
    assert lmconvert("convert", made["q8_0"], tmp_path / "local", env=env).returncode == 0
    assert_same_conversion(out, tmp_path / "local")
    # again, offline: from the HF cache, not one request
    since = len(hub.requests)
    proc = lmconvert("pull", GGUF_REPO, "--file", "tiny-Q8_0.gguf", "--out", tmp_path / "offline",
                     env=hub_env(hub.url, home, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    assert hub.log(since) == []
    assert_same_conversion(tmp_path / "offline", tmp_path / "local", offline=True)
    # exported again: the file records the Hub file it came from, and verify finds it in the HF cache
    again = lmconvert("convert", out, tmp_path / "again.gguf", "--quant", "f32", "--gguf-pre", "gpt-2", env=env)
    assert again.returncode == 0, again.stderr
    for checked in (out, tmp_path / "again.gguf"):
        proc = lmconvert("verify", checked, "--generate", "2", env=env)
        assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_cut_off_gguf_download_resumes(hub: HubServer, made: dict[str, Path], tmp_path: Path) -> None:
    """As for HF repos (test_pull.py): the server drops the connection past the first 10 MiB chunk,
    and huggingface_hub resumes from there (`Range: bytes=<chunk>-`)."""
    since = len(hub.requests)
    env = hub_env(hub.url, tmp_path / "hf")
    proc = lmconvert("pull", "org/flaky-GGUF", "--file", "big-F32.gguf", "--out", tmp_path / "out", env=env)
    assert proc.returncode == 0, proc.stderr
    assert [r.range for r in hub.log(since, "cdn") if r.method == "GET"] == [None, f"bytes={CHUNK}-"]
    assert lmconvert("convert", made["big"], tmp_path / "local", env=env).returncode == 0
    assert_same_conversion(tmp_path / "out", tmp_path / "local")


@pytest.mark.slow
def test_inspect_a_gated_repo_with_a_token(hub: HubServer, made: dict[str, Path], tmp_path: Path) -> None:
    env = hub_env(hub.url, tmp_path / "hf")
    proc = lmconvert("inspect", "org/gated-tiny", env=env)
    assert_one_line_error(proc, "org/gated-tiny", "gated repo", "--token")
    proc = lmconvert("inspect", "org/gated-tiny", "--token", "hf_granted", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(lmconvert("inspect", made["single"], "--json", env=env).stdout)


@pytest.mark.slow
def test_pull_a_split_set_whole(hub: HubServer, made: dict[str, Path], tmp_path: Path) -> None:
    """A pattern matching one part fetches every part; the set converts as the local parts do, and as
    the one file would (f16 here: the same values)."""
    home, env = tmp_path / "hf", hub_env(hub.url, tmp_path / "hf")
    parts = split_files(made)
    proc = lmconvert("pull", GGUF_REPO, "--file", "*F16-00002-of-*", "--out", tmp_path / "out", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"({len(parts)} parts)" in proc.stdout
    snapshot = snapshot_dir(home, GGUF_REPO, hub.repos[GGUF_REPO].refs["main"])
    assert files_of(snapshot) == parts
    assert json.loads((tmp_path / "out" / "lmconvert.json").read_text())["source"]["gguf_parts"] == len(parts)
    first = sorted(made["parts"].glob("*.gguf"))[0]
    assert lmconvert("convert", first, tmp_path / "local", env=env).returncode == 0
    assert_same_conversion(tmp_path / "out", tmp_path / "local")
    assert lmconvert("convert", made["parts"], tmp_path / "local-dir", env=env).returncode == 0  # the directory too
    assert_same_conversion(tmp_path / "out", tmp_path / "local-dir")
    proc = lmconvert("verify", tmp_path / "out", "--seq-len", 16, "--generate", 2, env=env)  # the recorded source
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("pattern, fragments", [
    ("*Q4_K_M.gguf", ["'*Q4_K_M.gguf' matches no file", "tiny-F16-*-of-000", "parts)", "tiny-F32.gguf",
                      "tiny-Q8_0.gguf"]),
    ("*.gguf", ["'*.gguf' matches", "files of 3 models", "tiny-F32.gguf", "tiny-Q8_0.gguf", "narrow it"]),
    ("README*", ["'README*' matches README.md", "not a .gguf file"]),
])
def test_pattern_matching_nothing_or_several_models(hub: HubServer, tmp_path: Path, pattern: str,
                                                    fragments: list[str]) -> None:
    since = len(hub.requests)
    proc = lmconvert("pull", GGUF_REPO, "--file", pattern, "--out", tmp_path / "out",
                     env=hub_env(hub.url, tmp_path / "hf"))
    assert_one_line_error(proc, GGUF_REPO, *fragments)
    assert not (tmp_path / "out").exists()
    assert hub.log(since, "cdn") == []  # nothing downloaded


@pytest.mark.slow
def test_gguf_repo_without_file_and_an_incomplete_split_set(hub: HubServer, made: dict[str, Path],
                                                            tmp_path: Path) -> None:
    env = hub_env(hub.url, tmp_path / "hf")
    proc = lmconvert("pull", GGUF_REPO, "--out", tmp_path / "out", env=env)
    assert_one_line_error(proc, GGUF_REPO, "GGUF repo", "--file", "tiny-Q8_0.gguf")
    n = len(split_files(made))
    proc = lmconvert("pull", "org/half-split-GGUF", "--file", "*F16*", "--out", tmp_path / "out", env=env)
    assert_one_line_error(proc, f"{n}-way split", f"lacks tiny-F16-00002-of-{n:05d}.gguf")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_gguf_file_that_is_not_what_the_hub_announces(hub: HubServer, tmp_path: Path) -> None:
    """The sha256 check of HF pulls holds for GGUF files: the corrupt blob goes from the cache."""
    home = tmp_path / "hf"
    proc = lmconvert("pull", "org/tampered-GGUF", "--file", "*Q8_0*", "--out", tmp_path / "out",
                     env=hub_env(hub.url, home))
    assert_one_line_error(proc, "org/tampered-GGUF", "tiny-Q8_0.gguf", "sha256", "removed from the HF cache")
    assert not (tmp_path / "out").exists()
    assert not [p for p in (home / "hub" / "models--org--tampered-GGUF" / "blobs").iterdir() if len(p.name) == 64]


@pytest.mark.slow
@pytest.mark.parametrize("revision, local", [("single", "single"), ("main", "sharded")])
def test_inspect_a_repo_id_reads_only_headers(hub: HubServer, made: dict[str, Path], tmp_path: Path, revision: str,
                                              local: str) -> None:
    """The card of a repo on the Hub is the card of the same checkpoint on disk, from config.json and
    range requests for the safetensors headers: no weights are downloaded."""
    env = hub_env(hub.url, tmp_path / "hf")
    since = len(hub.requests)
    proc = lmconvert("inspect", HF_REPO, "--revision", revision, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    requests = hub.log(since)
    expected = lmconvert("inspect", made[local], "--json", env=env)
    assert expected.returncode == 0, expected.stderr
    assert json.loads(proc.stdout) == json.loads(expected.stdout)
    assert lmconvert("inspect", HF_REPO, "--revision", revision, env=env).stdout == \
        lmconvert("inspect", made[local], env=env).stdout
    sizes = {p.name: p.stat().st_size for p in made[local].glob("*.safetensors")}
    assert all(size > 100_001 for size in sizes.values())  # so a range of 100 kB is not a whole file
    gets = [r for r in requests if r.method == "GET" and (r.path.endswith(".safetensors") or "/lfs/" in r.path)]
    assert {r.path.rsplit("/", 1)[-1] for r in gets if r.path.endswith(".safetensors")} == set(sizes)
    assert all(r.range == "bytes=0-100000" for r in gets)  # the header's range, never a body
    assert len([r for r in gets if "/lfs/" in r.path]) == len(sizes)  # one per file: each header fits in it
    blobs = tmp_path / "hf" / "hub" / "models--org--tiny-llama" / "blobs"
    assert not [p for p in blobs.iterdir() if len(p.name) == 64]  # no weights in the cache


@pytest.mark.slow
def test_inspect_a_repo_of_a_type_lmconvert_lacks(hub: HubServer, tmp_path: Path) -> None:
    proc = lmconvert("inspect", "org/tiny-rg", env=hub_env(hub.url, tmp_path / "hf"))
    assert_one_line_error(proc, "org/tiny-rg@", "'recurrent_gemma'", "a recurrent token mixer (RG-LRU, RWKV, xLSTM)")


@pytest.mark.slow
@pytest.mark.parametrize("args, fragments", [
    (["inspect", "not a repo"], ["not a repo", "no such file or directory", "owner/name"]),
    (["inspect", "org/no-such-model"], ["org/no-such-model", "no such model repo"]),
    (["inspect", HF_REPO, "--revision", "no-such-branch"], [HF_REPO, "'no-such-branch'", "--revision"]),
    (["inspect", GGUF_REPO], [GGUF_REPO, "no config.json", "--file"]),
    (["pull", "org//bad", "--file", "*.gguf"], ["org//bad", "not a valid repo id"]),
])
def test_bad_repo_ids(hub: HubServer, tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    proc = lmconvert(*args, env=hub_env(hub.url, tmp_path / "hf"), cwd=tmp_path)
    assert_one_line_error(proc, *fragments)


@pytest.mark.slow
def test_inspect_local_path_options(tmp_path: Path, made: dict[str, Path]) -> None:
    proc = lmconvert("inspect", made["hf"], "--revision", "main", env=hub_env("http://127.0.0.1:9", tmp_path))
    assert_one_line_error(proc, "--revision and --token apply to a Hub repo id")


@pytest.mark.parametrize("listing, pattern, wanted", [
    (["a-Q4_K_M.gguf", "a-Q8_0.gguf"], "*Q4_K_M.gguf", ["a-Q4_K_M.gguf"]),
    (["x/a-Q4_K_M-00001-of-00002.gguf", "x/a-Q4_K_M-00002-of-00002.gguf", "a-Q8_0.gguf"], "*Q4_K_M*",
     ["x/a-Q4_K_M-00001-of-00002.gguf", "x/a-Q4_K_M-00002-of-00002.gguf"]),
    (["a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf"], "a-Q4_K_M-00002-of-00002.gguf",
     ["a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf"]),
    (["sub/a.gguf", "a.gguf"], "sub/*.gguf", ["sub/a.gguf"]),
])
def test_select_gguf(listing: list[str], pattern: str, wanted: list[str]) -> None:
    assert select_gguf(listing, pattern, "org/x@sha") == wanted


@pytest.mark.parametrize("listing, pattern, fragment", [
    (["sub/a.gguf", "a.gguf"], "*a.gguf", "2 files of 2 models"),
    (["a-00001-of-00002.gguf", "b-00001-of-00002.gguf", "b-00002-of-00002.gguf"], "*-00001-*", "of 2 models"),
    (["a-00001-of-00003.gguf", "a-00003-of-00003.gguf"], "a-*", "lacks a-00002-of-00003.gguf"),
])
def test_select_gguf_refuses(listing: list[str], pattern: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        select_gguf(listing, pattern, "org/x@sha")


def test_default_out_of_a_gguf_pull() -> None:
    assert gguf_out("x/Model-Q4_K_M-00001-of-00003.gguf") == Path("Model-Q4_K_M")
    assert gguf_out("Model-Q8_0.gguf") == Path("Model-Q8_0")


def test_help_lists_file_and_remote_inspect() -> None:
    from click.testing import CliRunner

    from lmconvert.cli import main

    result = CliRunner().invoke(main, ["pull", "--help"])
    assert result.exit_code == 0 and "--file" in result.stdout and "Q4_K_M" in result.stdout
    result = CliRunner().invoke(main, ["inspect", "--help"])
    assert result.exit_code == 0 and "--revision" in result.stdout and "--token" in result.stdout
    assert "repo id" in result.stdout
