"""What a compare report says, as plain text: the first divergence explained, the calls
just before it that were not compared or were fused into it, the deciding metric and its
threshold, and the points of the error chart.

The terminal summary (:meth:`CompareReport.footer`), the HTML page
(``layertap.reports.compare_page``, which only draws) and the ``--plot`` PNG all take
their words and points from here. Rows and reports are read by field name with
defaults, so reports of either compare form (PyTorch vs ONNX, ONNX vs ONNX; with or
without ``local_rel``, ``cosine``, ``sqnr_db``, ``worst_sample``) read the same way.

Example:
    >>> from layertap.comparing import CompareReport, CompareRow
    >>> r = CompareReport([CompareRow("a", "a", 0, "Conv2d", [1, 4], 1e-7, 1e-7, "pass", True),
    ...                    CompareRow("b", "b", 0, "ReLU", [1, 4], 0.1, 0.2, "FAIL", False)])
    >>> explanation(r)[0]
    'The numbers first part at b (ReLU, output 1x4): relative error 0.2 (max abs error 0.1), 200 times the tolerance rtol 0.001.'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..metrics import FORMAT_MULTIPLE
from ..text import field, fmt_db, fmt_float, fmt_shape

#: metric -> (row field, threshold attribute of the criterion, column header)
METRICS = {
    "rel": ("rel_err", "rtol", "rel err"),
    "cosine": ("cosine", "min_cosine", "cosine"),
    "sqnr": ("sqnr_db", "min_sqnr_db", "SQNR dB"),
}


@dataclass(frozen=True)
class ErrorPoint:
    """One module call on the error chart: ``error`` accumulated, ``local`` its own (None: not computed);
    ``text`` is what hovering its point says of its value (default ``error 0.0123``); ``band``: judged at
    the candidate's precision, the most the format explains there (the error's limit), else ``None``."""

    name: str
    error: float | None
    local: float | None = None
    ok: bool | None = None
    text: str | None = None
    band: float | None = None


def metric_of(report: Any) -> str:
    """The statistic that decides pass/fail: ``rel`` (default), ``cosine`` or ``sqnr``."""
    return getattr(getattr(report, "criterion", None), "metric", None) or getattr(report, "metric", None) or "rel"


def first_index(rows: Sequence[Any]) -> int | None:
    """Where the first failing row sits, None when every row passes."""
    return next((i for i, r in enumerate(rows) if field(r, "ok") is False), None)


def explanation(report: Any) -> list[str]:
    """The first divergence in words, one paragraph a string: where, how big, what before and
    after, local vs carried error (or, when nothing diverges, the largest error).

    Example:
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> r = CompareReport([CompareRow("a", "a", 0, "Conv2d", [1, 4], 1e-7, 1e-7, "pass", True)])
        >>> explanation(r)
        ['All 1 compared module calls agree within the tolerance. The largest relative error is 1e-07 at a (Conv2d).']
    """
    rows = list(report.rows)
    fi = first_index(rows)
    if fi is None:
        compared = [r for r in rows if field(r, "rel_err") is not None]
        worst = max(compared, key=lambda r: _num(field(r, "rel_err")), default=None)
        text = f"All {len(compared)} compared module calls agree within the tolerance."
        versus = getattr(report, "versus", None)
        if getattr(report, "judged_at_format", False) and versus is not None:
            text = (f"All {len(compared)} compared module calls stay as close to {versus[2]} as {versus[1]} does: "
                    f"none departs from {versus[1]} by more than {FORMAT_MULTIPLE:g} times {versus[1]}'s own error.")
        elif getattr(report, "judged_at_format", False):
            precision = getattr(report, "precision", "the format")
            text = (f"All {len(compared)} compared module calls stay within what {precision} explains: none is further "
                    f"from an ideal {precision} run than {precision}'s own rounding makes it.")
        if worst is not None:
            text += (f" The largest relative error is {fmt_float(field(worst, 'rel_err'))} at "
                     f"{field(worst, 'name')} ({field(worst, 'type', '?')}).")
        return [text]
    first = rows[fi]
    p = [_where(report, first), _weights_words(rows[: fi + 1]), _before(rows, fi)]
    gap = gap_words(rows, first)
    if gap:
        p.append(f"But {gap}.")
    fused = fused_words(rows, first)
    if fused:
        p.append(f"{fused}.")
    p += [_local_words(first), _after(rows, fi), _nonfinite_words(report, first), *_samples_words(report, first)]
    return [x for x in p if x]


def _before(rows: Sequence[Any], fi: int) -> str:
    before = [r for r in rows[:fi] if field(r, "rel_err") is not None]
    if not before:
        return "It is the first module compared: the inputs themselves may already differ."
    last = before[-1]
    return (f"Every one of the {len(before)} compared calls before it agrees; the last of them, "
            f"{field(last, 'name')}, has a relative error of {fmt_float(field(last, 'rel_err'))}.")


def _samples_words(report: Any, first: Any) -> list[str]:
    p = []
    counts = getattr(report, "first_divergence_counts", None)
    total = getattr(report, "samples", None) or sum((counts or {}).values())
    if counts and total > 1:  # over one sample the sentence says nothing new
        n = counts.get(field(first, "name"), 0)
        p.append(f"Over {total} samples it was the first to diverge in {n}.")
    worst = field(first, "worst_sample")
    if worst is not None:
        p.append(f"Its worst sample is number {worst}.")
    return p


def _where(report: Any, first: Any) -> str:
    rel, mx = field(first, "rel_err"), field(first, "max_abs")
    shape = fmt_shape(field(first, "shape"))
    metric = metric_of(report)
    judged = getattr(report, "judged_at_format", False) and (field(first, "limit") or field(first, "impl_rel") is not None)
    if judged and getattr(report, "versus", None) is not None and field(first, "format_rel") is not None:
        size = versus_size(first, report.versus, getattr(report, "rtol", 1e-3), getattr(report, "atol", 1e-5))
    elif judged:
        size = format_size(first, getattr(report, "precision", "the format"), getattr(report, "rtol", 1e-3),
                           getattr(report, "atol", 1e-5))
    elif field(first, "finite") is False or (rel is not None and not math.isfinite(rel)):
        size = "the candidate holds NaN or infinity where the reference has finite values"
    elif rel is None:
        size = f"its output does not match ({field(first, 'note') or 'no value to compare'})"
    elif metric == "rel":
        tol = getattr(report, "rtol", None)
        ratio = f", {rel / tol:.3g} times the tolerance rtol {tol:g}" if tol else ""
        size = f"relative error {fmt_float(rel)} (max abs error {fmt_float(mx)}){ratio}"
    else:
        value = field(first, METRICS[metric][0])
        size = (f"{metric_text(value, metric)}, below the {threshold_text(report, metric)} "
                f"(relative error {fmt_float(rel)}, max abs error {fmt_float(mx)})")
    extra = []
    for key, label in (("cosine", "cosine similarity"), ("sqnr_db", "SQNR")):
        v = field(first, key)
        if v is not None and key != METRICS.get(metric, METRICS["rel"])[0]:
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


def as_error(value: Any, metric: str) -> float | None:
    """A row's deciding statistic as an error (0 = identical) for the log axis:
    ``1 - cosine`` for cosine, the noise-to-signal power ``10^(-SQNR/10)`` for SQNR."""
    if value is None:
        return None
    if metric == "cosine":
        return max(0.0, 1.0 - float(value))
    if metric == "sqnr":
        return 0.0 if value == math.inf else (math.inf if value == -math.inf else 10.0 ** (-float(value) / 10.0))
    return float(value)


def metric_text(value: Any, metric: str) -> str:
    """A value of the deciding statistic as a reader sees it.

    Example:
        >>> metric_text(0.99945, "cosine"), metric_text(29.64, "sqnr"), metric_text(0.0454, "rel")
        ('cosine 0.999450', 'SQNR 29.64 dB', 'rel err 0.0454')
    """
    if value is None:
        return f"{METRICS.get(metric, METRICS['rel'])[2]} -"
    if metric == "cosine":
        return f"cosine {value:.6f}"
    if metric == "sqnr":
        return f"SQNR {fmt_db(value)} dB"
    return f"rel err {fmt_float(value)}"


def threshold_text(report: Any, metric: str | None = None) -> str:
    """The line a row must stay on the right side of, named by its metric: ``rtol 0.001``,
    ``cosine threshold 0.999``, ``SQNR threshold 30 dB``."""
    metric = metric or metric_of(report)
    value = threshold_value(report, metric)
    if value is None:
        return "threshold"
    if metric == "cosine":
        return f"cosine threshold {value:g}"
    if metric == "sqnr":
        return f"SQNR threshold {value:g} dB"
    return f"rtol {value:g}"


def threshold_value(report: Any, metric: str) -> float | None:
    attr = METRICS.get(metric, METRICS["rel"])[1]
    criterion = getattr(report, "criterion", None)
    value = getattr(criterion, attr, None) if criterion is not None else getattr(report, attr, None)
    return None if value is None else float(value)


def judged_at_format(report: Any, metric: str) -> bool:
    """The rows were judged at the candidate's precision (the chart shows what the file adds against a band)."""
    return bool(getattr(report, "judged_at_format", False)) and metric == "rel"


