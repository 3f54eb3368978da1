"""HTML for ``compare``: verdict, the first divergence in words, the error chart, the tree.

The page only draws: the words, the metric and threshold text and the chart's points
come from :mod:`layertap.comparing.words`. Rows are read by field name with defaults,
so reports of either compare form (PyTorch vs ONNX, ONNX vs ONNX; with or without
``local_rel``, ``cosine``, ``sqnr_db``, ``worst_sample``) render the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..comparing.words import METRICS, band_text, chart_points, explanation, first_index, judged_at_format, metric_of, threshold_text
from ..text import field, fmt_db, fmt_float, fmt_shape, token_grid
from .html import cards, esc, grid_table, notes_list, section, verdict
from .svg import BAND_COLOR, FAIL_COLOR, LOCAL_COLOR, PASS_COLOR, TOL_COLOR, Axis, error_chart, error_chart_vertical
from .tree import Node, nest, render_tree

MAX_TREE_ROWS = 5000


def _status_class(row: Any, first: Any) -> str:
    if row is first:
        return "first"
    if field(row, "ok") is False:
        return "bad"
    return "dim" if field(row, "rel_err") is None else ""


def compare_fragment(report: Any) -> str:
    """The whole compare report as one HTML fragment.

    Example:
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> r = CompareReport([CompareRow("a", "a", 0, "Conv2d", [1, 4], 1e-7, 1e-7, "pass", True),
        ...                    CompareRow("b", "b", 0, "ReLU", [1, 4], 0.1, 0.2, "FAIL", False)])
        >>> html = compare_fragment(r)
        >>> "first divergence: b" in html and "explanation" in html
        True
    """
    rows = list(report.rows)
    fi = first_index(rows)
    first = rows[fi] if fi is not None else None
    parts = [_verdict(report, first), _cards(report, rows), notes_list(getattr(report, "notes", []))]
    parts.append(section("what happened", explain(report), anchor="explanation"))
    parts.append(section("error per module", _chart(report, rows), anchor="chart"))
    counts = getattr(report, "first_divergence_counts", None)
    if counts:
        parts.append(section("first divergence over samples", _counts_table(counts), anchor="samples"))
    columns, grid = token_grid(rows)
    if grid:
        parts.append(section("error by layer and token", _token_table(columns, grid), anchor="tokens"))
    metric = metric_of(report)
    parts.append(section("module tree", _tree(rows, first, metric), anchor="tree"))
    parts.append(section("every row, in order", _flat(rows, first, metric), anchor="rows"))
    return "".join(parts)


def _token_table(columns: Sequence[str], grid: Sequence[tuple[str, Sequence[tuple[Any, Any]]]]) -> str:
    """Decode steps: rel err per module (rows) and token position (columns), failing cells in red."""
    body = [[esc(name)] + [f'<span class="{"bad" if ok is False else "ok" if ok else "dim"}">{esc(fmt_float(v))}</span>'
                           for v, ok in values] for name, values in grid]
    note = '<p class="muted">rel err of each decoder layer and the model output at each token position; the prompt is one column</p>'
    return note + grid_table(["module", *columns], body, numeric=list(range(1, len(columns) + 1)))


def _verdict(report: Any, first: Any) -> str:
    if first is None:
        return verdict(True, "every compared module agrees within the tolerance")
    return verdict(False, f"first divergence: {field(first, 'name')} ({field(first, 'type', '?')})")


def _cards(report: Any, rows: Sequence[Any]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[field(r, "status", "?")] = counts.get(field(r, "status", "?"), 0) + 1
    order = ("pass", "FAIL", "absorbed", "no counterpart")
    items: list[tuple[str, Any]] = [(status, counts[status]) for status in order if status in counts]
    items += [(status, n) for status, n in counts.items() if status not in order]
    items += [("rtol", f"{getattr(report, 'rtol', float('nan')):g}"), ("atol", f"{getattr(report, 'atol', float('nan')):g}")]
    precision = getattr(report, "precision", "float32")
    if precision != "float32":
        items.append(("judged at" if getattr(report, "judged_at_format", False) else "candidate at", precision))
    if metric_of(report) != "rel":
        items.append(("metric", metric_of(report)))
    # the candidate's runtime names its runs (OpenVINO runs are not ONNX Runtime's)
    runtime = (getattr(report, "runtimes", None) or {}).get("candidate", {}).get("runtime", "ONNX Runtime")
    runs = "ORT runs" if runtime == "ONNX Runtime" else f"{runtime} runs"
    for attr, label in (("samples", "samples"), ("ort_runs", runs)):
        value = getattr(report, attr, None)
        if value is not None and not callable(value) and value != 1:
            items.append((label, value if not isinstance(value, (list, tuple)) else len(value)))
    return cards(items, css={"FAIL": "bad", "pass": "ok"})


def explain(report: Any) -> str:
    """The first divergence in words (:func:`layertap.comparing.words.explanation`), as HTML.

    Example:
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> r = CompareReport([CompareRow("a", "a", 0, "Conv2d", [1, 4], 1e-7, 1e-7, "pass", True),
        ...                    CompareRow("b", "b", 0, "ReLU", [1, 4], 0.1, 0.2, "FAIL", False)])
        >>> "first part at b (ReLU, output 1x4)" in explain(r)
        True
    """
    return '<div class="explain">' + "".join(f"<p>{esc(x)}</p>" for x in explanation(report)) + "</div>"


def _axis(report: Any, metric: str) -> Axis:
    """The error axis in the metric's own units: cosine ticks read 0.999, SQNR ticks 30 dB."""
    if judged_at_format(report, metric):
        return Axis(f"max|cand - ideal {report.precision}| / max|ref| (log)", None, None)
    if metric == "cosine":
        return Axis("cosine similarity (log of 1 - cos)", _cosine_tick, threshold_text(report, metric))
    if metric == "sqnr":
        return Axis("SQNR (dB)", lambda e: f"{-10 * e} dB", threshold_text(report, metric))
    return Axis("max|cand - ref| / max|ref| (log)", None, threshold_text(report, metric))


