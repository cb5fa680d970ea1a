"""`verify --html FILE`: the report as one self-contained page, for people: the verdict and its
criterion, the error profile over every point as a plot, the logits' agreement, both greedy
generations side by side, and the environment the run had.

Built from the report's dictionary (the same data as `--json`), so the page never shows a figure
the JSON lacks. Nothing is fetched when the page is viewed: the plot is inline SVG that matplotlib
draws (its text as paths, so no font is needed either), the style sheet is inline, and the page
holds no URL to load. matplotlib is imported only here, when a page is written (`lmconvert[html]`).

The plot's y axis is logarithmic, and |Δ| = 0 is common (fp32 agrees exactly in practice); a zero
is drawn on a floor a decade below the smallest nonzero figure, labelled "0", under a dotted line.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmconvert.formats.atomic import atomic_file
from lmconvert.formats.errors import InputError

from .report import SCHEMA

GENERATOR = f'<meta name="generator" content="{SCHEMA}">'  # what tells a page verify wrote

# the plot's colours; the page's style sheet uses none of them, so a screenshot's pixels of these are the plot's
COLORS = {"max": "#1f5fd6", "mean": "#f28e00", "ref_max": "#17a589", "ref_mean": "#8e44ad", "limit": "#a0522d",
          "failure": "#e0001b"}


def check_available() -> None:
    """Refuse --html before a run when matplotlib is missing (a run can take hours)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("--html needs matplotlib, which is not installed: pip install 'lmconvert[html]'") from None