def chart_points(report: Any, metric: str, *, with_local: bool) -> tuple[list[Any], list[ErrorPoint], float | None]:
    """The rows the error chart shows, their points (the deciding value, as an error) and the
    threshold on the same axis; the HTML chart and the ``--plot`` PNG both draw these.

    Judged at the candidate's precision, the points are each row's implementation error (the candidate
    against an ideal run at its format) and each carries a ``band``: what the format explains there."""
    if judged_at_format(report, metric):
        return _format_points(report, with_local)
    key = METRICS.get(metric, METRICS["rel"])[0]
    rows = [r for r in report.rows if field(r, key) is not None or (with_local and field(r, "local_rel") is not None)]
    points = [ErrorPoint(field(r, "name", "?"), as_error(field(r, key), metric),
                         field(r, "local_rel") if with_local else None, field(r, "ok"),
                         metric_text(field(r, key), metric)) for r in rows]
    threshold = threshold_value(report, metric)
    return rows, points, as_error(threshold, metric) if threshold is not None else None



def _format_points(report: Any, with_local: bool) -> tuple[list[Any], list[ErrorPoint], None]:
    rtol, atol = getattr(report, "rtol", 1e-3), getattr(report, "atol", 1e-5)
    rows = [r for r in report.rows if field(r, "impl_rel") is not None or (with_local and field(r, "local_rel") is not None)]
    points = []
    for r in rows:
        impl, fmt_rel, scale = field(r, "impl_rel"), field(r, "format_rel"), field(r, "ref_max") or 0.0
        own = field(r, "local_impl_rel") is not None and field(r, "local_format_rel") is not None
        if own:  # judged by its own part (local=True): that split, and its band
            impl, fmt_rel = field(r, "local_impl_rel"), field(r, "local_format_rel")
        band = None if fmt_rel is None else format_band(fmt_rel, scale, rtol, atol)
        what = "its own part's implementation error" if own else "implementation error"
        text = (f"{what} {fmt_float(impl)}; the format explains up to {fmt_float(band)} "
                f"(an ideal {'part' if own else 'run'}'s own error {fmt_float(fmt_rel)})"
                if impl is not None and band is not None else None)
        if field(r, "limit"):
            text = f"{field(r, 'limit')}; {text}" if text else field(r, "limit")
        points.append(ErrorPoint(field(r, "name", "?"), impl, field(r, "local_rel") if with_local else None,
                                 field(r, "ok"), text, band))
    return rows, points, None


