"""HTML for ``compare``: verdict, the first divergence in words, the error chart, the tree.

Rows are read by field name with defaults, so reports of either compare form
(PyTorch vs ONNX, ONNX vs ONNX; with or without ``local_rel``, ``cosine``,
``sqnr_db``, ``worst_sample``) render the same way.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..text import fmt_db, fmt_float, fmt_shape, token_grid
from .html import cards, esc, field, grid_table, notes_list, section, verdict
from .svg import FAIL_COLOR, LOCAL_COLOR, PASS_COLOR, TOL_COLOR, Axis, ErrorPoint, error_chart, error_chart_vertical
from .tree import Node, nest, render_tree

MAX_TREE_ROWS = 5000


def _first_index(rows: Sequence[Any]) -> int | None:
    return next((i for i, r in enumerate(rows) if field(r, "ok") is False), None)


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
    fi = _first_index(rows)
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
    metric = _metric(report)
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
    if _metric(report) != "rel":
        items.append(("metric", _metric(report)))
    # the candidate's runtime names its runs (OpenVINO runs are not ONNX Runtime's)
    runtime = (getattr(report, "runtimes", None) or {}).get("candidate", {}).get("runtime", "ONNX Runtime")
    runs = "ORT runs" if runtime == "ONNX Runtime" else f"{runtime} runs"
    for attr, label in (("samples", "samples"), ("ort_runs", runs)):
        value = getattr(report, attr, None)
        if value is not None and not callable(value) and value != 1:
            items.append((label, value if not isinstance(value, (list, tuple)) else len(value)))
    return cards(items, css={"FAIL": "bad", "pass": "ok"})


def explain(report: Any) -> str:
    """The first divergence in words: where, how big, what before and after, local vs carried error.

    Example:
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> r = CompareReport([CompareRow("a", "a", 0, "Conv2d", [1, 4], 1e-7, 1e-7, "pass", True),
        ...                    CompareRow("b", "b", 0, "ReLU", [1, 4], 0.1, 0.2, "FAIL", False)])
        >>> "first part at b (ReLU, output 1x4)" in explain(r)
        True
    """
    rows = list(report.rows)
    fi = _first_index(rows)
    compared = [r for r in rows if field(r, "rel_err") is not None]
    if fi is None:
        worst = max(compared, key=lambda r: _num(field(r, "rel_err")), default=None)
        text = f"All {len(compared)} compared module calls agree within the tolerance."
        if worst is not None:
            text += (f" The largest relative error is {fmt_float(field(worst, 'rel_err'))} at "
                     f"{field(worst, 'name')} ({field(worst, 'type', '?')}).")
        return f'<div class="explain"><p>{esc(text)}</p></div>'
    first = rows[fi]
    p = [_where(report, first), _weights_words(rows[: fi + 1])]
    before = [r for r in rows[:fi] if field(r, "rel_err") is not None]
    if before:
        last = before[-1]
        p.append(f"Every one of the {len(before)} compared calls before it agrees; the last of them, "
                 f"{field(last, 'name')}, has a relative error of {fmt_float(field(last, 'rel_err'))}.")
    else:
        p.append("It is the first module compared: the inputs themselves may already differ.")
    gap = gap_words(rows, first)
    if gap:
        p.append(f"But {gap}.")
    fused = fused_words(rows, first)
    if fused:
        p.append(f"{fused}.")
    p.append(_local_words(first))
    p.append(_after(rows, fi))
    p.append(_nonfinite_words(report, first))
    counts = getattr(report, "first_divergence_counts", None)
    total = getattr(report, "samples", None) or sum((counts or {}).values())
    if counts and total > 1:  # over one sample the sentence says nothing new
        n = counts.get(field(first, "name"), 0)
        p.append(f"Over {total} samples it was the first to diverge in {n}.")
    worst = field(first, "worst_sample")
    if worst is not None:
        p.append(f"Its worst sample is number {worst}.")
    return '<div class="explain">' + "".join(f"<p>{esc(x)}</p>" for x in p if x) + "</div>"


def _where(report: Any, first: Any) -> str:
    rel, mx = field(first, "rel_err"), field(first, "max_abs")
    shape = fmt_shape(field(first, "shape"))
    metric = _metric(report)
    if field(first, "finite") is False or (rel is not None and not math.isfinite(rel)):
        size = "the candidate holds NaN or infinity where the reference has finite values"
    elif rel is None:
        size = f"its output does not match ({field(first, 'note') or 'no value to compare'})"
    elif metric == "rel":
        tol = getattr(report, "rtol", None)
        ratio = f", {rel / tol:.3g} times the tolerance rtol {tol:g}" if tol else ""
        size = f"relative error {fmt_float(rel)} (max abs error {fmt_float(mx)}){ratio}"
    else:
        value = field(first, _METRICS[metric][0])
        size = (f"{metric_text(value, metric)}, below the {threshold_text(report, metric)} "
                f"(relative error {fmt_float(rel)}, max abs error {fmt_float(mx)})")
    extra = []
    for key, label in (("cosine", "cosine similarity"), ("sqnr_db", "SQNR")):
        v = field(first, key)
        if v is not None and key != _METRICS.get(metric, _METRICS["rel"])[0]:
            extra.append(f"{label} {v:.6f}" if key == "cosine" else f"{label} {v:.4g} dB")
    tail = f"; {', '.join(extra)}" if extra else ""
    return (f"The numbers first part at {field(first, 'name')} ({field(first, 'type', '?')}, output {shape}): "
            f"{size}{tail}.")


def uncompared_before(rows: Sequence[Any], first: Any) -> list[Any]:
    """Calls without counterpart between ``first`` and the last compared row before it:
    a divergence found at ``first`` may have started in any of them."""
    out: list[Any] = []
    for prev in reversed(rows[: _index(rows, first)]):
        if field(prev, "ok") is not None:
            break
        if field(prev, "status") == "no counterpart":
            out.append(prev)
    return out[::-1]


def gap_words(rows: Sequence[Any], first: Any) -> str:
    """``layer2.1.bn1 just before it was not compared (no counterpart), so the divergence may
    start there``; empty when a compared row comes right before it. The terminal summary and
    the HTML explanation both say it."""
    gap = uncompared_before(rows, first)
    if not gap:
        return ""
    names = ", ".join(field(r, "name") for r in gap[-5:]) + (
        f" and {len(gap) - 5} before them" if len(gap) > 5 else "")
    were = "were" if len(gap) > 1 else "was"
    return f"{names} just before it {were} not compared (no counterpart), so the divergence may start there"


def fused_words(rows: Sequence[Any], first: Any) -> str:
    """Which modules the ONNX graph fused into the first divergence, or into the uncompared calls
    just before it: ``layer3.0.conv1 was fused into layer3.0.bn1 in the ONNX graph, so the error
    may start in layer3.0.conv1 as well``. Empty when none was. The terminal summary and the
    HTML explanation both say it.

    A row's ``fused_into`` names its absorber; an absorbed row that does not (an older report)
    counts as fused into the row after it only inside the run of uncompared rows just before
    ``first``.

    Example:
        >>> from layertap.comparing import CompareRow
        >>> rows = [CompareRow("conv1", "conv1", 0, "Conv2d", [1], None, None, "absorbed", None, fused_into="bn1"),
        ...         CompareRow("bn1", "bn1", 0, "BatchNorm2d", [1], 0.5, 0.1, "FAIL", False)]
        >>> fused_words(rows, rows[1])
        'conv1 was fused into bn1 in the ONNX graph, so the error may start in conv1 as well'
    """
    at = _index(rows, first)
    targets = {field(first, "name")} | {field(r, "name") for r in uncompared_before(rows, first)}
    pairs: list[tuple[str, str]] = []
    adjacent = True  # still inside the run of uncompared rows right before ``first``
    for k in range(at - 1, -1, -1):
        r = rows[k]
        adjacent = adjacent and field(r, "ok") is None
        if field(r, "status") != "absorbed":
            continue
        into = field(r, "fused_into")
        if into is None and adjacent:
            into = next((field(n, "name") for n in rows[k + 1: at + 1] if field(n, "status") != "absorbed"), None)
        if into in targets:
            pairs.append((field(r, "name"), into))
    if not pairs:
        return ""
    pairs.reverse()
    own = [a for a, b in pairs if b == field(first, "name")]
    words = "; ".join(f"{a} was fused into {b}" for a, b in pairs) + " in the ONNX graph"
    if own:
        words += f", so the error may start in {', '.join(own)} as well"
    return words


def _index(rows: Sequence[Any], row: Any) -> int:
    for i, r in enumerate(rows):
        if r is row:
            return i
    return list(rows).index(row)


def _weights_words(rows: Sequence[Any]) -> str:
    """Parameters that differ between the two sides, in modules up to the first divergence: the likely cause."""
    found = [field(r, "weights") for r in rows if field(r, "weights")]
    if not found:
        return ""
    return f"Weights differ at or before it, the likely cause: {'; '.join(found)}."


def _nonfinite_words(report: Any, first: Any) -> str:
    """Where NaN/inf first appear, when that is not the first divergence itself."""
    bad = next((r for r in report.rows if field(r, "finite") is False), None)
    if bad is None or bad is first:
        return ""
    return f"The first NaN or infinity in the candidate appears at {field(bad, 'name')} ({field(bad, 'type', '?')})."


def _local_words(first: Any) -> str:
    local, acc = field(first, "local_rel"), field(first, "rel_err")
    if local is None or acc is None:
        return ""
    if not (math.isfinite(local) and math.isfinite(acc)) or acc == 0:
        return f"Fed the reference's own inputs, it has a local error of {fmt_float(local)}."
    share = local / acc
    if share >= 0.5:
        why = "so this module itself makes most of the error"
    elif share >= 0.05:
        why = "so part of the error is made here and part arrives with its inputs"
    else:
        why = "so the module is nearly exact on its own and the error arrives with its inputs (small errors upstream add up)"
    return f"Fed the reference's own inputs, it has a local error of {fmt_float(local)} against {fmt_float(acc)} accumulated, {why}."


def _after(rows: Sequence[Any], fi: int) -> str:
    later = [r for r in rows[fi + 1:] if field(r, "rel_err") is not None]
    if not later:
        return "No compared module follows it."
    fails = sum(1 for r in later if field(r, "ok") is False)
    last = later[-1]
    grow = ""
    a, b = field(rows[fi], "rel_err"), field(last, "rel_err")
    if a and b and math.isfinite(a) and math.isfinite(b):
        grow = f" ({b / a:.3g} times the error at the first divergence)"
    return (f"After it, {fails} of {len(later)} compared calls fail; the last one, {field(last, 'name')}, "
            f"ends with a relative error of {fmt_float(b)}{grow}.")


def _num(v: Any) -> float:
    return float(v) if v is not None and math.isfinite(v) else math.inf


def _metric(report: Any) -> str:
    """The statistic that decides pass/fail: ``rel`` (default), ``cosine`` or ``sqnr``."""
    return getattr(getattr(report, "criterion", None), "metric", None) or getattr(report, "metric", None) or "rel"


def _as_error(value: Any, metric: str) -> float | None:
    """A row's deciding statistic as an error (0 = identical) for the log axis:
    ``1 - cosine`` for cosine, the noise-to-signal power ``10^(-SQNR/10)`` for SQNR."""
    if value is None:
        return None
    if metric == "cosine":
        return max(0.0, 1.0 - float(value))
    if metric == "sqnr":
        return 0.0 if value == math.inf else (math.inf if value == -math.inf else 10.0 ** (-float(value) / 10.0))
    return float(value)


#: metric -> (row field, threshold attribute of the criterion, column header)
_METRICS = {
    "rel": ("rel_err", "rtol", "rel err"),
    "cosine": ("cosine", "min_cosine", "cosine"),
    "sqnr": ("sqnr_db", "min_sqnr_db", "SQNR dB"),
}


def metric_text(value: Any, metric: str) -> str:
    """A value of the deciding statistic as a reader sees it.

    Example:
        >>> metric_text(0.99945, "cosine"), metric_text(29.64, "sqnr"), metric_text(0.0454, "rel")
        ('cosine 0.999450', 'SQNR 29.64 dB', 'rel err 0.0454')
    """
    if value is None:
        return f"{_METRICS.get(metric, _METRICS['rel'])[2]} -"
    if metric == "cosine":
        return f"cosine {value:.6f}"
    if metric == "sqnr":
        return f"SQNR {fmt_db(value)} dB"
    return f"rel err {fmt_float(value)}"


def threshold_text(report: Any, metric: str | None = None) -> str:
    """The line a row must stay on the right side of, named by its metric: ``rtol 0.001``,
    ``cosine threshold 0.999``, ``SQNR threshold 30 dB``."""
    metric = metric or _metric(report)
    value = _threshold(report, metric)
    if value is None:
        return "threshold"
    if metric == "cosine":
        return f"cosine threshold {value:g}"
    if metric == "sqnr":
        return f"SQNR threshold {value:g} dB"
    return f"rtol {value:g}"


def _threshold(report: Any, metric: str) -> float | None:
    attr = _METRICS.get(metric, _METRICS["rel"])[1]
    criterion = getattr(report, "criterion", None)
    value = getattr(criterion, attr, None) if criterion is not None else getattr(report, attr, None)
    return None if value is None else float(value)


def _axis(report: Any, metric: str) -> Axis:
    """The error axis in the metric's own units: cosine ticks read 0.999, SQNR ticks 30 dB."""
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


