"""The command line as a user meets it: every command, exit codes, one-line errors, atomic output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_models import build_model, load_reference, make_checkpoint, save_checkpoint, save_tiny_tokenizer
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from lmconvert.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("src") / "hf", attention_bias=True)


@pytest.fixture(scope="module")
def canonical(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("can") / "canonical"
    code, _, err = run("convert", hf_dir, out)
    assert code == 0, err
    return out


def test_help_documents_every_command() -> None:
    code, out, _ = run("--help")
    assert code == 0
    for command in ("convert", "verify", "inspect", "generate"):
        assert command in out
        sub_code, sub_out, _ = run(command, "--help")
        assert sub_code == 0 and "Usage:" in sub_out


def test_console_script_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "lmconvert.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "convert" in proc.stdout


def test_python_m_lmconvert_is_the_lmconvert_command(canonical: Path, tmp_path: Path) -> None:
    """`python -m lmconvert` (what torchrun launches) against the installed console script's entry
    point, called the way the script calls it: the same output, errors and exit codes, but for
    the program name click prints."""
    script = ("import sys; from importlib.metadata import entry_points; sys.argv[0] = 'lmconvert'; "
              "(main,) = entry_points(group='console_scripts', name='lmconvert'); sys.exit(main.load()())")
    for args in (["--help"], ["verify", "--help"], ["verify", str(tmp_path / "missing")], ["inspect", str(canonical)]):
        module, command = (subprocess.run([sys.executable, *how, *args], capture_output=True, text=True, cwd=tmp_path)
                           for how in (["-m", "lmconvert"], ["-c", script]))
        assert module.returncode == command.returncode, args
        assert module.stdout.replace("python -m lmconvert", "lmconvert") == command.stdout, args
        assert module.stderr.replace("python -m lmconvert", "lmconvert") == command.stderr, args
        assert module.stdout or module.stderr


def test_under_torchrun_a_rank_leaves_without_the_interpreters_teardown(canonical: Path, tmp_path: Path) -> None:
    """With torchrun's variables set, the command's output and exit code are as ever, but no atexit
    handler runs: the interpreter's teardown, where a gloo group kept by DTensor's caches can abort a
    finished rank, is skipped. Without them it runs as usual."""
    script = ("import atexit, sys; atexit.register(lambda: print('teardown ran', file=sys.stderr)); "
              "sys.argv = ['lmconvert', *sys.argv[1:]]; from lmconvert.cli import entry; entry()")
    ranks = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    plain = {k: v for k, v in os.environ.items() if k not in ranks}
    for args, code, said in ((["inspect", str(canonical)], 0, "llama"),
                             (["verify", str(tmp_path / "missing")], 2, "does not exist")):
        launched, alone = (subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                                          env=env, cwd=tmp_path) for env in ({**plain, **ranks}, plain))
        assert launched.returncode == alone.returncode == code, launched.stderr
        assert said in launched.stdout + launched.stderr
        assert launched.stdout == alone.stdout
        assert "teardown ran" not in launched.stderr and "teardown ran" in alone.stderr


@pytest.mark.parametrize("command", [["diff", "{canonical}", "{hf_dir}"], ["inspect", "{canonical}"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(canonical: Path, hf_dir: Path, command: list[str]) -> None:
    """`lmconvert diff A B | head -1`: the pipe closes before the command writes; it exits 141, as a
    program SIGPIPE ends, with nothing on stderr (it was exit 2 with "Broken pipe; nothing was written")."""
    args = [a.format(canonical=canonical, hf_dir=hf_dir) for a in command]
    proc = subprocess.Popen([sys.executable, "-m", "lmconvert.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == b"", err


def test_canonical_layout(canonical: Path, hf_dir: Path) -> None:
    meta = json.loads((canonical / "lmconvert.json").read_text())
    assert meta["family"] == "llama" and meta["arch"]["q_bias"] is True
    assert meta["source"]["path"] == str(hf_dir.resolve())
    assert set(meta["tensors"]) == set(load_file(canonical / "model.safetensors"))
    assert (canonical / "generation_config.json").read_bytes() == (hf_dir / "generation_config.json").read_bytes()


def test_verify_passes_and_writes_json(canonical: Path, tmp_path: Path) -> None:
    code, out, _ = run("verify", canonical, "--json", tmp_path / "r.json")
    assert code == 0, out
    assert "PASS" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] and report["max_abs"] <= 1e-5 and report["top1"] == 1.0


def test_verify_json_to_stdout(canonical: Path) -> None:
    code, out, _ = run("verify", canonical, "--json", "-")
    assert code == 0 and json.loads(out)["passed"]


def test_verify_bf16_uses_faithfulness(canonical: Path) -> None:
    code, out, _ = run("verify", canonical, "--dtype", "bfloat16", "--json", "-")
    report = json.loads(out)
    assert code == 0
    assert report["ours_error"] <= 1.25 * report["reference_error"]


def test_verify_fails_on_a_nudged_tensor(canonical: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    run("convert", canonical, tmp_path / "hf-again", "--to", "hf")
    code, _, _ = run("convert", tmp_path / "hf-again", broken)
    assert code == 0
    tensors = load_file(broken / "model.safetensors")
    tensors["layers.1.mlp.up.weight"][3, 5] += 0.05
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    code, out, err = run("verify", broken)
    assert code == 1
    assert "FAIL" in out and "parity check failed" in err


def test_inspect_card(canonical: Path) -> None:
    code, out, _ = run("inspect", canonical)
    assert code == 0
    assert "llama" in out and "GQA" in out and "SwiGLU" in out and "biases: q, k, v, o" in out
    code, out, _ = run("inspect", canonical, "--json")
    info = json.loads(out)
    assert info["parameters"] == sum(t.numel() for t in load_file(canonical / "model.safetensors").values())
    assert info["kv_cache_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # k+v, layers, kv heads, head_dim, fp32


def test_generate_matches_transformers(tmp_path: Path) -> None:
    vocab = save_tiny_tokenizer(tmp_path / "hf")
    model = build_model("llama", vocab_size=vocab)
    hf_dir = save_checkpoint(model, tmp_path / "hf")
    assert run("convert", hf_dir, tmp_path / "can")[0] == 0
    code, out, err = run("generate", tmp_path / "can", "--prompt", "The capital of France is", "--max-new-tokens", 12)
    assert code == 0, err
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        theirs = load_reference(hf_dir).generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                                                 pad_token_id=0)
    expected = "The capital of France is" + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True)
    assert out.strip("\n") == expected


def test_generate_stops_on_any_eos_the_generation_config_names(tmp_path: Path) -> None:
    vocab = save_tiny_tokenizer(tmp_path / "hf")
    hf_dir = save_checkpoint(build_model("llama", vocab_size=vocab), tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    reference = load_reference(hf_dir)
    with torch.no_grad():
        free = reference.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    new = free[0, ids.shape[1]:].tolist()
    second = next(token for token in new[3:] if token not in new[:3])  # the list's second id ends it there
    unused = next(token for token in range(vocab) if token not in new)
    config = json.loads((hf_dir / "generation_config.json").read_text())
    (hf_dir / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [unused, second]}))
    assert run("convert", hf_dir, tmp_path / "can")[0] == 0
    code, out, err = run("generate", tmp_path / "can", "--prompt", "The capital of France is", "--max-new-tokens", 12)
    assert code == 0, err
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=[unused, second],
                                    pad_token_id=0)
    assert theirs.shape[1] < free.shape[1]
    expected = "The capital of France is" + tokenizer.decode(theirs[0, ids.shape[1]:], skip_special_tokens=True)
    assert out.strip("\n") == expected


def test_errors_are_one_line_with_exit_2(hf_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    (bad / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    code, out, err = run("convert", bad, tmp_path / "out")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "not-a-model" in err and "llama" in err  # names the problem and the supported families
    assert not (tmp_path / "out").exists()


def test_debug_shows_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    (bad / "model.safetensors").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "lmconvert.cli", "--debug", "convert", str(bad), str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "lmconvert.cli", "convert", str(bad), str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "config.json" in proc.stderr


def test_existing_output_needs_force(hf_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run("convert", hf_dir, out)
    assert code == 2 and "--force" in err and (out / "keep.txt").exists()
    code, _, err = run("convert", hf_dir, out, "--force")  # --force replaces only what lmconvert wrote
    assert code == 2 and "not an output lmconvert wrote" in err and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    out.rmdir()
    assert run("convert", hf_dir, out)[0] == 0
    before = out.stat().st_ino
    code, _, err = run("convert", hf_dir, out, "--force")
    assert code == 0, err
    assert out.stat().st_ino != before and (out / "lmconvert.json").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--quant", "q8_0"], "--quant only applies with --to gguf"),
    (["--family", "llama"], "--family only applies with --to hf"),
    (["--max-shard-size", "lots"], "--max-shard-size"),
])
def test_argument_errors(hf_dir: Path, tmp_path: Path, args: list[str], fragment: str) -> None:
    code, _, err = run("convert", hf_dir, tmp_path / "out", *args)
    assert code == 2 and fragment in err


def test_unknown_export_family(canonical: Path, tmp_path: Path) -> None:
    code, _, err = run("convert", canonical, tmp_path / "out", "--to", "hf", "--family", "nope")
    assert code == 2 and "nope" in err and "llama" in err
    assert not (tmp_path / "out").exists()


def test_shape_mismatch_names_both_shapes(hf_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    config = json.loads((hf_dir / "config.json").read_text())
    config["intermediate_size"] = 100
    (src / "config.json").write_text(json.dumps(config))
    (src / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    code, _, err = run("convert", src, tmp_path / "out")
    assert code == 2 and "[64, 96]" in err and "[64, 100]" in err


def test_missing_lm_head_when_untied(hf_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, src / "model.safetensors")
    code, _, err = run("convert", src, tmp_path / "out")
    assert code == 2 and "lm_head" in err


def test_inspect_reads_any_input_format(hf_dir: Path, canonical: Path) -> None:
    """The card of an HF directory (and of a single-file GGUF, in test_formats_gguf) equals the
    card of its canonical conversion."""
    code, out, _ = run("inspect", hf_dir, "--json")
    assert code == 0
    assert json.loads(out) == json.loads(run("inspect", canonical, "--json")[1])


def test_a_mixed_dtype_checkpoint_is_described_by_the_dtype_holding_most_bytes(tmp_path: Path) -> None:
    """Here the two vocabulary matrices are fp32 and every other tensor bf16. Those two come first
    in both orders (the file's, where lm_head sorts first, and the canonical one, embedding first);
    the model's dtype (inspect's, lmconvert.json's, and the export's config.json) is still bf16."""
    src = make_checkpoint(tmp_path / "hf", dtype=torch.bfloat16)
    weights = load_file(src / "model.safetensors")
    wide = ("lm_head.weight", "model.embed_tokens.weight")
    for name in wide:
        weights[name] = weights[name].float()
    assert sum(weights[n].numel() * 4 for n in wide) < sum(t.numel() * 2 for n, t in weights.items() if n not in wide)
    save_file(weights, src / "model.safetensors", metadata={"format": "pt"})
    code, out, _ = run("inspect", src, "--json")
    assert code == 0 and json.loads(out)["dtype"] == "bfloat16"
    code, _, err = run("convert", src, tmp_path / "canonical")
    assert code == 0, err
    assert json.loads((tmp_path / "canonical" / "lmconvert.json").read_text())["dtype"] == "bfloat16"
    code, _, err = run("convert", tmp_path / "canonical", tmp_path / "export", "--to", "hf")
    assert code == 0, err
    assert json.loads((tmp_path / "export" / "config.json").read_text())["dtype"] == "bfloat16"
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert all(exported[n].dtype == torch.float32 for n in wide)  # each tensor keeps its own dtype
