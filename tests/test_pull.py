"""`lmconvert pull` against a real HTTP server speaking the Hub protocol (tests/hub_server.py): the CLI
runs in a subprocess with HF_ENDPOINT and HF_HOME pointing at the server and a temporary cache, so
huggingface_hub's real code path (resolution, listing, HEAD/GET, redirects, resume, cache) is exercised."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
import torch
from click.testing import CliRunner
from hf_models import build_model, save_checkpoint, save_tiny_tokenizer
from hub_server import HubServer, refusing_url
from safetensors.torch import load, load_file

from lmconvert.cli import main
from lmconvert.convert.hub import select_files
from lmconvert.formats.errors import InputError

TINY = "org/tiny-llama"
CHUNK = 10 * 2**20  # huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE: what it writes to disk at a time
CUT_AT = CHUNK + 2**20  # where the server drops the connection in the weights of org/flaky-llama


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def commits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """Repo contents: v1 (one safetensors file), v2 (sharded, with an index), big (weights over 10 MiB),
    bin (pytorch_model.bin only); each with a real tokenizer."""
    root = tmp_path_factory.mktemp("repos")
    vocab = save_tiny_tokenizer(root / "tokenizer")
    tokenizer = files_of(root / "tokenizer")
    extras = {"README.md": b"# tiny\n", ".gitattributes": b"*.safetensors filter=lfs\n",
              "original/params.json": b"{}"}
    v1 = files_of(save_checkpoint(build_model("llama", seed=0, vocab_size=vocab), root / "v1"))
    v2 = files_of(save_checkpoint(build_model("llama", seed=1, vocab_size=vocab), root / "v2", max_shard_size="100KB"))
    assert "model.safetensors.index.json" in v2 and sum(f.endswith(".safetensors") for f in v2) >= 2
    # over huggingface_hub's 10 MiB download chunk, which a resume can start after
    big = files_of(save_checkpoint(build_model("llama", seed=3, vocab_size=24576), root / "big"))
    assert len(big["model.safetensors"]) > CUT_AT
    model = build_model("llama", seed=2, vocab_size=vocab)
    (root / "bin").mkdir()
    model.config.save_pretrained(root / "bin")
    torch.save(model.state_dict(), root / "bin" / "pytorch_model.bin")
    return {"v1": {**v1, **tokenizer, **extras},
            "v2": {**v2, **tokenizer, **extras, "pytorch_model.bin": b"not wanted: the repo has safetensors"},
            "bin": {**files_of(root / "bin"), **tokenizer}, "big": {**big, **tokenizer}}


def last_shard(commits: dict[str, dict[str, bytes]]) -> str:
    return sorted(f for f in commits["v2"] if f.startswith("model-"))[-1]


@pytest.fixture(scope="module")
def hub(commits: dict[str, dict[str, bytes]]) -> Iterator[HubServer]:
    v1, v2 = commits["v1"], commits["v2"]
    shard = last_shard(commits)
    server = HubServer()
    server.add_repo(TINY, [v1, v2], {"main": 1, "v1": 0})
    server.add_repo("org/gated-llama", [v1], gated_token="hf_granted")
    server.add_repo("org/half-upload", [{k: v for k, v in v2.items() if k != shard}])
    server.add_repo("org/lost-shard", [v2], unavailable={shard})
    server.add_repo("org/flaky-llama", [commits["big"]],
                    cut_once={"model.safetensors": CUT_AT, "tokenizer.json": len(v1["tokenizer.json"]) // 2})
    server.add_repo("org/dead-llama", [v1], cut_always={"model.safetensors"})
    server.add_repo("org/bin-llama", [commits["bin"]])
    with server:
        yield server


def hub_env(endpoint: str, home: Path, **extra: str) -> dict[str, str]:
    drop = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and "proxy" not in k.lower()}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env


def lmconvert(*args: object, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lmconvert.cli", *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def pull_verified(repo: str, files: dict[str, bytes], root: Path) -> dict[str, Any]:
    """`lmconvert pull REPO --verify --out ROOT/out` of one commit of `files` served by a HubServer, asserted to
    exit 0 with PASS; returns the pull's lmconvert.json."""
    server = HubServer()
    server.add_repo(repo, [files])
    with server:
        proc = lmconvert("pull", repo, "--verify", "--out", root / "out", env=hub_env(server.url, root / "hf"))
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout, proc.stdout
    return json.loads((root / "out" / "lmconvert.json").read_text())


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmconvert: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def snapshot_dir(home: Path, repo: str, sha: str) -> Path:
    return home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / sha


