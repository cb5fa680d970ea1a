"""`lmconvert diff` on what llama.cpp's own converter (convert_hf_to_gguf.py) writes from an HF
checkpoint: its f32 file holds the checkpoint bit for bit under canonical names (q and k rows
permuted by the converter, unpermuted by our reader), and its q8_0 file is within Q8_0's bound
(test_diff.py) of it. Runs with the llama.cpp tests (`-m llamacpp`): the converter comes from the
llama-cpp-python sdist, as in test_llamacpp.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import make_checkpoint
from safetensors.torch import load_file
from test_diff import Q8_0_ERROR, diffed, statuses
from test_llamacpp import converter  # noqa: F401 - the fixture: llama.cpp's convert_hf_to_gguf.py
from transformers import AutoTokenizer

from lmconvert.formats.smollm2 import smollm2_path

pytestmark = pytest.mark.llamacpp


def test_llama_cpp_s_converter_output_against_its_source(converter: Path, tmp_path: Path) -> None:  # noqa: F811
    """A tiny LLaMA with SmolLM2's tokenizer (a BPE one llama.cpp's converter knows), converted by
    llama.cpp to f32 and to q8_0, each diffed against the HF directory it came from."""
    gguf_file = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    hf = make_checkpoint(tmp_path / "hf", "llama", vocab_size=len(tokenizer), tie_word_embeddings=False)
    tokenizer.save_pretrained(hf)
    source = load_file(hf / "model.safetensors")
    files = {}
    for outtype in ("f32", "q8_0"):
        files[outtype] = tmp_path / f"llama-cpp-{outtype}.gguf"
        run = subprocess.run([sys.executable, str(converter), str(hf), "--outfile", str(files[outtype]),
                              "--outtype", outtype], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]

    code, report, out, _ = diffed(hf, files["f32"], tmp_path)
    assert code == 0, out
    assert set(statuses(report).values()) == {"identical"} and len(report["tensors"]) == len(source)

    atol = Q8_0_ERROR * max(float(t.abs().max()) for t in source.values())
    code, strict, _, _ = diffed(hf, files["q8_0"], tmp_path)
    assert code == 1
    code, report, out, _ = diffed(hf, files["q8_0"], tmp_path, "--atol", atol)
    assert code == 0, out
    quantized = {t["name"] for t in report["tensors"] if t["b"]["dtype"] == "Q8_0"}
    assert {n for n, s in statuses(strict).items() if s == "different"} == quantized
    assert len(quantized) == sum(t.dim() == 2 for t in source.values())  # every matrix; norms stay F32
    for tensor in report["tensors"]:
        if tensor["name"] in quantized:
            assert 0 < tensor["max_abs"] <= atol and tensor["status"] == "within tolerance", tensor
        else:
            assert tensor["status"] == "identical" and tensor["b"]["dtype"] == "F32", tensor
    print(f"llama.cpp's converter, q8_0 against its HF source: {json.dumps(report['summary'])}, "
          f"largest max|Δ| {max(t['max_abs'] for t in report['tensors']):.2e} (bound {atol:.2e})")
