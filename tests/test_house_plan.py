"""The house plan as tests: one place detects formats, and verify opens a checkpoint once.

import-linter (run by `make test`) holds the rooms to their one-way imports; these check what it
cannot see: who calls the format detectors, and how often a command opens its input.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest
from hf_models import make_checkpoint

import lmconvert.formats.checkpoint as checkpoint_module
from lmconvert.convert import to_canonical
from lmconvert.verify.run import verify

PACKAGE = Path(checkpoint_module.__file__).parents[1]
DETECTORS = {"is_canonical", "is_hf_safetensors", "is_hf_bin", "is_meta", "is_gguf", "gguf_file_of", "open_source"}
# the registry, and each format's own opener calling its own detector
ALLOWED = {"formats/checkpoint.py", "formats/gguf.py"}


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            names.add(fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else "")
    return names


def test_only_the_registry_asks_which_format_a_path_holds():
    offenders = {str(p.relative_to(PACKAGE)): sorted(_calls(p) & DETECTORS)
                 for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE)) not in ALLOWED}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.fixture
def counted_opens(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    original = checkpoint_module.open_source

    def counting(path: Path):  # noqa: ANN202 - the wrapped function's own type
        counts[Path(path).name] += 1
        return original(path)

    monkeypatch.setattr(checkpoint_module, "open_source", counting)
    return counts


def test_verify_opens_the_checkpoint_once(tmp_path: Path, counted_opens: collections.Counter):
    hf = make_checkpoint(tmp_path / "hf", "llama")
    to_canonical(hf, tmp_path / "canonical")
    counted_opens.clear()
    assert verify(tmp_path / "canonical", generate=2).passed
    # the canonical checkpoint once; its recorded source once, to learn how transformers loads it
    assert counted_opens == {"canonical": 1, "hf": 1}
    counted_opens.clear()
    assert verify(hf, generate=2).passed
    assert counted_opens == {"hf": 1}