@pytest.fixture(scope="module")
def pulled(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A plain `lmconvert pull org/tiny-llama --out OUT`, into a cache later tests reuse offline."""
    root = tmp_path_factory.mktemp("pulled")
    proc = lmconvert("pull", TINY, "--out", root / "out", env=hub_env(hub.url, root / "hf"))
    assert proc.returncode == 0, proc.stderr
    assert f"{TINY}@{hub.repos[TINY].refs['main']}" in proc.stdout
    return root / "hf", root / "out"


def hf_tensor(files: dict[str, bytes], name: str) -> torch.Tensor:
    index = files.get("model.safetensors.index.json")
    shard = json.loads(index)["weight_map"][name] if index else "model.safetensors"
    return load(files[shard])[name]


@pytest.mark.slow
def test_pull_converts_records_the_commit_and_uses_the_hf_cache(pulled: tuple[Path, Path], hub: HubServer,
                                                                commits: dict[str, dict[str, bytes]]) -> None:
    home, out = pulled
    sha = hub.repos[TINY].refs["main"]
    meta = json.loads((out / "lmconvert.json").read_text())
    snapshot = snapshot_dir(home, TINY, sha)
    assert meta["source"]["repo"] == TINY and meta["source"]["revision"] == sha and meta["source"]["ref"] == "main"
    assert meta["source"]["path"] == str(snapshot.resolve())
    assert (home / "hub" / "models--org--tiny-llama" / "refs" / "main").read_text() == sha
    v2 = commits["v2"]
    fetched = {p.name for p in snapshot.iterdir()}
    assert fetched == {f for f in v2 if f.startswith(("config", "generation", "model", "tokenizer"))}
    for name in fetched:  # the HF cache layout: snapshot entries link to blobs named by their etag
        link = snapshot / name
        assert link.is_symlink() and link.resolve().parent.name == "blobs" and link.read_bytes() == v2[name]
        if name.endswith(".safetensors"):
            assert link.resolve().name == hashlib.sha256(v2[name]).hexdigest()
    assert torch.equal(load_file(out / "model.safetensors")["embed.weight"],
                       hf_tensor(v2, "model.embed_tokens.weight"))
    result = CliRunner().invoke(main, ["verify", str(out)])  # against the recorded source: the snapshot
    assert result.exit_code == 0 and "PASS" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_pinned_revision_by_sha_and_by_branch(hub: HubServer, commits: dict[str, dict[str, bytes]],
                                              tmp_path: Path) -> None:
    env = hub_env(hub.url, tmp_path / "hf")
    v1_sha = hub.repos[TINY].refs["v1"]
    for revision, out in ((v1_sha, tmp_path / "by-sha"), ("v1", tmp_path / "by-branch")):
        proc = lmconvert("pull", TINY, "--revision", revision, "--out", out, env=env)
        assert proc.returncode == 0, proc.stderr
        source = json.loads((out / "lmconvert.json").read_text())["source"]
        assert source["revision"] == v1_sha and source.get("ref", v1_sha) == revision
        assert source["path"] == str(snapshot_dir(tmp_path / "hf", TINY, v1_sha).resolve())
        embed = load_file(out / "model.safetensors")["embed.weight"]
        assert torch.equal(embed, hf_tensor(commits["v1"], "model.embed_tokens.weight"))
        assert not torch.equal(embed, hf_tensor(commits["v2"], "model.embed_tokens.weight"))
    assert (tmp_path / "hf" / "hub" / "models--org--tiny-llama" / "refs" / "v1").read_text() == v1_sha


@pytest.mark.slow
def test_gated_repo_needs_a_token(hub: HubServer, tmp_path: Path) -> None:
    repo, env = "org/gated-llama", hub_env(hub.url, tmp_path / "hf")
    proc = lmconvert("pull", repo, "--out", tmp_path / "out", env=env)
    line = assert_one_line_error(proc, repo, "HF_TOKEN", "--token", f"{hub.url}/{repo}", "licence")
    assert "no access" not in line
    proc = lmconvert("pull", repo, "--out", tmp_path / "out", env={**env, "HF_TOKEN": "hf_someone_else"})
    assert_one_line_error(proc, repo, "no access", f"{hub.url}/{repo}")
    assert not (tmp_path / "out").exists()
    since = len(hub.requests)
    proc = lmconvert("pull", repo, "--token", "hf_granted", "--out", tmp_path / "out", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "out" / "lmconvert.json").read_text())["source"]["repo"] == repo
    resolves = [r for r in hub.log(since, "hub") if "/resolve/" in r.path]
    assert resolves and all(r.authorization == "Bearer hf_granted" for r in resolves)
    downloads = hub.log(since, "cdn")
    assert downloads and all(r.authorization is None for r in downloads)  # the token stays on the Hub


@pytest.mark.slow
@pytest.mark.parametrize("args, fragments", [
    (["org/no-such-model"], ["org/no-such-model", "no such model repo", "HF_TOKEN"]),
    ([TINY, "--revision", "no-such-branch"], [TINY, "'no-such-branch'", "--revision"]),
    ([TINY, "--revision", "0" * 40], [TINY, "0" * 40, "--revision"]),
])
def test_missing_repo_or_revision(hub: HubServer, tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    proc = lmconvert("pull", *args, "--out", tmp_path / "out", env=hub_env(hub.url, tmp_path / "hf"))
    assert_one_line_error(proc, *fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_index_listing_a_shard_the_repo_lacks(hub: HubServer, commits: dict[str, dict[str, bytes]],
                                              tmp_path: Path) -> None:
    proc = lmconvert("pull", "org/half-upload", "--out", tmp_path / "out", env=hub_env(hub.url, tmp_path / "hf"))
    assert_one_line_error(proc, "org/half-upload", last_shard(commits), "model.safetensors.index.json")
    assert not (tmp_path / "out").exists()
    blobs = tmp_path / "hf" / "hub" / "models--org--half-upload" / "blobs"
    assert len(list(blobs.iterdir())) == 1  # only the index: no weights fetched for nothing


@pytest.mark.slow
def test_listed_file_that_cannot_be_downloaded(hub: HubServer, commits: dict[str, dict[str, bytes]],
                                               tmp_path: Path) -> None:
    proc = lmconvert("pull", "org/lost-shard", "--out", tmp_path / "out", env=hub_env(hub.url, tmp_path / "hf"))
    assert_one_line_error(proc, "org/lost-shard", last_shard(commits), "cannot be downloaded")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cut_off_downloads_are_retried(hub: HubServer, commits: dict[str, dict[str, bytes]], tmp_path: Path) -> None:
    """The server drops the connection part way through two files. huggingface_hub retries each after a
    second: from the start when less than its 10 MiB chunk had arrived (what came is discarded), else
    with `Range: bytes=<whole chunks received>-`. The pull completes, with the right bytes."""
    since = len(hub.requests)
    home = tmp_path / "hf"
    assert CHUNK == huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE
    proc = lmconvert("pull", "org/flaky-llama", "--out", tmp_path / "out", env=hub_env(hub.url, home))
    assert proc.returncode == 0, proc.stderr
    big = commits["big"]
    weights = [r.range for r in hub.log(since, "cdn") if r.method == "GET"]
    assert weights == [None, f"bytes={CHUNK}-"]
    tokenizer = [r.range for r in hub.log(since, "hub") if r.method == "GET" and r.path.endswith("/tokenizer.json")]
    assert tokenizer == [None, None]
    snapshot = snapshot_dir(home, "org/flaky-llama", hub.repos["org/flaky-llama"].refs["main"])
    assert (snapshot / "model.safetensors").read_bytes() == big["model.safetensors"]
    assert (snapshot / "tokenizer.json").read_bytes() == big["tokenizer.json"]
    assert torch.equal(load_file(tmp_path / "out" / "model.safetensors")["lm_head.weight"],
                       hf_tensor(big, "lm_head.weight"))


@pytest.mark.slow
def test_download_that_keeps_failing_exits_2_without_output(hub: HubServer, tmp_path: Path) -> None:
    since = len(hub.requests)
    home = tmp_path / "hf"
    proc = lmconvert("pull", "org/dead-llama", "--out", tmp_path / "out", env=hub_env(hub.url, home))
    assert_one_line_error(proc, "org/dead-llama", "re-run")
    assert not (tmp_path / "out").exists()
    assert len([r for r in hub.log(since, "cdn") if r.method == "GET"]) == 6  # huggingface_hub: 1 try + 5 retries
    blobs = home / "hub" / "models--org--dead-llama" / "blobs"
    assert not [p for p in blobs.iterdir() if len(p.name) == 64]  # no weights blob, not even a partial one


@pytest.mark.slow
def test_offline_rerun_from_the_cache(pulled: tuple[Path, Path], hub: HubServer, tmp_path: Path) -> None:
    home, first = pulled
    recorded = json.loads((first / "lmconvert.json").read_text())
    since = len(hub.requests)
    proc = lmconvert("pull", TINY, "--out", tmp_path / "offline", env=hub_env(hub.url, home, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    assert hub.log(since) == []  # not one request
    # the Hub unreachable without HF_HUB_OFFLINE: the same, from the cached ref and listing
    proc = lmconvert("pull", TINY, "--out", tmp_path / "unreachable", env=hub_env(refusing_url(), home))
    assert proc.returncode == 0, proc.stderr
    for out in (tmp_path / "offline", tmp_path / "unreachable"):
        meta = json.loads((out / "lmconvert.json").read_text())
        assert meta["source"] == recorded["source"] and meta["tensors"] == recorded["tensors"]
    proc = lmconvert("pull", "org/flaky-llama", "--out", tmp_path / "never", env=hub_env(hub.url, home,
                                                                                           HF_HUB_OFFLINE="1"))
    assert_one_line_error(proc, "org/flaky-llama", "HF_HUB_OFFLINE", "cache")


@pytest.mark.slow
def test_pull_with_verify_into_the_default_out(pulled: tuple[Path, Path], hub: HubServer, tmp_path: Path) -> None:
    home, _ = pulled
    proc = lmconvert("pull", TINY, "--verify", env=hub_env(hub.url, home), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout and "max |Δlogit|" in proc.stdout
    assert (tmp_path / "tiny-llama" / "lmconvert.json").is_file()
    since = len(hub.requests)
    proc = lmconvert("pull", TINY, env=hub_env(hub.url, home), cwd=tmp_path)
    assert_one_line_error(proc, "tiny-llama", "--force")
    assert hub.log(since) == []  # refused before any download


@pytest.mark.slow
def test_bin_weights_only_when_there_is_no_safetensors(hub: HubServer, commits: dict[str, dict[str, bytes]],
                                                       tmp_path: Path) -> None:
    from lmconvert.formats.checkpoint import FORMATS

    home = tmp_path / "hf"
    proc = lmconvert("pull", "org/bin-llama", "--out", tmp_path / "out", env=hub_env(hub.url, home))
    snapshot = snapshot_dir(home, "org/bin-llama", hub.repos["org/bin-llama"].refs["main"])
    assert (snapshot / "pytorch_model.bin").read_bytes() == commits["bin"]["pytorch_model.bin"]
    assert {p.name for p in snapshot.iterdir()} == set(commits["bin"])
    if "hf-bin" in [name for name, _, _ in FORMATS]:
        assert proc.returncode == 0, proc.stderr
        result = CliRunner().invoke(main, ["verify", str(tmp_path / "out")])
        assert result.exit_code == 0 and "PASS" in result.stdout, result.stdout + result.stderr
    else:  # the .bin reader is not there yet: the download is right, the conversion refuses cleanly
        assert_one_line_error(proc, "no weights in a supported format")


@pytest.mark.parametrize("listing, wanted, index", [
    (["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "README.md", "original/x.pth"],
     ["config.json", "model.safetensors", "tokenizer.json"], None),
    (["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "generation_config.json",
      "pytorch_model.bin.index.json", "special_tokens_map.json", "tokenizer.model", "consolidated.safetensors"],
     ["config.json", "model.safetensors.index.json", "generation_config.json", "special_tokens_map.json",
      "tokenizer.model"], "model.safetensors.index.json"),
    (["config.json", "pytorch_model.bin", "merges.txt", "vocab.json", "flax_model.msgpack"],
     ["config.json", "pytorch_model.bin", "merges.txt", "vocab.json"], None),
    (["config.json", "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin"],
     ["config.json", "pytorch_model.bin.index.json"], "pytorch_model.bin.index.json"),
])
def test_select_files(listing: list[str], wanted: list[str], index: str | None) -> None:
    files, got_index = select_files(listing, "org/x@sha")
    assert got_index == index
    assert sorted(files) == sorted(wanted)  # shards come from the index, after it is downloaded


@pytest.mark.parametrize("listing, fragment", [
    (["model.safetensors"], "no config.json"),
    (["config.json", "consolidated.safetensors", "original/model.pth"], "consolidated.safetensors"),
])
def test_select_files_refuses(listing: list[str], fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        select_files(listing, "org/x@sha")


def test_help_lists_pull() -> None:
    assert "pull" in CliRunner().invoke(main, ["--help"]).stdout
    result = CliRunner().invoke(main, ["pull", "--help"])
    assert result.exit_code == 0
    for option in ("--revision", "--out", "--verify", "--dtype", "--device", "--token", "--force"):
        assert option in result.stdout


@pytest.mark.slow
def test_a_gguf_export_records_the_hub_source_not_a_local_path(pulled: tuple[Path, Path], hub: HubServer,
                                                               tmp_path: Path) -> None:
    """#28: users share GGUF files; one written from a pulled checkpoint names its repo and commit
    (`hf://REPO@SHA`), nothing of this machine, and `verify` finds that source in the HF cache."""
    import gguf

    home, out = pulled
    env = hub_env(hub.url, home, HF_HUB_OFFLINE="1")
    sha = hub.repos[TINY].refs["main"]
    path = tmp_path / "m.gguf"  # as granite: transformers' GGUF loader does not read it, so verify needs the source
    proc = lmconvert("convert", out, path, "--to", "gguf", "--quant", "f32", "--family", "granite",
                     "--gguf-pre", "gpt-2", env=env)
    assert proc.returncode == 0, proc.stderr
    fields = gguf.GGUFReader(path).fields
    assert fields["lmconvert.source"].contents() == f"hf://{TINY}@{sha}"
    # the repo's name as llama.cpp's converter titles a model's id (gguf.Metadata), not the snapshot folder's sha
    assert fields["general.name"].contents() == gguf.Metadata.id_to_title(TINY.rsplit("/", 1)[-1]) == "Tiny Llama"
    strings = [str(f.contents()) for f in fields.values() if f.types and f.types[0] == gguf.GGUFValueType.STRING]
    assert not [s for s in strings if str(tmp_path.parent) in s or str(home) in s], strings
    proc = lmconvert("verify", path, "--seq-len", 20, "--generate", 2, env=env)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stderr
    empty = hub_env(hub.url, tmp_path / "empty-cache", HF_HUB_OFFLINE="1")
    proc = lmconvert("verify", path, "--seq-len", 20, env=empty)
    assert_one_line_error(proc, f"hf://{TINY}@{sha}"[5:], "not in the HF cache", "--reference")


@pytest.mark.slow
def test_ctrl_c_during_a_download_takes_effect_at_once(commits: dict[str, dict[str, bytes]], tmp_path: Path) -> None:
    """#28: Ctrl-C waited for huggingface_hub's download threads, so a large shard finished first (a
    38 MB file took 16 s). Here the file trickles in for ~40 s: the run ends long before the server
    has sent it, with our one line and exit 130, no output, and the partial download left as
    huggingface_hub's resumable `.incomplete`."""
    import signal
    import time

    big = commits["big"]["model.safetensors"]
    server = HubServer()
    server.add_repo("org/slow-llama", [commits["big"]], slow={"model.safetensors"})
    home, out = tmp_path / "hf", tmp_path / "out"
    with server:
        proc = subprocess.Popen([sys.executable, "-m", "lmconvert.cli", "pull", "org/slow-llama", "--out", str(out)],
                                env=hub_env(server.url, home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        blobs = home / "hub" / "models--org--slow-llama" / "blobs"
        for _ in range(300):  # until the weights are coming in
            if proc.poll() is not None or list(blobs.glob("*.incomplete")):
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        sent = server.repos["org/slow-llama"].sent.get(hashlib.sha256(big).hexdigest(), 0)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["lmconvert: error: interrupted; no output was written"], stderr
    assert sent < len(big), "the download ran to its end before the interrupt took effect"
    assert list(blobs.glob("*.incomplete")) and not out.exists()


@pytest.mark.slow
def test_library_warnings_do_not_add_lines_to_our_error(commits: dict[str, dict[str, bytes]], tmp_path: Path) -> None:
    """#28: huggingface_hub's `warnings.warn` of a cache without the space a file needs put two lines
    before ours. Here the Hub announces 1 PB for the weights (no disk has that free), then sends the
    real bytes: the one line is ours, exit 2, no output."""
    server = HubServer()
    server.add_repo("org/huge-llama", [commits["v1"]], oversized={"model.safetensors"})
    out = tmp_path / "out"
    with server:
        proc = lmconvert("pull", "org/huge-llama", "--out", out, env=hub_env(server.url, tmp_path / "hf"))
    assert_one_line_error(proc, "org/huge-llama")
    assert not out.exists()


@pytest.mark.slow
def test_pull_draws_bytes_downloaded_then_converted(hub: HubServer, commits: dict[str, dict[str, bytes]],
                                                   tmp_path: Path) -> None:
    """On a terminal: huggingface_hub's bars give way to the one line, which counts the bytes of every
    file it downloads (a sharded repo: the index first, then the shards it lists and the side files),
    then the bytes the conversion writes."""
    from terminal import run_in_terminal

    from lmconvert.cli.progress import size

    proc, lines = run_in_terminal("pull", TINY, "--out", tmp_path / "out", env=hub_env(hub.url, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    fetched = sum(f.stat().st_size for f in snapshot_dir(tmp_path / "hf", TINY, hub.repos[TINY].refs["main"]).iterdir())
    written = sum(t.nbytes for f in (tmp_path / "out").glob("*.safetensors") for t in load_file(f).values())
    downloading = [x for x in lines if x.startswith(f"downloading {TINY}: ")]
    converting = [x for x in lines if x.startswith(f"converting {TINY}: ")]
    assert lines == downloading + converting, lines
    assert downloading[-1].startswith(f"downloading {TINY}: {size(fetched)} of {size(fetched)} (100%)"), lines
    assert converting[-1].startswith(f"converting {TINY}: {size(written)} of {size(written)} (100%)"), lines


@pytest.mark.slow  # 3 s, as the other pulls are marked
def test_pull_of_a_gemma4_unified_checkpoint_in_the_hub_layout(tmp_path: Path) -> None:
    """A tiny Gemma4UnifiedForConditionalGeneration as the Hub repos hold it (transformers' save_pretrained writes
    the published names: `model.language_model.`, `model.vision_embedder.`, `model.embed_vision.` and
    `model.embed_audio.`), its text config in the Hub's spelling (`global_head_dim` and
    `num_global_key_value_heads`, not transformers 5.25's `per_layer_config`): `lmconvert pull` converts its text
    decoder, whose logits are transformers' wrapper's."""
    import transformers
    from family_specs import IDS, SPECS
    from hf_models import TINY as TEXT
    from hf_models import perturb

    text = {**TEXT, **SPECS["gemma4_unified_text"].kwargs, "model_type": "gemma4_unified_text"}
    config = transformers.Gemma4UnifiedConfig(
        text_config=text, vision_config=dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=64, mm_posemb_size=16,
                                             output_proj_dims=64),
        audio_config=dict(audio_embed_dim=16), image_token_id=1000, boi_token_id=1001, eoi_token_id=1002,
        video_token_id=1003, boa_token_id=1004, eoa_token_index=1005, audio_token_id=1006)
    torch.manual_seed(0)
    model = transformers.Gemma4UnifiedForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(tmp_path / "repo")
    with torch.no_grad():
        reference = model(IDS).logits
    files = files_of(tmp_path / "repo")
    hub_config = json.loads(files["config.json"])
    stated = hub_config["text_config"].pop("per_layer_config")
    assert {v["head_dim"] for v in stated.values()} == {text["global_head_dim"]}
    hub_config["text_config"].update(global_head_dim=text["global_head_dim"],
                                     num_global_key_value_heads=text["num_global_key_value_heads"])
    files["config.json"] = json.dumps(hub_config).encode()
    stored = set(load(files["model.safetensors"]))
    assert any(n.startswith("model.vision_embedder.") for n in stored)  # the Hub's names, not the in-memory ones
    assert "model.language_model.layers.0.layer_scalar" in stored
    server = HubServer()
    server.add_repo("google/gemma-4-tiny-it", [files])
    with server:
        proc = lmconvert("pull", "google/gemma-4-tiny-it", "--out", tmp_path / "out",
                         env=hub_env(server.url, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    import lmconvert as lm

    ours = lm.load(tmp_path / "out", attention="eager")
    assert ours.cfg.global_head_dim == text["global_head_dim"] and ours.cfg.kv_shared_layers == 2
    with torch.no_grad():
        assert float((ours(IDS) - reference).abs().max()) <= 1e-5