def chart_points(report: Any, metric: str, *, with_local: bool) -> tuple[list[Any], list[ErrorPoint], float | None]:
    """The rows the error chart shows, their points (the deciding value, as an error) and the
    threshold on the same axis; the HTML chart and the ``--plot`` PNG both draw these."""
    key = _METRICS.get(metric, _METRICS["rel"])[0]
    rows = [r for r in report.rows if field(r, key) is not None or (with_local and field(r, "local_rel") is not None)]
    points = [ErrorPoint(field(r, "name", "?"), _as_error(field(r, key), metric),
                         field(r, "local_rel") if with_local else None, field(r, "ok"),
                         metric_text(field(r, key), metric)) for r in rows]
    threshold = _threshold(report, metric)
    return rows, points, _as_error(threshold, metric) if threshold is not None else None


def _chart(report: Any, rows: Sequence[Any]) -> str:
    """The error chart in the deciding metric; with local errors and another metric, a
    second chart of relative error, accumulated beside local."""
    metric = _metric(report)
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


def _cells(row: Any, local: bool, metric: str = "rel") -> list[str]:
    """type, shape, [deciding statistic], rel err, [local], status: the deciding statistic's column
    when cosine or SQNR decides, the local column only where some row carries local_rel."""
    cells = [esc(field(row, "type", "")), esc(fmt_shape(field(row, "shape")))]
    if metric in ("cosine", "sqnr"):
        value = field(row, _METRICS[metric][0])
        cells.append("-" if value is None else esc(f"{value:.6f}" if metric == "cosine" else fmt_db(value)))
    cells.append(esc(fmt_float(field(row, "rel_err"))))
    if local:
        value = field(row, "local_rel")
        cells.append(esc(fmt_float(value)) if value is not None else "")
    return cells + [esc(field(row, "status", ""))]