def is_html_report(file: Path) -> bool:
    """Whether `file` is a page verify wrote (so --force may replace it)."""
    try:
        with open(file, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    return GENERATOR.encode() in head


def write_html(path: Path, report: dict[str, Any], force: bool) -> None:
    """The page, atomically: a full disk leaves no truncated page behind."""
    page = render(report)
    with atomic_file(path, force, is_html_report, f"--html {path}") as tmp:
        tmp.write_text(page, encoding="utf-8")


# ------------------------------------------------------------------------------------------ the page

def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: float | None, spec: str = ".3e") -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def table(head: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    out = [f'<table class="{cls}">' if cls else "<table>", "<thead><tr>"]
    out += [f"<th>{h}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cells = list(row)
        attrs = ""
        if cells and cells[0].startswith("\0"):  # a row's attributes travel in a first "\0attrs" cell
            attrs, cells = cells[0][1:], cells[1:]
        out.append(f"<tr{attrs}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def pairs(rows: Iterable[tuple[str, str]]) -> str:
    return "<table class=\"kv\"><tbody>" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + \
        "</tbody></table>"


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;color:#222;
background:#fff;line-height:1.4}
h1{font-size:1.5em;margin:0 0 8px}h2{font-size:1.15em;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{display:inline-block;padding:4px 14px;border-radius:4px;font-weight:bold;font-size:1.3em;color:#fff}
.verdict.pass{background:#2e7d32}.verdict.fail{background:#b71c1c}
.criterion{margin:8px 0;font-family:ui-monospace,monospace;font-size:.92em}
table{border-collapse:collapse;font-size:.9em;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}table.kv th{width:260px}
td.num{font-family:ui-monospace,monospace;text-align:right}
tr.failed td{background:#fde8e8}tr.first td{background:#f8c7c7;font-weight:bold}
.plot svg{width:100%;height:auto}
.tokens td{font-family:ui-monospace,monospace;text-align:center;min-width:2.5em}
td.first-diff{background:#f8c7c7;font-weight:bold;outline:2px solid #b71c1c}
td.after-diff{color:#999}
.note{color:#555}
"""


def render(report: dict[str, Any]) -> str:
    """The whole page for one report (`Report.to_dict()`)."""
    passed = bool(report["passed"])
    verdict = "PASS" if passed else "FAIL"
    title = f"lmconvert verify: {verdict} — {report['checkpoint']}"
    failure = report.get("first_failure")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', GENERATOR,
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>lmconvert verify — {esc(report['checkpoint'])}</h1>",
        f'<p><span class="verdict {"pass" if passed else "fail"}" id="verdict">{verdict}</span></p>',
        f'<p class="criterion">criterion: {esc(report["criterion"])}</p>',
        f"<p>first failure: {esc(describe(failure)) if failure else 'none'}</p>",
        *(f'<p class="note">note: {esc(n)}</p>' for n in report.get("notes") or []),
        "<h2>Error profile</h2>", profile_caption(report),
        f'<div class="plot" id="profile-plot">{profile_svg(report)}</div>',
        "<h2>Logits</h2>", logits_section(report),
        "<h2>Greedy generation</h2>", generation_section(report.get("generation")),
        "<h2>Per-layer profile</h2>", layers_section(report),
        "<details><summary>every point</summary>", points_section(report), "</details>",
        "<h2>Environment</h2>", environment_section(report),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def describe(point: dict[str, Any]) -> str:
    where = point["name"]
    if point["layer"] is not None:
        where = f"layer {point['layer']}, {point['sublayer']} ({where})"
    if point.get("problem"):
        return f"{where}: not compared: {point['problem']}"
    text = f"{where}: max |Δ| {fmt(point['max_abs'])}, mean |Δ| {fmt(point['mean_abs'])}"
    if point.get("reference_error") is None:
        return text + f" (limit max |Δ| {fmt(point['limit'], '.1e')})"
    return text + f" vs fp32; transformers' own mean {fmt(point['reference_error'])} (limit {fmt(point['limit'])})"


def exact(report: dict[str, Any]) -> bool:
    return report["tolerances"].get("faithfulness") is None


def profile_caption(report: dict[str, Any]) -> str:
    if exact(report):
        text = ("Every point of our forward pass in order (sublayers within each layer), |ours − transformers| in "
                f"{esc(report['dtype'])}; the limit is each point's max |Δ| bar.")
    else:
        text = (f"Every point of our forward pass in order, each side in {esc(report['dtype'])} against transformers "
                "in fp32 (faithfulness): ours and transformers' own error; the limit is the largest mean error "
                "allowed for ours.")
    return f"<p>{text} A zero is drawn on the floor marked “0”.</p>"


def profile_svg(report: dict[str, Any]) -> str:
    """The plot as an inline <svg> element (matplotlib, no pyplot state)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    points = report["points"]
    fig = Figure(figsize=(11.5, 4.6), dpi=100)
    ax = fig.add_subplot()
    if not points:
        ax.text(0.5, 0.5, "no points could be compared; only the logits were", ha="center", va="center")
        ax.set_axis_off()
        return svg_of(fig)
    low = not exact(report)
    series: dict[str, list[float | None]] = {
        "max": [p["max_abs"] for p in points], "mean": [p["mean_abs"] for p in points],
        "limit": [p["limit"] for p in points]}
    labels = {"max": "max |Δ| (ours" + (" vs fp32)" if low else " vs transformers)"),
              "mean": "mean |Δ| (ours" + (" vs fp32)" if low else " vs transformers)"),
              "limit": "limit (mean, ours)" if low else "limit (max |Δ|)"}
    if low:
        series["ref_max"] = [p.get("reference_max") for p in points]
        series["ref_mean"] = [p.get("reference_error") for p in points]
        labels |= {"ref_max": "max |Δ| (transformers vs fp32)", "ref_mean": "mean |Δ| (transformers vs fp32)"}
    values = [v for s in series.values() for v in s if v is not None and math.isfinite(v)]
    positive = [v for v in values if v > 0]
    top = max(positive) if positive else 1.0
    floor = 10.0 ** (math.floor(math.log10(min(positive))) - 1) if positive else top * 1e-3
    ax.set_yscale("log")
    x = list(range(len(points)))
    dense = len(points) > 150
    # (line, marker, marker size, line width, z): where the lines coincide (max = mean = 0; in low precision ours =
    # transformers', common) each stays visible: max's larger circles under mean's squares, transformers' dashes on top
    styles = {"max": ("-", "o", 6.0, 2.6, 3), "mean": ("-", "s", 3.5, 1.8, 4), "ref_max": ("--", None, 0, 1.6, 5),
              "ref_mean": ("--", None, 0, 1.6, 5), "limit": (":", None, 0, 1.3, 2)}
    for key, ys in series.items():
        drawn = [floor if v is not None and v == 0 else (math.nan if v is None else v) for v in ys]
        line, marker, size, width, z = styles[key]
        if dense:  # hundreds of points: a mark each would cover the lines
            marker, width = None, width * 0.7
        ax.plot(x, drawn, line, marker=marker, markersize=size, color=COLORS[key], label=labels[key],
                linewidth=width, zorder=z)
    ax.axhline(floor * 10 ** 0.5, color="#bbbbbb", linestyle=(0, (1, 3)), linewidth=1, zorder=1, gid="zero-floor")
    # layers: each labelled under the first of its points
    starts: list[tuple[int, str]] = []
    for i, p in enumerate(points):
        label = p["name"] if p["layer"] is None else str(p["layer"])
        if not starts or starts[-1][1] != label:
            starts.append((i, label))
    step = max(1, math.ceil(len(starts) / 40))
    for i, _ in starts[step::step]:  # a light line where each (labelled) layer begins
        ax.axvline(i - 0.5, color="#e3e3e3", linewidth=0.8, zorder=0)
    ax.xaxis.set_major_locator(FixedLocator([i for i, _ in starts[::step]]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: dict(starts).get(int(v), "")))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=90 if len(starts) > 20 else 0, labelsize=8)
    ax.set_xlabel("layer (each mark one point: sublayers in compute order)")
    ax.set_ylabel("|Δ| (log scale)")
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_ylim(floor / 3, top * 3)
    decades = range(math.floor(math.log10(floor)), math.ceil(math.log10(top * 3)) + 1)
    ticks = [10.0 ** d for d in decades]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: "0" if math.isclose(v, floor) else f"1e{round(math.log10(v))}"))
    # points that could not be compared: no figure, a mark at the top
    for i, p in enumerate(points):
        if p.get("problem"):
            ax.plot([i], [top * 2], marker="x", color=COLORS["failure"], markersize=8, zorder=4)
    failure = report.get("first_failure")
    if failure is not None:
        at = next(i for i, p in enumerate(points) if p["name"] == failure["name"])
        ax.axvline(at, color=COLORS["failure"], linewidth=1.6, zorder=4)
        left = at < len(points) * 0.7
        ax.annotate(f"first failure: {failure['name']}", xy=(at, top * 2), xytext=(6 if left else -6, -2),
                    textcoords="offset points", color=COLORS["failure"], fontsize=9, va="top",
                    ha="left" if left else "right")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), fontsize=8, ncol=5 if low else 3, frameon=False)
    ax.grid(axis="y", color="#eeeeee", linewidth=0.6, zorder=0)
    fig.tight_layout()
    return svg_of(fig)


def svg_of(fig: Any) -> str:  # noqa: ANN401 - a matplotlib Figure
    """The figure as an <svg> element to inline: no XML prolog, DOCTYPE or metadata block (whose RDF
    names licence URLs); the namespace declarations stay (names, never fetched)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "lmconvert"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)


def logits_section(report: dict[str, Any]) -> str:
    rows = [("max |Δlogit|", fmt(report["max_abs"])), ("mean |Δlogit|", fmt(report["mean_abs"])),
            ("KL(transformers ‖ ours)", fmt(report["kl"])),
            ("top-1 agreement", pct(report["top1"])), ("top-5 agreement", pct(report["top5"]))]
    if report.get("ours_error") is not None:
        rows += [("ours vs fp32 reference (mean |Δ|)", fmt(report["ours_error"])),
                 ("transformers vs fp32 reference (mean |Δ|)", fmt(report["reference_error"])),
                 ("ratio (limit " + fmt(report["tolerances"].get("faithfulness"), "g") + ")",
                  fmt(report["ratio"], ".3f"))]
    rows.append(("logits", "pass" if report["logits_passed"] else "<b>FAIL</b>"))
    out = pairs(rows)
    vs = report.get("vs_fp32")
    if vs:
        keys = (("max_abs", "max |Δlogit|", fmt), ("mean_abs", "mean |Δlogit|", fmt), ("kl", "KL(fp32 ‖ side)", fmt),
                ("top1", "top-1 agreement", pct), ("top5", "top-5 agreement", pct))
        out += "<p>Each side against transformers in fp32:</p>" + table(
            ["", "ours", "transformers"],
            ([esc(name), f(vs["ours"][k]), f(vs["reference"][k])]
             for k, name, f in keys))
    return out


def generation_section(gen: dict[str, Any] | None) -> str:
    if gen is None:
        return "<p>not run (--generate 0).</p>"
    first = gen["first_difference"]
    if first is None:
        summary = f"{gen['new_tokens']} greedy tokens identical"
    else:
        summary = (f"first difference at generated token {first} (position {gen['prompt_tokens'] + first}): "
                   f"ours {gen['ours'][first] if first < len(gen['ours']) else '—'}, "
                   f"transformers {gen['reference'][first] if first < len(gen['reference']) else '—'}")
        if gen["tie"]:
            summary += " — a tie in the reference's own logits"
    judged = {None: " (reported, not judged in low precision)", True: " — pass", False: " — FAIL"}[gen["passed"]]
    steps = f"decoding steps max |Δlogit| {fmt(gen['step_max_abs'], '.1e')}"
    if gen.get("step_limit") is not None:
        steps += f" (limit {fmt(gen['step_limit'], '.1e')})"
    n = max(len(gen["ours"]), len(gen["reference"]))

    def cells(tokens: list[int]) -> list[str]:
        out = []
        for i in range(n):
            cls = "first-diff" if i == first else ("after-diff" if first is not None and i > first else "")
            text = esc(tokens[i]) if i < len(tokens) else ""
            out.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        return out

    head = "<tr><th>token</th>" + "".join(f"<th>{i}</th>" for i in range(n)) + "</tr>"
    rows = [f"<tr><th>ours</th>{''.join(cells(gen['ours']))}</tr>",
            f"<tr><th>transformers</th>{''.join(cells(gen['reference']))}</tr>"]
    return (f"<p id=\"generation-summary\">{esc(summary)}{esc(judged)}; {esc(steps)}. Token ids generated after a "
            f"{gen['prompt_tokens']}-token prompt (row 0); the first differing token is outlined.</p>"
            f'<table class="tokens" id="generations"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')


def point_cell(points: dict[str, dict[str, Any]], name: str | None, low: bool) -> str:
    if name is None:
        return ""
    p = points[name]
    if p.get("problem"):
        return f"{esc(p['sublayer'])}: not compared"
    if low:
        return f"{esc(p['sublayer'])}: {fmt(p['ratio'], '.2f')}×"
    return f"{esc(p['sublayer'])}: {fmt(p['max_abs'], '.1e')}"


def layers_section(report: dict[str, Any]) -> str:
    low = not exact(report)
    points = {p["name"]: p for p in report["points"]}
    failure = report.get("first_failure")
    if not report["layers"]:
        return "<p>no points could be compared.</p>"
    rows = []
    for row in report["layers"]:
        out = points[row["output"]] if row["output"] else None
        first = failure is not None and row["layer"] in (str(failure["layer"]), failure["name"])
        cls = ' class="first"' if first else (' class="failed"' if row["failed"] else "")
        mark = f"FAIL at {esc(row['failed'])}" + (" ← first" if first else "") if row["failed"] else "pass"
        rows.append([f'\0{cls} data-layer="{esc(row["layer"])}"', esc(row["layer"]),
                     point_cell(points, row["attn"], low), point_cell(points, row["mlp"], low),
                     point_cell(points, row["output"], low),
                     fmt(out["mean_abs"], ".1e") if out and out.get("mean_abs") is not None else "", mark])
    what = "worst ratio (our mean error / transformers' own, vs fp32)" if low else "worst max |Δ|"
    return f"<p>Per group, the {what}.</p>" + table(
        ["layer", "attention", "MLP", "output", "output mean |Δ|", ""], rows, "layers")


def points_section(report: dict[str, Any]) -> str:
    low = not exact(report)
    first = (report.get("first_failure") or {}).get("name")
    head = ["point", "max |Δ|", "mean |Δ|", "limit", "max |ref|"]
    if low:
        head += ["transformers' mean", "transformers' max", "ratio"]
    rows = []
    for p in report["points"]:
        cls = ' class="first"' if p["name"] == first else (' class="failed"' if not p["passed"] else "")
        cells = [f"\0{cls}", esc(p["name"]), fmt(p["max_abs"]), fmt(p["mean_abs"]), fmt(p["limit"]), fmt(p["scale"])]
        if low:
            cells += [fmt(p.get("reference_error")), fmt(p.get("reference_max")), fmt(p["ratio"], ".2f")]
        if p.get("problem"):
            cells[1] += f" — not compared: {esc(p['problem'])}"
        rows.append(cells)
    return table(head, rows, "points")


def environment_section(report: dict[str, Any]) -> str:
    if report.get("golden"):
        against = f"golden file {report['golden']}"
    else:
        against = f"{report['reference']} (transformers, eager)"
    rows = [("checkpoint", esc(report["checkpoint"])), ("reference", esc(against)),
            ("dtype", esc(report["dtype"])), ("device", esc(report["device"])),
            ("tensor-parallel ranks", esc(report.get("tensor_parallel") or "1 (not split)")),
            ("tokens", esc(f"{report['batch']} x {report['seq_len']}, {report['tokens']}")),
            ("streamed block by block", "yes" if report["streamed"] else "no"),
            ("max memory", esc(report["max_memory"]) if report.get("max_memory") else "—")]
    versions = dict(report.get("versions") or {})
    recorded = versions.pop("reference", None)
    rows += [(f"{name}", esc(v) if v else "not installed") for name, v in versions.items()]
    if isinstance(recorded, dict):
        rows += [(f"{name} (golden file's recording)", esc(v) if v else "—") for name, v in recorded.items()]
    rows.append(("report schema", esc(report["schema"])))
    return pairs(rows)