def format_band(format_rel: float, scale: float, rtol: float, atol: float) -> float:
    """What a format explains at a value, relative to ``scale`` (its ``max|ref|``): ``FORMAT_MULTIPLE`` times
    the ideal run's error there plus the tolerance (the precision rule, :meth:`~layertap.metrics.ErrorStats.within_format`).

    Example:
        >>> format_band(1e-3, 2.0, 1e-3, 1e-5)
        0.005005
    """
    return FORMAT_MULTIPLE * format_rel + rtol + (atol / scale if scale else 0.0)


def band_text(report: Any) -> str:
    """The legend of the format's band: ``what float16 explains (4 x an ideal float16 run's own error + rtol)``
    (with ``local=True``, for each module's own part where it has one)."""
    precision = getattr(report, "precision", "the format")
    if getattr(report, "local", False) and any(field(r, "local_format_rel") is not None for r in getattr(report, "rows", ())):
        return (f"what {precision} explains ({FORMAT_MULTIPLE:g} x an ideal {precision} run's own error + rtol; for a "
                "module with its own part, that part's)")
    return f"what {precision} explains ({FORMAT_MULTIPLE:g} x an ideal {precision} run's own error + rtol)"


def tick_indices(n: int, first: int | None, most: int) -> list[int]:
    """Which of ``n`` points get an axis label: every k-th, at most about ``most``, and always
    the first divergence (its close neighbours give way so labels never overlap).

    Example:
        >>> tick_indices(10, 5, 5)
        [0, 2, 5, 8]
        >>> tick_indices(4, None, 40)
        [0, 1, 2, 3]
    """
    step = max(1, math.ceil(n / most))
    ticks = set(range(0, n, step))
    if first is not None:
        ticks = {t for t in ticks if abs(t - first) >= step} | {first}
    return sorted(ticks)