def _cosine_tick(e: int) -> str:
    """The cosine similarity at ``1 - cosine = 10**e``."""
    if e >= 0:
        return f"{1 - 10 ** e:g}"
    return f"{1 - 10.0 ** e:.{-e}f}" if e >= -5 else f"1-1e{e}"


def _chart(report: Any, rows: Sequence[Any]) -> str:
    """The error chart in the deciding metric; with local errors and another metric, a
    second chart of relative error, accumulated beside local."""
    metric = metric_of(report)
    out = _one_chart(report, rows, metric, with_local=metric == "rel")
    if metric != "rel" and _has_local(rows):
        out += "<h3>relative error: accumulated and local</h3>" + _one_chart(report, rows, "rel", with_local=True)
    return out


def _one_chart(report: Any, rows: Sequence[Any], metric: str, *, with_local: bool) -> str:
    """A wide chart, and for phones the same points down the page (CSS shows one of them)."""
    compared, points, threshold = chart_points(report, metric, with_local=with_local)
    if not compared:
        return '<p class="muted">nothing was compared, so there is no chart</p>'
    first = next((i for i, r in enumerate(compared) if field(r, "ok") is False), None)
    axis = _axis(report, metric)
    wide = error_chart(points, tolerance=threshold, first=first, axis=axis)
    tall = error_chart_vertical(points, tolerance=threshold, first=first, axis=axis)
    legend = [f'<span><i style="background:{PASS_COLOR}"></i>pass (accumulated error)</span>',
              f'<span><i style="background:{FAIL_COLOR}"></i>FAIL</span>',
              f'<span><i style="background:{TOL_COLOR}"></i>{esc(threshold_text(report, metric))}</span>']
    if judged_at_format(report, metric):
        legend = [f'<span><i style="background:{PASS_COLOR}"></i>pass (what the candidate adds: its error against an '
                  f'ideal {esc(report.precision)} run)</span>',
                  f'<span><i style="background:{FAIL_COLOR}"></i>FAIL</span>',
                  f'<span><i style="background:{BAND_COLOR}"></i>{esc(band_text(report))}</span>']
    if any(p.local is not None for p in points):
        swatch = f'<i style="background:#fff;border:2px solid {LOCAL_COLOR}"></i>'
        legend.append(f"<span>{swatch}local error (fed the reference's inputs)</span>")
    hidden = len(rows) - len(compared)
    note = (f'<p class="muted">{len(compared)} compared calls in execution order, log scale; {hidden} calls without a '
            "value (absorbed or without counterpart) are left out. Hover a point for its module.</p>")
    return (f'<div class="legend">{"".join(legend)}</div><div class="chart scroll chart-wide">{wide}</div>'
            f'<div class="chart chart-tall">{tall}</div>{note}')


