"""``--plot``: error per module call in execution order, as a PNG.

matplotlib is imported here only (Agg backend: no display needed) and draws the
chart; its pixels are written by the one PNG writer (files/png.py), atomically.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LayertapError
from ..files.png import encode_png
from ..files.writes import atomic_write_bytes, check_output_path
from .words import band_text, chart_points, tick_indices

# Errors of exactly 0 cannot sit on a log axis; they are drawn at this floor.
_FLOOR = 1e-12
_MAX_LABELS = 40


def write_plot(report: Any, path: str | os.PathLike) -> None:
    """Draw the deciding value of every compared call (log scale: ``rel_err``, ``1 - cosine`` or the
    noise power of the SQNR) with its threshold and the first divergence; labels thinned like the
    HTML chart's, so they never overlap.

    Example:
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> import tempfile, os
        >>> r = CompareReport([CompareRow("fc", "fc", 0, "Linear", [1], 1e-6, 1e-7, "pass", True)])
        >>> p = os.path.join(tempfile.mkdtemp(), "e.png")
        >>> write_plot(r, p); os.path.getsize(p) > 0
        True
    """
    out = check_output_path(path, suffixes=(".png",))
    fig = plot_figure(report)  # refuses first when matplotlib is missing
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3]  # an opaque white figure: alpha is 255 everywhere
    atomic_write_bytes(out, encode_png(pixels))


def plot_figure(report: Any) -> Any:
    """The matplotlib ``Figure`` :func:`write_plot` saves (Agg backend, no display needed)."""
    try:
        import matplotlib
    except ImportError:
        raise LayertapError("--plot needs matplotlib; pip install matplotlib") from None
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    metric = report.criterion.metric
    rows, points, threshold = chart_points(report, metric, with_local=False)
    xs = list(range(len(rows)))
    ys = [max(p.error, _FLOOR) if p.error is not None and math.isfinite(p.error) else float("nan") for p in points]
    first = report.first_divergence_row
    fx = next((i for i, r in enumerate(rows) if r is first), None)
    ticks = tick_indices(len(rows), fx, _MAX_LABELS)
    # about a sixth of an inch per label, so rotated names never overlap
    fig = Figure(figsize=(max(8.0, min(0.17 * len(ticks) + 1.5, 40.0)), 5.2), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_yscale("log")
    ok_x = [x for x, r in zip(xs, rows) if r.ok is not False]
    ok_y = [ys[x] for x in ok_x]
    bad_x = [x for x, r in zip(xs, rows) if r.ok is False]
    bad_y = [ys[x] if math.isfinite(ys[x]) else 1.0 for x in bad_x]
    bands = [p.band for p in points]
    if any(b is not None for b in bands):  # judged at the candidate's precision: what its format explains
        seen = [v for v in (*ys, *bands) if v is not None and math.isfinite(v) and v > _FLOOR]
        bottom = min(seen) / 10 if seen else _FLOOR
        ax.fill_between(xs, [max(b, bottom) if b is not None and math.isfinite(b) else float("nan") for b in bands],
                        bottom, step="mid", color="#d6efd8", zorder=0, label=band_text(report))
        ax.set_ylim(bottom=bottom)
    ax.plot(xs, ys, color="0.7", linewidth=0.8, zorder=1)
    ax.scatter(ok_x, ok_y, s=12, color="tab:blue", label="pass", zorder=2)
    if bad_x:
        ax.scatter(bad_x, bad_y, s=16, color="tab:red", label="FAIL", zorder=3)
    if threshold:
        ax.axhline(threshold, color="tab:orange", linestyle="--", linewidth=1, label=report.threshold_text)
    if fx is not None:
        ax.axvline(fx, color="tab:red", linewidth=1.2)
        ax.annotate(
            f"first divergence: {rows[fx].name}",
            xy=(fx, bad_y[bad_x.index(fx)] if fx in bad_x else (threshold or 1.0)),
            xytext=(6, -28), textcoords="offset points", color="tab:red", fontsize=9,
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85),  # readable over the FAIL points
        )
    ax.set_xticks(ticks)
    ax.set_xticklabels([rows[x].name for x in ticks], rotation=90, fontsize=7)
    for x, label in zip(ticks, ax.get_xticklabels()):
        if x == fx:
            label.set_color("tab:red")
    _label_axes(ax, report, metric)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def _label_axes(ax: "Any", report: Any, metric: str) -> None:
    """Axis labels and title in the metric's units; cosine ticks read 0.999, SQNR ticks 30 dB."""
    from matplotlib.ticker import FuncFormatter

    if metric == "cosine":
        ax.set_ylabel("cosine similarity (log scale of 1 - cosine)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{1 - v:.{max(0, -math.floor(math.log10(v)))}f}"
                                                   if 0 < v < 1 else f"{1 - v:g}"))
    elif metric == "sqnr":
        ax.set_ylabel("SQNR (dB)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{-10 * math.log10(v):g} dB" if v > 0 else ""))
    elif getattr(report, "judged_at_format", False):
        ax.set_ylabel(f"max|cand - ideal {report.precision} run| / max|ref|")
    else:
        ax.set_ylabel("max|cand - ref| / max|ref|" if report.reference else "max|cand - torch| / max|torch|")
    ax.set_xlabel(f"module call, {'reference' if report.reference else 'PyTorch'} execution order")

    vs = (f"{Path(report.reference).name} vs {Path(report.onnx_path or '?').name}" if report.reference
          else "PyTorch vs ONNX Runtime")
    ax.set_title(f"{vs}: error per module" + ("" if report.ok else " (diverges)"), fontsize=11)
