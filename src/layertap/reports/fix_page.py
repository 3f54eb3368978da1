"""``layertap fix`` pages: the output metric of every set tried against the number of modules
kept in float32 (the target as a line, the set FIXED.onnx holds ringed), then every step."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..text import field
from .html import esc, section, table_fragment
from .svg import FAIL_COLOR, LINE_COLOR, PASS_COLOR, TOL_COLOR

_W, _H, _L, _R, _T, _B = 640, 300, 64, 16, 20, 44
_LABELS = {"cosine": "cosine (log of 1 - cosine)", "top1": "top-1 agreement (log of 1 - it)",
           "rel": "relative error (log)"}
_UNITS = {"module": "modules", "node": "ONNX nodes"}  # what a fix report's search keeps


def fix_fragment(report: Any) -> str:
    """The chart and the steps table of a fix report (rows read by field name)."""
    target = getattr(report, "target", None)
    metric = getattr(target, "metric", "metric")
    units = _UNITS.get(getattr(report, "unit", "module"), "modules")
    chart = metric_chart(report.rows, metric=metric, target=getattr(target, "value", None), units=units)
    return section(f"{metric} of the outputs vs {units} kept in float32", chart, anchor="chart") + table_fragment(report)


def metric_chart(steps: Sequence[Any], *, metric: str, target: float | None, units: str = "modules") -> str:
    """An SVG scatter: x = ``units`` kept, y = the output metric (``1 - cosine``/``1 - top1`` and ``rel``
    on a log scale, SQNR in dB); blue points meet the target, red ones do not.

    Example:
        >>> from types import SimpleNamespace as S
        >>> svg = metric_chart([S(n_kept=0, metric=0.9, ok=False, step=0, chosen=False),
        ...                     S(n_kept=2, metric=0.9999, ok=True, step=1, chosen=True)], metric="cosine", target=0.999)
        >>> svg.startswith("<svg"), "step 1" in svg
        (True, True)
    """
    pts = [(float(field(s, "n_kept", 0) or 0), _y(field(s, "metric"), metric), s) for s in steps]
    ty_value = _y(target, metric)
    ys: list[float] = [y for _, y, _ in pts if y is not None] + ([ty_value] if ty_value is not None else [])
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 1, hi + 1
    xmax = max([x for x, _, _ in pts] + [1.0])
    pw, ph = _W - _L - _R, _H - _T - _B

    def at(x: float, y: float) -> tuple[float, float]:
        return _L + pw * x / xmax, _T + ph * (1 - (y - lo) / (hi - lo))

    parts = [f'<svg viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(metric)} per step">',
             f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="{LINE_COLOR}"/>']
    if target is not None and ty_value is not None:
        _, ty = at(0, ty_value)
        parts.append(f'<line x1="{_L}" x2="{_L + pw}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="{TOL_COLOR}" stroke-dasharray="4 3"/>'
                     f'<text x="{_L + pw - 4}" y="{ty - 4:.1f}" text-anchor="end" font-size="11">target {target:g}</text>')
    for x, y, s in pts:
        if y is None:  # a failed trial has no measurement to draw (the table names its reason)
            continue
        cx, cy = at(x, y)
        color = PASS_COLOR if field(s, "ok") else FAIL_COLOR
        ring = f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8" fill="none" stroke="{color}"/>' if field(s, "chosen") else ""
        tip = f"step {field(s, 'step')}: {int(x)} kept, {metric} {field(s, 'metric')}"
        parts.append(f'{ring}<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{color}"><title>{esc(tip)}</title></circle>')
    for y in (lo, hi):
        _, py = at(0, y)
        parts.append(f'<text x="{_L - 4}" y="{py + 4:.1f}" text-anchor="end" font-size="10">{_value(y, metric):.6g}</text>')
    label = _LABELS.get(metric, "SQNR dB")
    mid = _T + ph / 2
    parts.append(f'<text x="{_L + pw / 2}" y="{_H - 10}" text-anchor="middle" font-size="12">'
                 f'{esc(units)} kept in float32 (0 .. {int(xmax)})</text>'
                 f'<text x="14" y="{mid}" font-size="12" transform="rotate(-90 14 {mid})" text-anchor="middle">'
                 f'{esc(label)}</text></svg>')
    return "".join(parts)


def _y(value: Any, metric: str) -> float | None:
    """Up is better: ``-log10(1 - cosine)``, ``-log10(rel)``, SQNR as is."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    v = float(value)
    if metric == "sqnr":
        return v if math.isfinite(v) else None
    err = v if metric == "rel" else 1.0 - v
    return -math.log10(max(err, 1e-12)) if math.isfinite(err) else None


def _value(y: float, metric: str) -> float:
    """The metric at chart height ``y`` (the inverse of :func:`_y`)."""
    if metric == "sqnr":
        return y
    err = 10.0 ** -y
    return err if metric == "rel" else 1.0 - err
