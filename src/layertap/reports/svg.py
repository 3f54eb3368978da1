"""Inline SVG charts: error per module (log scale) and value histograms.

Pure Python + numpy. Charts use a fixed viewBox and scale to their box; each
point carries a ``<title>`` so hovering names the module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..comparing.words import tick_indices  # the --plot PNG thins its labels the same way
from .html import esc

if TYPE_CHECKING:  # pragma: no cover - the points come from the compare wing; histograms need none of it
    from ..comparing.words import ErrorPoint

PASS_COLOR, FAIL_COLOR, LOCAL_COLOR, TOL_COLOR, LINE_COLOR = "#2f6fd0", "#c0262d", "#e07b00", "#8a8f99", "#b7bdc8"
BAND_COLOR = "#d6efd8"  # what the candidate's format explains (judged at its precision)
_W, _H = 960, 340
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 34, 96
_MAX_TICK_LABELS = 32
_VW, _VNAME, _VROW, _VTOP = 380, 170, 16, 36  # the phone chart: width, name column, px per row, top margin


@dataclass(frozen=True)
class Axis:
    """How the error axis reads: its label, each decade's tick text (``10**e -> text``) and the
    threshold line's label (``None``: ``tolerance VALUE``)."""

    label: str = "relative error (log)"
    tick: Callable[[int], str] | None = None
    threshold: str | None = None

    def tick_text(self, e: int) -> str:
        return self.tick(e) if self.tick is not None else f"1e{e}"

    def threshold_text(self, tolerance: float) -> str:
        return self.threshold or f"tolerance {tolerance:g}"


def error_chart(points: Sequence[ErrorPoint], *, tolerance: float | None, first: int | None,
                y_label: str = "relative error", axis: Axis | None = None) -> str:
    """An SVG line chart of errors per module call, log scale, first divergence marked.

    Exact zeros sit on a bottom line labelled 0; NaN/inf errors on the top edge as crosses.

    Example:
        >>> from layertap.comparing.words import ErrorPoint
        >>> svg = error_chart([ErrorPoint("a", 1e-7), ErrorPoint("b", 0.5, 0.4, False)], tolerance=1e-3, first=1)
        >>> svg.startswith("<svg"), "first divergence: b" in svg
        (True, True)
    """
    axis = axis or Axis(f"{y_label} (log)")
    lo, hi, zero = _scale(points, tolerance)
    n = len(points)
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(i: int) -> float:
        return _LEFT + (pw * (i + 0.5) / n if n else pw / 2)

    def y(v: float) -> float:
        return _TOP + ph * (1 - _frac(v, lo, hi))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
             f'aria-label="error per module, log scale" class="errchart" style="min-width:560px">']
    parts += _y_axis(lo, hi, y, pw, axis, zero)
    parts += _band(points, lambda i, v: (x(i), y(v)), (x(0) - pw / n / 2 if n else _LEFT, y(10.0 ** lo)), vertical=False)
    if tolerance:
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y(tolerance):.1f}" y2="{y(tolerance):.1f}" '
                     f'stroke="{TOL_COLOR}" stroke-dasharray="6 4"/>')
    if first is not None:
        parts += _first_marker(x(first), points[first].name, pw)
    parts += _series(points, "local", lambda i, v: (x(i), y(v)), LOCAL_COLOR, dashed=True)
    parts += _series(points, "error", lambda i, v: (x(i), y(v)), LINE_COLOR, dashed=False)
    if tolerance:  # over the points, on a white halo, so they never hide it
        parts.append(f'<text x="{_LEFT + pw - 4}" y="{y(tolerance) - 5:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#5d6675" stroke="#fff" stroke-width="3" paint-order="stroke" '
                     f'class="threshold">{esc(axis.threshold_text(tolerance))}</text>')
    parts += _x_labels(points, x, first)
    parts.append("</svg>")
    return "".join(parts)