#: what the report says a run at each format is
FORMAT_WORDS = {"float16": "float16 rounding", "bfloat16": "bfloat16 rounding", "int8": "int8 quantisation",
                "float32": "float32 rounding"}


def ideal_line(precision: str, output_cosine: float | None, ideal_cosine: float | None) -> str:
    """The last line of a healthy run judged at a reduced precision.

    Example:
        >>> ideal_line("float16", 0.9999912, 0.9999931)
        'no divergence beyond float16 rounding; output cosine 0.9999912 (an ideal float16 run: 0.9999931)'
    """
    what = FORMAT_WORDS.get(precision, precision)
    if output_cosine is None:
        return f"no divergence beyond {what}"
    ideal = f" (an ideal {precision} run: {fmt_cosine(ideal_cosine)})" if ideal_cosine is not None else ""
    return f"no divergence beyond {what}; output cosine {fmt_cosine(output_cosine)}{ideal}"


def fmt_cosine(c: float) -> str:
    """A cosine with the digits that show how far it is from 1 (at least 6 decimals).

    Example:
        >>> fmt_cosine(0.99999987), fmt_cosine(0.9871), fmt_cosine(1.0)
        ('0.99999987', '0.987100', '1')
    """
    if c >= 1.0:
        return "1"
    if not math.isfinite(c) or c <= 0:
        return f"{c:.6g}"
    digits = max(6, math.ceil(-math.log10(1.0 - c)) + 1)
    return f"{c:.{min(digits, 12)}f}"


def format_rule(precision: str, criterion: Any, local: bool = False) -> str:
    """The precision rule in words, for the footer and ``--json`` (``local``: rows judged by their own parts).

    Example:
        >>> from layertap.metrics import Criterion
        >>> format_rule("float16", Criterion())[:79]
        'judged at float16: pass when impl err <= 4 x format err + rtol 0.001 x max|ref|'
    """
    if local:
        return (f"judged at {precision}, each module by its own part (--local): pass when its impl err <= "
                f"{FORMAT_MULTIPLE:g} x its format err + rtol {criterion.rtol:g} x max|ref| + atol {criterion.atol:g}, "
                f"and it scales its values no more than {precision}'s own noise there (format err: the reference's part "
                f"run alone at {precision} on the reference's inputs; impl err: the candidate's part against it; a row "
                "without a part: the whole run's), and where "
                f"{precision} carries every value")
    return (f"judged at {precision}: pass when impl err <= {FORMAT_MULTIPLE:g} x format err + rtol {criterion.rtol:g} x "
            f"max|ref| + atol {criterion.atol:g} (format err: an ideal {precision} run vs the reference; impl err: the "
            f"candidate vs that run), and where {precision} carries every value")


