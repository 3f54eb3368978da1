"""HTML for ``compare``: verdict, the first divergence in words, the error chart, the tree.

Rows are read by field name with defaults, so reports of either compare form
(PyTorch vs ONNX, ONNX vs ONNX; with or without ``local_rel``, ``cosine``,
``sqnr_db``, ``worst_sample``) render the same way.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..report import fmt_float, fmt_shape
from .html import cards, esc, field, grid_table, notes_list, section, verdict
from .svg import FAIL_COLOR, LOCAL_COLOR, PASS_COLOR, TOL_COLOR, ErrorPoint, error_chart
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
        >>> from layertap.bridge.compare import CompareReport, CompareRow
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
    parts.append(section("module tree", _tree(rows, first), anchor="tree"))
    parts.append(section("every row, in order", _flat(rows, first), anchor="rows"))
    return "".join(parts)


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
    for attr, label in (("samples", "samples"), ("ort_runs", "ORT runs")):
        value = getattr(report, attr, None)
        if value is not None and not callable(value) and value != 1:
            items.append((label, value if not isinstance(value, (list, tuple)) else len(value)))
    return cards(items, css={"FAIL": "bad", "pass": "ok"})


def explain(report: Any) -> str:
    """The first divergence in words: where, how big, what before and after, local vs carried error.

    Example:
        >>> from layertap.bridge.compare import CompareReport, CompareRow
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
    absorbed = [field(r, "name") for r in rows[max(0, fi - 3):fi] if field(r, "status") == "absorbed"]
    if absorbed:
        were = "was" if len(absorbed) == 1 else "were"
        p.append(f"Just before it, {', '.join(absorbed)} {were} fused in the ONNX graph and compared at this later "
                 "tensor, so the error may come from there.")
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
        rule = getattr(getattr(report, "criterion", None), "describe", None)
        size = f"relative error {fmt_float(rel)}, failing the {metric} rule" + (f" ({rule()})" if callable(rule) else "")
    extra = []
    for key, label in (("cosine", "cosine similarity"), ("sqnr_db", "SQNR")):
        v = field(first, key)
        if v is not None:
            extra.append(f"{label} {v:.6f}" if key == "cosine" else f"{label} {v:.4g} dB")
    tail = f"; {', '.join(extra)}" if extra else ""
    return (f"The numbers first part at {field(first, 'name')} ({field(first, 'type', '?')}, output {shape}): "
            f"{size}{tail}.")


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


_CHARTS = {  # metric -> (row field, threshold attribute of the criterion, axis label, threshold label)
    "rel": ("rel_err", "rtol", "max|cand - ref| / max|ref|", "tolerance (rtol)"),
    "cosine": ("cosine", "min_cosine", "1 - cosine similarity", "threshold (1 - min cosine)"),
    "sqnr": ("sqnr_db", "min_sqnr_db", "noise / signal power, 10^(-SQNR/10)", "threshold (min SQNR)"),
}


def _chart(report: Any, rows: Sequence[Any]) -> str:
    """The error chart in the deciding metric; with local errors and another metric, a
    second chart of relative error, accumulated beside local."""
    metric = _metric(report)
    out = _one_chart(report, rows, metric, with_local=metric == "rel")
    if metric != "rel" and _has_local(rows):
        out += "<h3>relative error: accumulated and local</h3>" + _one_chart(report, rows, "rel", with_local=True)
    return out


def _one_chart(report: Any, rows: Sequence[Any], metric: str, *, with_local: bool) -> str:
    key, tol_attr, y_label, tol_label = _CHARTS.get(metric, _CHARTS["rel"])
    criterion = getattr(report, "criterion", None)
    threshold = getattr(criterion, tol_attr, None) if criterion is not None else getattr(report, tol_attr, None)
    compared = [r for r in rows if field(r, key) is not None or (with_local and field(r, "local_rel") is not None)]
    if not compared:
        return '<p class="muted">nothing was compared, so there is no chart</p>'
    first = next((i for i, r in enumerate(compared) if field(r, "ok") is False), None)
    points = [ErrorPoint(field(r, "name", "?"), _as_error(field(r, key), metric),
                         field(r, "local_rel") if with_local else None, field(r, "ok")) for r in compared]
    svg = error_chart(points, tolerance=_as_error(threshold, metric) if threshold is not None else None, first=first,
                      y_label=y_label)
    legend = [f'<span><i style="background:{PASS_COLOR}"></i>pass (accumulated error)</span>',
              f'<span><i style="background:{FAIL_COLOR}"></i>FAIL</span>',
              f'<span><i style="background:{TOL_COLOR}"></i>{esc(tol_label)}</span>']
    if any(p.local is not None for p in points):
        swatch = f'<i style="background:#fff;border:2px solid {LOCAL_COLOR}"></i>'
        legend.append(f"<span>{swatch}local error (fed the reference's inputs)</span>")
    hidden = len(rows) - len(compared)
    note = (f'<p class="muted">{len(compared)} compared calls in execution order, log scale; {hidden} calls without a '
            "value (absorbed or without counterpart) are left out. Hover a point for its module.</p>")
    return f'<div class="legend">{"".join(legend)}</div><div class="chart scroll">{svg}</div>{note}'


def _counts_table(counts: dict[str, int]) -> str:
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    return grid_table(["module", "samples where it diverged first"], [[esc(k), esc(v)] for k, v in ordered], numeric=[1])


def _has_local(rows: Sequence[Any]) -> bool:
    return any(field(r, "local_rel") is not None for r in rows)


def _cells(row: Any, local: bool) -> list[str]:
    """type, shape, rel err, [local], status: the local column only where some row carries local_rel."""
    cells = [esc(field(row, "type", "")), esc(fmt_shape(field(row, "shape"))), esc(fmt_float(field(row, "rel_err")))]
    if local:
        value = field(row, "local_rel")
        cells.append(esc(fmt_float(value)) if value is not None else "")
    return cells + [esc(field(row, "status", ""))]


def _headers(local: bool) -> list[str]:
    return ["type", "shape", "rel err"] + (["local err"] if local else []) + ["status"]


def _tree(rows: Sequence[Any], first: Any) -> str:
    shown = rows[:MAX_TREE_ROWS]
    local = _has_local(rows)
    nodes = [Node(field(r, "path", "") or "", esc(field(r, "name", "?")), _cells(r, local), _status_class(r, first))
             for r in shown]
    cut = f"first {MAX_TREE_ROWS} of {len(rows)} rows shown" if len(rows) > MAX_TREE_ROWS else ""
    widths = (11, 8, 5.5) + ((5.5,) if local else ()) + (6.5,)
    return render_tree(["module", *_headers(local)], nest(nodes), widths=widths, keep=len(widths) - 1, note=cut)


def _flat(rows: Sequence[Any], first: Any) -> str:
    local = _has_local(rows)
    body = [[esc(field(r, "name")), *_cells(r, local), esc(fmt_float(field(r, "max_abs"))),
             esc("; ".join(t for t in (field(r, "weights"), field(r, "note")) if t))]
            for r in rows]
    classes = [_status_class(r, first) for r in rows]
    numeric = [3, 4, 6] if local else [3, 5]
    table = grid_table(["module", *_headers(local), "max abs", "note"], body, numeric=numeric, row_classes=classes)
    return f"<details><summary>show all {len(rows)} rows</summary>{table}</details>"