def error_chart_vertical(points: Sequence[ErrorPoint], *, tolerance: float | None, first: int | None,
                         axis: Axis | None = None) -> str:
    """The same chart for a phone: one line per module call down the page, its name on the
    left, the error across (log scale); every name is shown, at a readable size.

    Example:
        >>> from layertap.comparing.words import ErrorPoint
        >>> svg = error_chart_vertical([ErrorPoint("a", 1e-7), ErrorPoint("b", 0.5, None, False)], tolerance=1e-3,
        ...                            first=1, axis=Axis(threshold="rtol 0.001"))
        >>> "errchart-v" in svg, "rtol 0.001" in svg, svg.count("<circle")
        (True, True, 2)
    """
    axis = axis or Axis()
    lo, hi, zero = _scale(points, tolerance)
    n = len(points)
    pw = _VW - _VNAME - 14
    top, height = _VTOP, _VTOP + _VROW * n + 24

    def x(v: float) -> float:
        return _VNAME + pw * _frac(v, lo, hi)

    def y(i: int) -> float:
        return top + _VROW * (i + 0.5)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_VW} {height}" role="img" '
             f'aria-label="error per module, log scale" class="errchart-v">',
             f'<text x="{_VNAME + pw / 2:.0f}" y="13" text-anchor="middle" font-size="11" fill="#3d4554">'
             f"{esc(axis.label)}</text>"]
    if first is not None:
        parts.append(f'<rect x="0" y="{top + _VROW * first:.1f}" width="{_VW}" height="{_VROW}" fill="#fbdcdc" '
                     'class="first-divergence"/>')
    parts.append(f'<rect x="{_VNAME}" y="{top}" width="{pw}" height="{_VROW * n}" fill="none" stroke="#dde1e8"/>')
    parts += _band(points, lambda i, v: (x(v), y(i)), (x(10.0 ** lo), top), vertical=True)
    for e in _decades(lo, hi, 4):
        xx = x(10.0 ** e)
        text = "0" if zero and e == int(lo) else axis.tick_text(e)
        parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + _VROW * n}" stroke="#eef0f4"/>')
        parts.append(f'<text x="{xx:.1f}" y="{top - 5}" text-anchor="middle" font-size="10" fill="#5d6675">{esc(text)}</text>')
    if tolerance:
        tx = x(tolerance)
        parts.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{top}" y2="{top + _VROW * n}" stroke="{TOL_COLOR}" '
                     'stroke-dasharray="5 3"/>')
        parts.append(f'<text x="{_VW - 4}" y="{top + _VROW * n + 16}" text-anchor="end" font-size="11" fill="#5d6675" '
                     f'class="threshold">{esc(axis.threshold_text(tolerance))}</text>')
    for i, p in enumerate(points):
        name = p.name if len(p.name) <= 26 else "…" + p.name[-25:]
        style = f' fill="{FAIL_COLOR}" font-weight="600"' if i == first else ' fill="#3d4554"'
        parts.append(f'<text x="{_VNAME - 5}" y="{y(i) + 3.5:.1f}" text-anchor="end" font-size="10.5"{style}>'
                     f"{esc(name)}</text>")
    parts += _series(points, "local", lambda i, v: (x(v), y(i)), LOCAL_COLOR, dashed=True)
    parts += _series(points, "error", lambda i, v: (x(v), y(i)), LINE_COLOR, dashed=False)
    parts.append("</svg>")
    return "".join(parts)


def _band(points: Sequence[ErrorPoint], at: Callable[[int, float], tuple[float, float]], base: tuple[float, float], *,
          vertical: bool) -> list[str]:
    """The shaded area under each point's ``band`` (what the candidate's format explains there), a step
    per module call; nothing when no point has one."""
    if not any(p.band is not None for p in points):
        return []
    out = []
    for i, p in enumerate(points):
        if p.band is None or not math.isfinite(p.band):
            continue
        cx, cy = at(i, p.band)
        if vertical:
            out.append(f'<rect x="{base[0]:.1f}" y="{cy - _VROW / 2:.1f}" width="{max(cx - base[0], 0):.1f}" height="{_VROW}" '
                       f'fill="{BAND_COLOR}" class="band"/>')
        else:
            half = (at(1, p.band)[0] - at(0, p.band)[0]) / 2 if len(points) > 1 else 8
            out.append(f'<rect x="{cx - half:.1f}" y="{cy:.1f}" width="{2 * half:.1f}" height="{max(base[1] - cy, 0):.1f}" '
                       f'fill="{BAND_COLOR}" class="band"/>')
    return out


