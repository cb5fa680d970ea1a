"""Issue #28, round three, classes 1 and 2: what lmconvert writes never costs the user a file.

1. Cleanup removes only temporaries that a run of lmconvert marked as its own for this OUT and
   that has certainly ended (pid and process start time), never a name that merely looks like one.
2. verify's --json and --save-golden obey convert's OUT rule: never an input, inside one, or a
   directory holding one; an existing file only with --force, and only one lmconvert wrote.
3. Every writer is atomic, and a failed write (a full disk: RLIMIT_FSIZE here, a real EFBIG from
   the kernel) exits 2 with one line naming the user's file, leaving nothing behind.
4. Any OUT whose name the filesystem accepts can be written: the temporaries' names fit NAME_MAX.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from bad_input import Result, assert_clean_failure, left_by_a_killed_run, lmconvert, lmconvert_process
from hf_models import make_checkpoint

MARKER = "lmconvert-temporary.json"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaMA whose FFN size Meta's layout can state (so --to meta works from its canonical form)."""
    return make_checkpoint(tmp_path_factory.mktemp("good") / "hf", intermediate_size=192)


@pytest.fixture(scope="module")
def canonical(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("canonical") / "can"
    proc = lmconvert("convert", good, out)
    assert proc.returncode == 0, proc.stderr
    return out


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def hidden(directory: Path) -> list[str]:
    """What a run left beside its outputs: every dot-name in the directory."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def limited(limit: int):  # noqa: ANN201 - a preexec_fn
    """A child whose files may not grow past `limit` bytes: writes then fail with EFBIG, as on a
    full disk (SIGXFSZ ignored, so the write returns the error instead of killing the process)."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def run_limited(limit: int, *args: object) -> Result:
    proc = lmconvert_process(*args, preexec_fn=limited(limit))
    stdout, stderr = proc.communicate()
    return Result(proc.returncode, stdout, stderr)


# ---------------------------------------------------------------- 1. cleanup deletes only its own

def test_a_users_directories_shaped_like_old_temporaries_are_left_alone(good: Path, tmp_path: Path) -> None:
    """`.out.tmp-20240101-mybackup/` was deleted by a plain `convert SRC out` (20240101 is no live
    pid); `.out.old-*` holding an `out` was moved into OUT. No marker, no proof: all are kept."""
    out = tmp_path / "out"
    backup = tmp_path / ".out.tmp-20240101-mybackup"
    backup.mkdir()
    (backup / "notes.txt").write_text("mine")
    old = tmp_path / ".out.old-mybackup"
    (old / "out").mkdir(parents=True)
    (old / "out" / "weights.bin").write_bytes(b"mine too")
    unmarked = tmp_path / ".out.lmconvert-writing-20240101-0a1b2c3d"  # today's shape, but nobody's marker
    unmarked.mkdir()
    (unmarked / "model.safetensors").write_bytes(b"not lmconvert's")
    before = {p: tree(p) for p in (backup, old, unmarked)}
    proc = lmconvert("convert", good, out)
    assert proc.returncode == 0, proc.stderr
    assert {p: tree(p) for p in (backup, old, unmarked)} == before
    assert (out / "lmconvert.json").is_file()


@pytest.mark.parametrize("kind, how", [("writing", "copy"), ("replaced", "move"), ("replaced", "copy")])
def test_a_killed_runs_marked_temporary_is_cleaned_up(good: Path, tmp_path: Path, kind: str, how: str) -> None:
    """What a SIGKILLed run left: a half-written output is removed, a replaced OUT put back when
    OUT is missing, else removed."""
    out = tmp_path / "out"
    assert lmconvert("convert", good, out).returncode == 0
    previous = tree(out)
    left = left_by_a_killed_run(out, kind, how)
    assert json.loads((left / MARKER).read_text())["out"] == str(out.resolve())
    assert_clean_failure(lmconvert("convert", good, out), "already exists", "--force")
    assert tree(out) == previous and hidden(tmp_path) == []


def edit_marker(left: Path, **run: object) -> None:
    marker = json.loads((left / MARKER).read_text())
    marker["run"].update(run)
    (left / MARKER).write_text(json.dumps(marker))


def stat_start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_a_recycled_pid_is_told_apart_by_its_start_time(good: Path, tmp_path: Path) -> None:
    """A marker whose pid now belongs to another live process (started at another time) is a
    killed run's: cleaned up. The same pid with its own start time is a live run: kept."""
    out = tmp_path / "out"
    live = subprocess.Popen(["sleep", "60"])
    try:
        recycled = left_by_a_killed_run(out, "writing", "file")
        edit_marker(recycled, pid=live.pid, start=str(int(stat_start(live.pid)) + 1))
        running = left_by_a_killed_run(out, "writing", "file")
        edit_marker(running, pid=live.pid, start=stat_start(live.pid))
        proc = lmconvert("convert", good, out)
        assert proc.returncode == 0, proc.stderr
        assert not recycled.exists()
        assert (running / "output").read_bytes() == b"half"
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("change", [{"host": "another-host"}, {"pid_ns": "pid:[1]"}, {"start": None}])
def test_a_temporary_whose_run_cannot_be_told_is_kept(good: Path, tmp_path: Path, change: dict) -> None:
    """Another host's or container's pid (here a dead one), or a live pid whose start time is
    unknown, proves nothing about that run: when unsure, never delete."""
    out = tmp_path / "out"
    live = subprocess.Popen(["sleep", "60"])
    try:
        left = left_by_a_killed_run(out, "writing", "file")
        edit_marker(left, **change, **({"pid": live.pid} if "start" in change else {}))
        assert lmconvert("convert", good, out).returncode == 0
        assert (left / "output").read_bytes() == b"half"
    finally:
        live.kill()
        live.wait()


def test_a_temporary_marked_for_another_out_or_holding_more_is_kept(good: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    other = left_by_a_killed_run(out, "writing", "file")
    marker = json.loads((other / MARKER).read_text())
    (other / MARKER).write_text(json.dumps({**marker, "out": str(tmp_path / "elsewhere")}))
    added = left_by_a_killed_run(out, "writing", "file")
    (added / "mine.txt").write_text("the user put this here")
    assert lmconvert("convert", good, out).returncode == 0
    assert (other / "output").is_file() and (added / "mine.txt").read_text() == "the user put this here"


# ---------------------------------------------------------------- 2. verify never writes over what it reads

@pytest.fixture
def ck(canonical: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(canonical, tmp_path / "ck"))


@pytest.mark.parametrize("option, name", [("--json", "lmconvert.json"), ("--save-golden", "model.safetensors"),
                                          ("--json", "model.safetensors"), ("--json", "new.json")])
@pytest.mark.parametrize("force", [False, True])
def test_verify_never_writes_into_the_checkpoint(ck: Path, option: str, name: str, force: bool) -> None:
    before = tree(ck)
    proc = lmconvert("verify", ck, option, ck / name, *(["--force"] if force else []))
    assert_clean_failure(proc, f"{option} {ck / name}", "the input")
    assert tree(ck) == before


def test_verify_never_writes_into_the_reference_or_the_golden_it_reads(ck: Path, good: Path, tmp_path: Path) -> None:
    """The recorded source and --reference are read too; so is --golden."""
    before = tree(good)
    for args in (("--json", good / "config.json"), ("--save-golden", good / "golden.safetensors"),
                 ("--reference", good, "--json", good / "report.json")):
        assert_clean_failure(lmconvert("verify", ck, *args, "--force"), "the input", str(good))
    assert tree(good) == before
    golden = tmp_path / "golden.safetensors"
    golden.write_bytes(b"whatever the user keeps here")
    assert_clean_failure(lmconvert("verify", ck, "--golden", golden, "--json", golden, "--force"),
                         f"--json {golden}", "the input")
    assert golden.read_bytes() == b"whatever the user keeps here"


def test_verify_never_replaces_a_directory_holding_an_input(ck: Path, tmp_path: Path) -> None:
    before = tree(ck)
    for force in ([], ["--force"]):
        assert_clean_failure(lmconvert("verify", ck, "--json", tmp_path, *force), f"--json {tmp_path}",
                             "holds the input")
    assert tree(ck) == before


@pytest.mark.slow
def test_verify_outputs_follow_convert_s_force_rule(ck: Path, tmp_path: Path) -> None:
    """An existing file is kept without --force; with it, replaced only if lmconvert wrote it; one
    file is not both --json and --save-golden."""
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"mine": true}\n')
    assert_clean_failure(lmconvert("verify", ck, "--json", theirs), f"--json {theirs}", "already exists", "--force")
    assert_clean_failure(lmconvert("verify", ck, "--json", theirs, "--force"), "is not a file lmconvert wrote")
    assert_clean_failure(lmconvert("verify", ck, "--save-golden", theirs, "--force"),
                         f"--save-golden {theirs}", "is not a file lmconvert wrote")
    assert theirs.read_text() == '{"mine": true}\n'
    both = tmp_path / "both"
    assert_clean_failure(lmconvert("verify", ck, "--json", both, "--save-golden", both), "--save-golden", "--json")
    report, golden = tmp_path / "report.json", tmp_path / "golden.safetensors"
    args = ("verify", ck, "--seq-len", 8, "--generate", 2, "--json", report, "--save-golden", golden)
    assert lmconvert(*args).returncode == 0
    first = report.stat().st_ino, golden.stat().st_ino
    assert_clean_failure(lmconvert(*args), "already exists", "--force")
    proc = lmconvert(*args, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (report.stat().st_ino, golden.stat().st_ino) != first
    assert json.loads(report.read_text())["passed"] and hidden(tmp_path) == []


# ---------------------------------------------------------------- 3. a full disk: exit 2, the file named

@pytest.mark.slow
def test_a_full_disk_during_verify_json_leaves_no_truncated_report(canonical: Path, tmp_path: Path) -> None:
    """The report used to be left 4096 bytes long while the message said nothing was written, and
    named "output" instead of the file."""
    report = tmp_path / "report.json"
    proc = run_limited(4096, "verify", canonical, "--seq-len", 8, "--generate", 2, "--json", report)
    assert_clean_failure(proc, f"--json {report}", "File too large", "nothing was written")
    assert not report.exists() and hidden(tmp_path) == []


@pytest.mark.slow
def test_a_full_disk_during_save_golden_exits_2(canonical: Path, tmp_path: Path) -> None:
    """safetensors' SafetensorError used to escape as an internal error (exit 3)."""
    golden = tmp_path / "golden.safetensors"
    proc = run_limited(4096, "verify", canonical, "--seq-len", 8, "--generate", 2, "--save-golden", golden)
    assert_clean_failure(proc, f"--save-golden {golden}", "File too large", "nothing was written")
    assert not golden.exists() and hidden(tmp_path) == []


@pytest.mark.slow
def test_a_full_disk_during_an_export_to_meta_exits_2(canonical: Path, tmp_path: Path) -> None:
    """torch.save's RuntimeError used to escape as an internal error (exit 3)."""
    out = tmp_path / "meta"
    proc = run_limited(16384, "convert", canonical, out, "--to", "meta")
    assert_clean_failure(proc, str(out), "File too large", "nothing was written")
    assert not out.exists() and hidden(tmp_path) == []


@pytest.mark.slow
def test_a_full_disk_during_a_gguf_export_exits_2(canonical: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    proc = run_limited(16384, "convert", canonical, out, "--to", "gguf", "--quant", "f32")
    assert_clean_failure(proc, str(out), "File too large", "nothing was written")
    assert not out.exists() and hidden(tmp_path) == []


# ---------------------------------------------------------------- 4. any valid OUT name

def test_an_out_name_of_240_characters_is_written_and_replaced(good: Path, canonical: Path, tmp_path: Path) -> None:
    """NAME_MAX is 255; the temporaries' names used to add ~35 characters to OUT's, and the refusal
    named that hidden path."""
    out = tmp_path / ("o" * 240)
    assert lmconvert("convert", good, out).returncode == 0
    proc = lmconvert("convert", good, out, "--force")
    assert proc.returncode == 0, proc.stderr
    gguf = tmp_path / ("g" * 235 + ".gguf")
    proc = lmconvert("convert", canonical, gguf, "--to", "gguf", "--quant", "f32")
    assert proc.returncode == 0, proc.stderr
    assert (out / "lmconvert.json").is_file() and gguf.is_file() and hidden(tmp_path) == []


def test_a_killed_run_for_a_long_out_is_cleaned_up(good: Path, tmp_path: Path) -> None:
    out = tmp_path / ("é" * 120)  # 240 bytes in UTF-8
    assert lmconvert("convert", good, out).returncode == 0
    previous = tree(out)
    left_by_a_killed_run(out, "replaced", "move")
    assert not out.exists()
    assert_clean_failure(lmconvert("convert", good, out), "already exists")
    assert tree(out) == previous and hidden(tmp_path) == []


def test_a_name_too_long_for_the_filesystem_is_named_as_given(good: Path, tmp_path: Path) -> None:
    out = tmp_path / ("o" * 256)
    err = assert_clean_failure(lmconvert("convert", good, out), str(out), "shorter name")
    assert ".lmconvert-" not in err and not os.path.lexists(out) and hidden(tmp_path) == []
