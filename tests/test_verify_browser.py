"""Issue #29: `verify --html`'s page in a real browser. Headless Chromium loads the file from disk,
with every network request sent to a dead proxy, and its screenshot must show the plot: the page is
not blank, and the plot's line colours (which the page's style sheet never uses) cover a region as
wide as a plot. The same page with its plot cut out shows none of them, so the check can fail.
`make browser-check` installs Chromium where it is absent; without one these tests skip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from bad_input import lmconvert
from hf_models import edited_weights, make_checkpoint

from lmconvert.verify.html import COLORS, STYLE

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1280, 1400


@pytest.fixture(scope="module")
def browser() -> str:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (`make browser-check` installs Debian's package)")
    return CHROMIUM


def screenshot(browser: str, page: Path, out: Path) -> Path:
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--proxy-server=127.0.0.1:9", "--no-first-run", f"--user-data-dir={out.parent / 'profile'}",
                           f"--screenshot={out}", f"--window-size={WIDTH},{HEIGHT}", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
    return out


def pixels_of(png: Path, color: str, tolerance: int = 48) -> list[tuple[int, int]]:
    """(x, y) of every pixel within `tolerance` (summed over R, G, B) of `color`."""
    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(png).convert("RGB"), dtype=np.int32)
    assert image.shape == (HEIGHT, WIDTH, 3)
    target = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int32)
    ys, xs = np.nonzero(np.abs(image - target).sum(-1) <= tolerance)
    return list(zip(xs.tolist(), ys.tolist(), strict=True))


def assert_not_blank(png: Path) -> None:
    from PIL import Image

    image = Image.open(png).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20)
    white = sum(n for n, c in colors if c == (255, 255, 255))
    assert len(colors) > 50 and white < 0.95 * WIDTH * HEIGHT, (len(colors), white)


def assert_drawn(png: Path, color: str, least: int) -> None:
    """At least `least` pixels of `color`, spread as a plotted line is: across most of a plot's width."""
    found = pixels_of(png, color)
    assert len(found) >= least, (color, len(found))
    xs = [x for x, _ in found]
    assert max(xs) - min(xs) > 0.5 * WIDTH, (color, min(xs), max(xs))


def without_plot(page: Path, out: Path) -> Path:
    text = page.read_text(encoding="utf-8")
    cut = re.sub(r"<svg.*?</svg>", "", text, flags=re.S)
    assert cut != text
    out.write_text(cut, encoding="utf-8")
    return out


def test_the_style_sheet_uses_none_of_the_plot_colours() -> None:
    """What makes counting those pixels a test of the plot."""
    assert not any(color.lower() in STYLE.lower() for color in COLORS.values())


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A passing fp32 page, a failing one (layer 1's k heads swapped) and a passing bf16 one."""
    import torch

    def swap(tensors: dict) -> None:
        w = tensors["model.layers.1.self_attn.k_proj.weight"]
        tensors["model.layers.1.self_attn.k_proj.weight"] = torch.cat((w[16:32], w[:16], w[32:]))

    root = tmp_path_factory.mktemp("pages")
    good = make_checkpoint(root / "good")
    broken = edited_weights(good, root / "broken", swap)
    out = {}
    for name, args, code in (("pass", (good,), 0), ("fail", (broken, "--reference", good), 1),
                             ("bf16", (good, "--dtype", "bfloat16"), 0)):
        out[name] = root / f"{name}.html"
        proc = lmconvert("verify", *args, "--seq-len", 16, "--generate", 6, "--html", out[name])
        assert proc.returncode == code, proc.stderr
    return out


def test_a_failing_report_draws_its_plot(browser: str, pages: dict[str, Path], tmp_path: Path) -> None:
    png = screenshot(browser, pages["fail"], tmp_path / "fail.png")
    assert_not_blank(png)
    assert_drawn(png, COLORS["max"], 400)
    assert_drawn(png, COLORS["mean"], 400)
    # the first failure: a vertical red line through the plot (and its label)
    red = pixels_of(png, COLORS["failure"])
    assert len(red) >= 150
    column = max({x for x, _ in red}, key=lambda x: sum(1 for p in red if p[0] == x))
    assert sum(1 for x, _ in red if x == column) >= 150  # one column of red as tall as most of the plot
    if os.environ.get("LMCONVERT_SCREENSHOT"):  # where to keep one (docs/img/verify-report.png)
        shutil.copy(png, os.environ["LMCONVERT_SCREENSHOT"])


def test_a_passing_report_draws_its_zero_floor(browser: str, pages: dict[str, Path], tmp_path: Path) -> None:
    """fp32 agrees exactly: both lines lie on the floor marked 0, across the plot; nothing red."""
    png = screenshot(browser, pages["pass"], tmp_path / "pass.png")
    assert_not_blank(png)
    assert_drawn(png, COLORS["max"], 150)  # max's circles show around mean's squares on the same floor
    assert_drawn(png, COLORS["mean"], 150)
    assert_drawn(png, COLORS["limit"], 100)
    assert pixels_of(png, COLORS["failure"]) == []


def test_low_precision_draws_transformers_own_error(browser: str, pages: dict[str, Path], tmp_path: Path) -> None:
    png = screenshot(browser, pages["bf16"], tmp_path / "bf16.png")
    assert_not_blank(png)
    for key in ("max", "mean", "ref_max", "ref_mean"):
        assert_drawn(png, COLORS[key], 100)


def test_the_check_fails_without_the_plot(browser: str, pages: dict[str, Path], tmp_path: Path) -> None:
    png = screenshot(browser, without_plot(pages["fail"], tmp_path / "cut.html"), tmp_path / "cut.png")
    assert_not_blank(png)  # the tables are still there
    for key in ("max", "mean"):
        assert len(pixels_of(png, COLORS[key])) < 20
        with pytest.raises(AssertionError):
            assert_drawn(png, COLORS[key], 400)