def _scale(points: Sequence[ErrorPoint], tolerance: float | None) -> tuple[float, float, bool]:
    """Decades shown (low, high) and whether exact zeros get their own line below them."""
    values = [v for p in points for v in (p.error, p.local, p.band) if v is not None]
    lo, hi = _log_range(values + ([tolerance] if tolerance else []))
    zero = any(v == 0 for v in values)
    return (lo - 1 if zero else lo), hi, zero  # exact zeros get their own bottom line, labelled 0


def _decades(lo: float, hi: float, most: int) -> list[int]:
    """At most about ``most`` labelled decades from ``hi`` down, evenly spaced, and always the
    bottom one (``0`` when zeros are drawn); a decade too close above the bottom gives way.

    Example:
        >>> _decades(-7, 0, 4)
        [0, -2, -4, -7]
    """
    step = max(1, math.ceil((hi - lo) / most))
    out = list(range(int(hi), int(lo), -step))
    if out and out[-1] - lo < step:
        out.pop()
    return [*out, int(lo)]


def _frac(v: float, lo: float, hi: float) -> float:
    """Where ``v`` sits between decades ``lo`` and ``hi`` (0..1); NaN/inf at the top."""
    if not math.isfinite(v):
        return 1.0
    lv = math.log10(v) if v > 0 else lo
    return (min(max(lv, lo), hi) - lo) / (hi - lo)


def _log_range(values: Sequence[float | None]) -> tuple[float, float]:
    pos = [math.log10(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return -8.0, 0.0
    lo, hi = math.floor(min(pos)), math.ceil(max(pos))
    if hi - lo < 2:
        lo, hi = lo - 1, hi + 1
    return float(lo), float(hi)


def _y_axis(lo: float, hi: float, y: Callable[[float], float], pw: float, axis: Axis, zero: bool) -> list[str]:
    out = [f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{_H - _TOP - _BOTTOM}" fill="#fbfcfd" stroke="#dde1e8"/>']
    for e in _decades(lo, hi, 8):
        yy = y(10.0 ** e)
        text = "0" if zero and e == int(lo) else axis.tick_text(e)
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eef0f4"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end" font-size="10" fill="#5d6675">{esc(text)}</text>')
    mid = _TOP + (_H - _TOP - _BOTTOM) / 2
    out.append(f'<text transform="translate(11 {mid:.0f}) rotate(-90)" text-anchor="middle" font-size="12" fill="#3d4554">'
               f"{esc(axis.label)}</text>")
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


def _series(points: Sequence[ErrorPoint], key: str, at: Callable[[int, float], tuple[float, float]],
            line_color: str, *, dashed: bool) -> list[str]:
    """Polyline (broken where a value is missing) and markers of one series; ``at(i, v)`` places a point."""
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
        cx, cy = at(i, v)
        run.append(f"{cx:.1f},{cy:.1f}")
    flush()
    for i, p in enumerate(points):
        v = getattr(p, key)
        if v is not None:
            out.append(_marker(*at(i, v), p, v, key))
    return out


def _marker(cx: float, cy: float, p: ErrorPoint, v: float, key: str) -> str:
    if key == "local":
        what = f"local error {v:.3g}"
    else:
        what = p.text or f"error {v:.3g}"
    tip = f"<title>{esc(p.name)}: {esc(what)}</title>"
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


def _x_labels(points: Sequence[ErrorPoint], x: Callable[[int], float], first: int | None) -> list[str]:
    base = _H - _BOTTOM + 12
    out = []
    for i in tick_indices(len(points), first, _MAX_TICK_LABELS):
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
