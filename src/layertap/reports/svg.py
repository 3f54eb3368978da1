"""Inline SVG charts: error per module (log scale) and value histograms.

Pure Python + numpy. Charts use a fixed viewBox and scale to their box; each
point carries a ``<title>`` so hovering names the module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .html import esc

PASS_COLOR, FAIL_COLOR, LOCAL_COLOR, TOL_COLOR, LINE_COLOR = "#2f6fd0", "#c0262d", "#e07b00", "#8a8f99", "#b7bdc8"
_W, _H = 960, 340
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 34, 96
_MAX_TICK_LABELS = 32


@dataclass(frozen=True)
class ErrorPoint:
    """One module call on the error chart: ``error`` accumulated, ``local`` its own (None: not computed)."""

    name: str
    error: float | None
    local: float | None = None
    ok: bool | None = None


def error_chart(points: Sequence[ErrorPoint], *, tolerance: float | None, first: int | None,
                y_label: str = "relative error") -> str:
    """An SVG line chart of errors per module call, log scale, first divergence marked.

    Exact zeros sit on a bottom line labelled 0; NaN/inf errors on the top edge as crosses.

    Example:
        >>> svg = error_chart([ErrorPoint("a", 1e-7), ErrorPoint("b", 0.5, 0.4, False)], tolerance=1e-3, first=1)
        >>> svg.startswith("<svg"), "first divergence: b" in svg
        (True, True)
    """
    values = [v for p in points for v in (p.error, p.local) if v is not None]
    lo, hi = _log_range(values + ([tolerance] if tolerance else []))
    zero = any(v == 0 for v in values)
    if zero:
        lo -= 1  # exact zeros get their own bottom line, labelled 0
    n = len(points)
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(i: int) -> float:
        return _LEFT + (pw * (i + 0.5) / n if n else pw / 2)

    def y(v: float) -> float:
        if not math.isfinite(v):
            return _TOP
        lv = math.log10(v) if v > 0 else lo
        return _TOP + ph * (hi - min(max(lv, lo), hi)) / (hi - lo)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
             f'aria-label="error per module, log scale" class="errchart" style="min-width:560px">']
    parts += _y_axis(lo, hi, y, pw, y_label, zero)
    if tolerance:
        ty = y(tolerance)
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="{TOL_COLOR}" stroke-dasharray="6 4"/>')
        parts.append(f'<text x="{_LEFT + pw - 4}" y="{ty - 4:.1f}" text-anchor="end" font-size="11" fill="#5d6675">'
                     f"tolerance {tolerance:g}</text>")
    if first is not None:
        parts += _first_marker(x(first), points[first].name, pw)
    parts += _series(points, "local", x, y, LOCAL_COLOR, dashed=True)
    parts += _series(points, "error", x, y, LINE_COLOR, dashed=False)
    parts += _x_labels(points, x, first)
    parts.append("</svg>")
    return "".join(parts)


def _log_range(values: Sequence[float | None]) -> tuple[float, float]:
    pos = [math.log10(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return -8.0, 0.0
    lo, hi = math.floor(min(pos)), math.ceil(max(pos))
    if hi - lo < 2:
        lo, hi = lo - 1, hi + 1
    return float(lo), float(hi)


def _y_axis(lo: float, hi: float, y, pw: float, label: str, zero: bool) -> list[str]:
    out = [f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{_H - _TOP - _BOTTOM}" fill="#fbfcfd" stroke="#dde1e8"/>']
    step = max(1, math.ceil((hi - lo) / 8))
    for e in [*range(int(hi), int(lo), -step), int(lo)]:  # the bottom line (0 when zeros are drawn) always
        yy = y(10.0 ** e)
        text = "0" if zero and e == int(lo) else f"1e{e}"
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eef0f4"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end" font-size="11" fill="#5d6675">{text}</text>')
    mid = _TOP + (_H - _TOP - _BOTTOM) / 2
    out.append(f'<text transform="translate(14 {mid:.0f}) rotate(-90)" text-anchor="middle" font-size="12" fill="#3d4554">'
               f"{esc(label)} (log)</text>")
    return out


def _first_marker(fx: float, name: str, pw: float) -> list[str]:
    anchor = "end" if fx > _LEFT + 0.6 * pw else "start"
    dx = -6 if anchor == "end" else 6
    return [
        f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{_TOP - 6}" y2="{_H - _BOTTOM}" stroke="{FAIL_COLOR}" stroke-width="1.5" '
        'class="first-divergence"/>',
        f'<text x="{fx + dx:.1f}" y="{_TOP - 10}" text-anchor="{anchor}" font-size="12" font-weight="600" fill="{FAIL_COLOR}">'
        f"first divergence: {esc(name)}</text>",
    ]


def _series(points: Sequence[ErrorPoint], key: str, x, y, line_color: str, *, dashed: bool) -> list[str]:
    """Polyline (broken where a value is missing) and markers of one series."""
    out: list[str] = []
    run: list[str] = []
    dash = ' stroke-dasharray="4 3"' if dashed else ""

    def flush() -> None:
        if len(run) > 1:
            out.append(f'<polyline fill="none" stroke="{line_color}" stroke-width="1.2"{dash} points="{" ".join(run)}"/>')
        run.clear()

    for i, p in enumerate(points):
        v = getattr(p, key)
        if v is None:
            flush()
            continue
        run.append(f"{x(i):.1f},{y(v):.1f}")
    flush()
    for i, p in enumerate(points):
        v = getattr(p, key)
        if v is not None:
            out.append(_marker(x(i), y(v), p, v, key))
    return out


def _marker(cx: float, cy: float, p: ErrorPoint, v: float, key: str) -> str:
    what = "local error" if key == "local" else "error"
    tip = f"<title>{esc(p.name)}: {what} {v:.3g}</title>"
    if not math.isfinite(v):
        return (f'<path d="M{cx - 5:.1f},{cy - 5:.1f}L{cx + 5:.1f},{cy + 5:.1f}M{cx - 5:.1f},{cy + 5:.1f}L{cx + 5:.1f},{cy - 5:.1f}" '
                f'stroke="{FAIL_COLOR}" stroke-width="2">{tip}</path>')
    if key == "local":
        return (f'<rect x="{cx - 3.5:.1f}" y="{cy - 3.5:.1f}" width="7" height="7" fill="#fff" stroke="{LOCAL_COLOR}" '
                f'stroke-width="1.5" class="pt-local">{tip}</rect>')
    color = FAIL_COLOR if p.ok is False else PASS_COLOR
    r = 4.5 if p.ok is False else 3.2
    cls = "pt-fail" if p.ok is False else "pt-pass"
    return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r}" fill="{color}" class="{cls}">{tip}</circle>'


def _x_labels(points: Sequence[ErrorPoint], x, first: int | None) -> list[str]:
    n = len(points)
    step = max(1, math.ceil(n / _MAX_TICK_LABELS))
    ticks = set(range(0, n, step))
    if first is not None:
        # the label a reader looks for must not be thinned away; drop its close neighbours instead
        ticks = {t for t in ticks if abs(t - first) >= step} | {first}
    base = _H - _BOTTOM + 12
    out = []
    for i in sorted(ticks):
        name = points[i].name if len(points[i].name) <= 24 else "…" + points[i].name[-23:]
        color = FAIL_COLOR if i == first else "#3d4554"
        out.append(f'<text transform="translate({x(i):.1f} {base}) rotate(-45)" text-anchor="end" font-size="10" '
                   f'fill="{color}">{esc(name)}</text>')
    return out


def histogram(values: np.ndarray, bins: int = 40) -> str:
    """An SVG histogram of the finite values (linear counts), min and max under it.

    Example:
        >>> svg = histogram(np.array([0.0, 1.0, 1.0, np.nan]))
        >>> svg.count("<rect") >= 2
        True
    """
    w, h, pad = 300, 84, 14
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h + pad}" class="hist" role="img" aria-label="value histogram">',
           f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fbfcfd" stroke="#eef0f4"/>']
    if v.size:
        lo, hi = float(v.min()), float(v.max())
        counts, _ = np.histogram(v, bins=bins, range=(lo, hi) if hi > lo else (lo - 0.5, hi + 0.5))
        top = max(1, int(counts.max()))
        bw = w / bins
        for i, c in enumerate(counts):
            if c:
                bh = max(1.0, (h - 4) * c / top)
                out.append(f'<rect x="{i * bw:.1f}" y="{h - bh:.1f}" width="{max(bw - 0.6, 0.6):.1f}" height="{bh:.1f}" '
                           f'fill="{PASS_COLOR}"><title>{c}</title></rect>')
        out.append(f'<text x="0" y="{h + pad - 2}" font-size="10" fill="#5d6675">{lo:.3g}</text>')
        out.append(f'<text x="{w}" y="{h + pad - 2}" font-size="10" text-anchor="end" fill="#5d6675">{hi:.3g}</text>')
        if lo < 0 < hi:
            zx = w * (0 - lo) / (hi - lo)
            out.append(f'<line x1="{zx:.1f}" x2="{zx:.1f}" y1="0" y2="{h}" stroke="#8a8f99" stroke-dasharray="2 2"/>')
    else:
        out.append(f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" font-size="11" fill="#5d6675">no finite values</text>')
    out.append("</svg>")
    return "".join(out)