def _counts_table(counts: dict[str, int]) -> str:
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    return grid_table(["module", "samples where it diverged first"], [[esc(k), esc(v)] for k, v in ordered], numeric=[1])


def _has_local(rows: Sequence[Any]) -> bool:
    return any(field(r, "local_rel") is not None for r in rows)


def _has_format(rows: Sequence[Any]) -> bool:
    return any(field(r, "format_rel") is not None for r in rows)


def _cells(row: Any, local: bool, metric: str = "rel", fmt: bool = False) -> list[str]:
    """type, shape, [deciding statistic], rel err, [format rel, impl rel], [local], status: the deciding
    statistic's column when cosine or SQNR decides, the format's two errors where an ideal run gave them,
    the local column only where some row carries local_rel."""
    cells = [esc(field(row, "type", "")), esc(fmt_shape(field(row, "shape")))]
    if metric in ("cosine", "sqnr"):
        value = field(row, METRICS[metric][0])
        cells.append("-" if value is None else esc(f"{value:.6f}" if metric == "cosine" else fmt_db(value)))
    cells.append(esc(fmt_float(field(row, "rel_err"))))
    if fmt:
        cells += [esc(fmt_float(field(row, key))) for key in ("format_rel", "impl_rel")]
    if local:
        keys = ("local_rel", "local_format_rel", "local_impl_rel") if fmt else ("local_rel",)
        cells += [esc(fmt_float(field(row, key))) if field(row, key) is not None else "" for key in keys]
    return cells + [esc(field(row, "status", ""))]


def _headers(local: bool, metric: str = "rel", fmt: bool = False) -> list[str]:
    deciding = [METRICS[metric][2]] if metric in ("cosine", "sqnr") else []
    locals_ = (["local err", "local format", "local impl"] if fmt else ["local err"]) if local else []
    return ["type", "shape", *deciding, "rel err"] + (["format rel", "impl rel"] if fmt else []) + locals_ + ["status"]


def _tree(rows: Sequence[Any], first: Any, metric: str = "rel") -> str:
    shown = rows[:MAX_TREE_ROWS]
    local, fmt = _has_local(rows), _has_format(rows)
    nodes = [Node(field(r, "path", "") or "", esc(field(r, "name", "?")), _cells(r, local, metric, fmt),
                  _status_class(r, first)) for r in shown]
    cut = f"first {MAX_TREE_ROWS} of {len(rows)} rows shown" if len(rows) > MAX_TREE_ROWS else ""
    widths = ((11, 8) + ((6.5,) if metric in ("cosine", "sqnr") else ()) + (5.5,) + ((5.5, 5.5) if fmt else ())
              + (((5.5, 5.5, 5.5) if fmt else (5.5,)) if local else ()) + (6.5,))
    return render_tree(["module", *_headers(local, metric, fmt)], nest(nodes), widths=widths, keep=len(widths) - 1,
                       note=cut)


def _flat(rows: Sequence[Any], first: Any, metric: str = "rel") -> str:
    local, fmt = _has_local(rows), _has_format(rows)
    body = [[esc(field(r, "name")), *_cells(r, local, metric, fmt), esc(fmt_float(field(r, "max_abs"))),
             esc("; ".join(t for t in (field(r, "limit"), field(r, "weights"), field(r, "note")) if t))] for r in rows]
    classes = [_status_class(r, first) for r in rows]
    headers = ["module", *_headers(local, metric, fmt), "max abs", "note"]
    numeric = [i for i, h in enumerate(headers)
               if h in ("cosine", "SQNR dB", "rel err", "format rel", "impl rel", "local err", "local format", "local impl",
                        "max abs")]
    table = grid_table(headers, body, numeric=numeric, row_classes=classes)
    return f"<details><summary>show all {len(rows)} rows</summary>{table}</details>"