def _headers(local: bool, metric: str = "rel") -> list[str]:
    deciding = [_METRICS[metric][2]] if metric in ("cosine", "sqnr") else []
    return ["type", "shape", *deciding, "rel err"] + (["local err"] if local else []) + ["status"]


def _tree(rows: Sequence[Any], first: Any, metric: str = "rel") -> str:
    shown = rows[:MAX_TREE_ROWS]
    local = _has_local(rows)
    nodes = [Node(field(r, "path", "") or "", esc(field(r, "name", "?")), _cells(r, local, metric),
                  _status_class(r, first)) for r in shown]
    cut = f"first {MAX_TREE_ROWS} of {len(rows)} rows shown" if len(rows) > MAX_TREE_ROWS else ""
    widths = (11, 8) + ((6.5,) if metric in ("cosine", "sqnr") else ()) + (5.5,) + ((5.5,) if local else ()) + (6.5,)
    return render_tree(["module", *_headers(local, metric)], nest(nodes), widths=widths, keep=len(widths) - 1, note=cut)


def _flat(rows: Sequence[Any], first: Any, metric: str = "rel") -> str:
    local = _has_local(rows)
    body = [[esc(field(r, "name")), *_cells(r, local, metric), esc(fmt_float(field(r, "max_abs"))),
             esc("; ".join(t for t in (field(r, "weights"), field(r, "note")) if t))] for r in rows]
    classes = [_status_class(r, first) for r in rows]
    headers = ["module", *_headers(local, metric), "max abs", "note"]
    numeric = [i for i, h in enumerate(headers) if h in ("cosine", "SQNR dB", "rel err", "local err", "max abs")]
    table = grid_table(headers, body, numeric=numeric, row_classes=classes)
    return f"<details><summary>show all {len(rows)} rows</summary>{table}</details>"
