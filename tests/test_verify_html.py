"""Issue #29: `verify --html FILE` writes the report as one self-contained page (no URL to load), built
from the same data as --json: the verdict and criterion, the error profile plotted, the logits'
agreement, both greedy generations with the first difference marked, every layer's row and the
environment; written atomically, and never over or inside an input. (tests/test_verify_browser.py
loads the page in a real browser.)"""

from __future__ import annotations

import html
import json
import re
import resource
import signal
from pathlib import Path

import pytest
from bad_input import Result, assert_clean_failure, lmconvert, lmconvert_process
from hf_models import edited_weights, make_checkpoint

from lmconvert.verify.html import COLORS, GENERATOR, render

RUN = ("--seq-len", 16, "--generate", 6)


def swap_kv_heads(tensors: dict) -> None:
    """Layer 1's two KV heads of k trade places: parity breaks first at layers.1.attn.k."""
    import torch

    w = tensors["model.layers.1.self_attn.k_proj.weight"]
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.cat((w[16:32], w[:16], w[32:]))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("good") / "hf")


@pytest.fixture(scope="module")
def broken(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return edited_weights(good, tmp_path_factory.mktemp("broken") / "hf", swap_kv_heads)


def written(tmp_path: Path, *args: object, code: int) -> tuple[str, dict, Result]:
    """(page, JSON report, result) of one verify run writing both."""
    page, report = tmp_path / "report.html", tmp_path / "report.json"
    proc = lmconvert("verify", *args, *RUN, "--html", page, "--json", report)
    assert proc.returncode == code, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]  # no temporaries left
    return page.read_text(encoding="utf-8"), json.loads(report.read_text()), proc


def external_urls(page: str) -> list[str]:
    """Whatever a browser would fetch: src/href/xlink:href/action/srcset, CSS url() and @import, that is not
    a fragment (#id) or inline data."""
    found = re.findall(r"""(?:src|href|action|srcset|poster)\s*=\s*["']?\s*([^"'\s>]+)""", page, flags=re.I)
    found += re.findall(r"""url\(\s*["']?([^"')]+)""", page, flags=re.I)
    found += re.findall(r"@import\s+[^;]+", page, flags=re.I)
    return [u for u in found if not u.startswith(("#", "data:"))]


def first_diff_cells(page: str) -> list[str]:
    return re.findall(r'<td class="first-diff">([^<]*)</td>', page)


def assert_common(page: str, report: dict) -> None:
    assert page.startswith("<!DOCTYPE html>") and GENERATOR in page
    assert external_urls(page) == [], external_urls(page)
    assert "<script" not in page.lower()  # nothing runs either
    assert re.search(r'id="verdict">(PASS|FAIL)<', page).group(1) == report["verdict"]
    assert html.escape(report["criterion"]) in page
    # the plot: inline SVG with the lines drawn in their colours
    svg = page[page.index('<div class="plot"'):]
    assert "<svg" in svg and COLORS["max"] in svg and COLORS["mean"] in svg
    # every layer's row, in order
    rows = re.findall(r'<tr[^>]* data-layer="([^"]+)"', page)
    assert rows == [row["layer"] for row in report["layers"]]
    assert rows[0] == "embed" and rows[-1] == "final_norm" and {"0", "1"} <= set(rows)
    # every point's row too, with its figure as the JSON has it
    for point in report["points"]:
        assert f"<td>{point['name']}</td><td>{point['max_abs']:.3e}</td>" in page, point["name"]
    # the generations side by side, token for token
    gen = report["generation"]
    for side, tokens in (("ours", gen["ours"]), ("transformers", gen["reference"])):
        cells = re.search(rf"<tr><th>{side}</th>(.*?)</tr>", page).group(1)
        assert re.findall(r"<td[^>]*>(\d+)</td>", cells) == [str(t) for t in tokens]
    # the environment
    env = page[page.index("<h2>Environment</h2>"):]
    for key in ("torch", "transformers"):
        assert f"<th>{key}</th><td>{report['versions'][key]}</td>" in env
    assert f"<th>dtype</th><td>{report['dtype']}</td>" in env and f"<th>device</th><td>{report['device']}</td>" in env
    assert "<th>tensor-parallel ranks</th><td>1 (not split)</td>" in env
    assert f"{report['batch']} x {report['seq_len']}" in env