def format_size(row: Any, precision: str, rtol: float = 1e-3, atol: float = 1e-5) -> str:
    """A row judged at its format, in words: what the format cannot carry, or the implementation error
    against what the format explains there (``FORMAT_MULTIPLE`` x its format error + the tolerance), in
    the largest difference or, where it is further over, the root mean square one.

    Example:
        >>> from layertap.comparing import CompareRow
        >>> r = CompareRow("relu", "relu", 0, "ReLU", [1], 0.3, 0.3, "FAIL", False, ref_max=1.0, format_rel=1e-3, impl_rel=0.3)
        >>> format_size(r, "float16")
        'implementation error 0.3, 59.9 times what float16 explains there (format error 0.001, rel err 0.3)'
        >>> r = CompareRow("fc", "fc", 0, "Linear", [1], 2e-3, 2e-3, "FAIL", False, ref_max=1.0, format_rel=1e-3, impl_rel=2e-3,
        ...                format_rms=1e-5, impl_rms=1e-3, ref_rms=0.1)
        >>> format_size(r, "float16")[:85]
        'root mean square implementation error 0.001, 6.67 times what float16 explains there ('
    """
    limit = field(row, "limit")
    rel = fmt_float(field(row, "rel_err"))
    if limit:
        return f"{limit} (rel err {rel})"
    local_impl, local_fmt = field(row, "local_impl_rel"), field(row, "local_format_rel")
    if local_impl is not None and local_fmt is not None:  # judged by its own part (local=True)
        allowed = format_band(local_fmt, field(row, "ref_max") or 0.0, rtol, atol)
        if local_impl <= allowed:  # within the largest difference: its values are scaled, or its error is everywhere
            return _gain_words(field(row, "local_impl_gain"), precision, f"its own part, local format error "
                               f"{fmt_float(local_fmt)}; the whole run there: rel err {rel}")
        times = f", {local_impl / allowed:.3g} times what {precision} explains for it alone" if allowed else ""
        return (f"its own part's implementation error {fmt_float(local_impl)}{times} (local format error "
                f"{fmt_float(local_fmt)}; the whole run there: rel err {rel})")
    impl, fmt_rel = field(row, "impl_rel"), field(row, "format_rel")
    if impl is None or fmt_rel is None:
        return f"rel err {rel}"
    scale = field(row, "ref_max") or 0.0
    allowed = format_band(fmt_rel, scale, rtol, atol)
    over = impl / allowed if allowed else math.inf
    i_rms, f_rms, r_rms = field(row, "impl_rms"), field(row, "format_rms"), field(row, "ref_rms")
    if i_rms is not None and f_rms is not None and r_rms is not None:
        rms_allowed = atol + rtol * r_rms + FORMAT_MULTIPLE * f_rms
        rms_over = i_rms / rms_allowed if rms_allowed else math.inf
        if rms_over > max(over, 1.0):
            return (f"root mean square implementation error {i_rms:.3g}, {rms_over:.3g} times what {precision} explains "
                    f"there (its format error {f_rms:.3g} of a root mean square value {r_rms:.3g}; rel err {rel})")
    times = f", {over:.3g} times what {precision} explains there" if allowed else ""
    return f"implementation error {fmt_float(impl)}{times} (format error {fmt_float(fmt_rel)}, rel err {rel})"