@pytest.mark.slow
def test_a_passing_report(good: Path, tmp_path: Path) -> None:
    page, report, _ = written(tmp_path, good, code=0)
    assert report["passed"] and report["max_abs"] == 0.0  # fp32 agrees exactly: every |Δ| is drawn on the floor
    assert_common(page, report)
    assert 'id="zero-floor"' in page and "first failure: none" in page
    assert first_diff_cells(page) == [] and 'class="first"' not in page and 'class="failed"' not in page
    assert COLORS["failure"] not in page  # no first failure to mark
    # the same report where one point could not be compared (its figures null, as JSON has them): listed with
    # its reason, named the first failure, and marked in the plot
    point = report["points"][3]
    point |= {"max_abs": None, "mean_abs": None, "scale": None, "limit": None, "passed": False, "ratio": None,
              "problem": "our output has shape (2, 16, 64), the reference's (2, 16, 32)"}
    report |= {"passed": False, "verdict": "FAIL", "first_failure": point, "tensor_parallel": 2}
    page = render(report)
    assert "<th>tensor-parallel ranks</th><td>2</td>" in page
    assert re.search(r'id="verdict">FAIL<', page) and external_urls(page) == []
    assert f"{point['name']} — not compared: our output has shape (2, 16, 64)" in page
    assert f"({point['name']}): not compared: our output has shape" in page  # the first failure
    assert COLORS["failure"] in page[page.index('<div class="plot"'):]


@pytest.mark.slow
def test_a_failing_report_marks_the_first_failure_and_difference(broken: Path, good: Path, tmp_path: Path) -> None:
    page, report, proc = written(tmp_path, broken, "--reference", good, code=1)
    assert "parity check failed" in proc.stderr  # the page is written before verify exits 1
    assert_common(page, report)
    failure = report["first_failure"]
    assert failure["name"] == "layers.1.attn.k"
    assert "first failure: layer 1, attn.k (layers.1.attn.k)" in page
    assert COLORS["failure"] in page[page.index('<div class="plot"'):]  # the red line at the first failure
    assert re.findall(r'<tr class="first" data-layer="([^"]+)"', page) == ["1"]
    gen = report["generation"]
    at = gen["first_difference"]
    assert at is not None and first_diff_cells(page) == [str(gen["ours"][at]), str(gen["reference"][at])]
    later = len(re.findall(r'<td class="after-diff">', page))
    assert later == 2 * (gen["new_tokens"] - at - 1)


@pytest.mark.slow
def test_low_precision_plots_both_sides_against_fp32(good: Path, tmp_path: Path) -> None:
    page, report, _ = written(tmp_path, good, "--dtype", "bfloat16", code=0)
    assert_common(page, report)
    svg = page[page.index('<div class="plot"'):page.index("</svg>")]
    assert COLORS["ref_max"] in svg and COLORS["ref_mean"] in svg  # transformers' own error vs fp32
    vs = report["vs_fp32"]
    table = page[page.index("Each side against transformers in fp32"):]
    assert f"<td>{vs['ours']['kl']:.3e}</td><td>{vs['reference']['kl']:.3e}</td>" in table
    assert f"{report['ours_error']:.3e}" in page and f"{report['reference_error']:.3e}" in page


@pytest.mark.parametrize("inside", ["report.html", "model.safetensors", "config.json"])
def test_refused_inside_or_over_an_input(good: Path, inside: str) -> None:
    target = good / inside
    before = target.read_bytes() if target.exists() else None
    assert_clean_failure(lmconvert("verify", good, *RUN, "--html", target, "--force"), f"--html {target}")
    assert (target.read_bytes() if target.exists() else None) == before


def test_refused_over_the_reference_and_beside_json(broken: Path, good: Path, tmp_path: Path) -> None:
    assert_clean_failure(lmconvert("verify", broken, "--reference", good, "--html", good / "x.html"),
                         f"--html {good / 'x.html'}")
    both = tmp_path / "both"
    assert_clean_failure(lmconvert("verify", good, "--json", both, "--html", both), "--html", "--json")
    assert not both.exists()


def test_an_existing_file_is_replaced_only_with_force_and_only_ours(good: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs.html"
    theirs.write_text("<!DOCTYPE html><p>a user's page</p>")
    assert_clean_failure(lmconvert("verify", good, "--html", theirs), f"--html {theirs}", "already exists", "--force")
    assert_clean_failure(lmconvert("verify", good, "--html", theirs, "--force"), "is not a file lmconvert wrote")
    assert theirs.read_text() == "<!DOCTYPE html><p>a user's page</p>"


@pytest.mark.slow
def test_force_replaces_a_page_verify_wrote(good: Path, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    page.write_text(f"<!DOCTYPE html>\n{GENERATOR}\nan earlier run")
    proc = lmconvert("verify", good, *RUN, "--html", page, "--force")
    assert proc.returncode == 0, proc.stderr
    assert "an earlier run" not in page.read_text() and 'id="verdict">PASS<' in page.read_text()


def limited(limit: int):  # noqa: ANN201 - a preexec_fn
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.slow
def test_a_full_disk_leaves_no_truncated_page(good: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    proc = lmconvert_process("verify", good, *RUN, "--html", page, preexec_fn=limited(16384))
    stdout, stderr = proc.communicate()
    assert_clean_failure(Result(proc.returncode, stdout, stderr), f"--html {page}", "File too large",
                         "nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_without_matplotlib_html_is_refused_before_the_run(good: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if not installed
    page = tmp_path / "r.html"
    assert_clean_failure(lmconvert("verify", good, "--html", page), "--html needs matplotlib", "lmconvert[html]",
                         out=page)