def _gain_words(gain: float | None, precision: str, detail: str) -> str:
    """A value the candidate scales against the ideal run (a changed weight), in words."""
    if gain is None:
        return f"an implementation error beyond what {precision} explains, everywhere in the value ({detail})"
    return (f"the candidate's values are {abs(gain):.2%} {'larger' if gain > 0 else 'smaller'} than an ideal "
            f"{precision} run's, more than {precision}'s own rounding there scatters them ({detail})")


def versus_size(row: Any, versus: tuple[str, str, str], rtol: float = 1e-3, atol: float = 1e-5) -> str:
    """A row judged against a more precise reference, in words: how many times the candidate's error against it
    is the ideal run's own (``compiled loses 30x what eager float32 loses here``), or that it is closer.

    Example:
        >>> from layertap.comparing import CompareRow
        >>> r = CompareRow("layer3.0", "layer3.0", 0, "BasicBlock", [1], 3e-5, 3e-5, "FAIL", False, ref_max=1.0,
        ...                format_rel=1e-6, impl_rel=3e-5)
        >>> versus_size(r, ("compiled", "eager float32", "float64"))[:64]
        'compiled loses 30x what eager float32 loses here against float64'
    """
    cand, ideal, ref = versus
    rel, fmt_rel, impl = field(row, "rel_err"), field(row, "format_rel"), field(row, "impl_rel")
    if field(row, "limit"):
        return f"{field(row, 'limit')} (rel err {fmt_float(rel)})"
    if rel is None or fmt_rel is None:
        return f"rel err {fmt_float(rel)}"
    detail = (f"rel err {fmt_float(rel)} against {ref}, {ideal}'s {fmt_float(fmt_rel)}; {cand} vs {ideal} "
              f"{fmt_float(impl)}, {ideal} explains up to {fmt_float(format_band(fmt_rel, field(row, 'ref_max') or 0.0, rtol, atol))}")
    if rel <= fmt_rel:
        return f"{cand} is closer to {ref} than {ideal} is here ({detail})"
    ratio = rel / fmt_rel if fmt_rel > 0 else math.inf
    times = "infinitely more than" if not math.isfinite(ratio) else f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"
    return f"{cand} loses {times} what {ideal} loses here against {ref} ({detail})"


def versus_rule(versus: tuple[str, str, str], criterion: Any) -> str:
    """The rule of a comparison against a more precise reference, for the footer and ``--json``.

    Example:
        >>> from layertap.metrics import Criterion
        >>> versus_rule(("compiled", "eager float32", "float64"), Criterion())[:60]
        'judged against float64: pass when |compiled - eager float32|'
    """
    cand, ideal, ref = versus
    return (f"judged against {ref}: pass when |{cand} - {ideal}| <= {FORMAT_MULTIPLE:g} x |{ideal} - {ref}| + rtol "
            f"{criterion.rtol:g} x max|ref| + atol {criterion.atol:g} (impl err; format err: {ideal}'s own error)")


def closer_lines(rows: Sequence[Any], versus: tuple[str, str, str]) -> list[str]:
    """The line that says where the candidate is closer to the reference than the ideal run (fused kernels that
    keep float32 intermediates under autocast), when it is anywhere.

    Example:
        >>> from layertap.comparing import CompareRow
        >>> r = CompareRow("fc", "fc", 0, "Linear", [1], 1e-4, 1e-4, "pass", True, ref_max=1.0, format_rel=3e-3)
        >>> closer_lines([r], ("compiled", "eager bfloat16", "float64"))[0][:58]
        'compiled is closer to float64 than eager bfloat16 at 1 of '
    """
    cand, ideal, ref = versus
    judged = [r for r in rows if field(r, "rel_err") is not None and field(r, "format_rel") is not None]
    closer = [r for r in judged if field(r, "rel_err") < 0.5 * field(r, "format_rel")]
    if not closer:
        return []
    names = ", ".join(field(r, "name") for r in closer[:4]) + (", ..." if len(closer) > 4 else "")
    return [f"{cand} is closer to {ref} than {ideal} at {len(closer)} of {len(judged)} module calls (under half its "
            f"error: {names}); those pass"]
