"""``--plot``: error per module call in execution order, as a PNG.

matplotlib is imported here only (Agg backend: no display needed), and the
file is written atomically.
"""

from __future__ import annotations

import io
import math
import os
from typing import TYPE_CHECKING

from ...errors import LayertapError
from ...files import atomic_write_bytes, check_output_path

if TYPE_CHECKING:  # pragma: no cover
    from .report import CompareReport

# Errors of exactly 0 cannot sit on a log axis; they are drawn at this floor.
_FLOOR = 1e-12
_MAX_LABELS = 40


def write_plot(report: "CompareReport", path: str | os.PathLike) -> None:
    """Draw ``rel_err`` of every compared call (log scale) with the tolerance and the first divergence.

    Example:
        >>> from layertap.bridge.compare import CompareReport, CompareRow
        >>> import tempfile, os
        >>> r = CompareReport([CompareRow("fc", "fc", 0, "Linear", [1], 1e-6, 1e-7, "pass", True)])
        >>> p = os.path.join(tempfile.mkdtemp(), "e.png")
        >>> write_plot(r, p); os.path.getsize(p) > 0
        True
    """
    out = check_output_path(path, suffixes=(".png",))
    try:
        import matplotlib
    except ImportError:
        raise LayertapError("--plot needs matplotlib; pip install matplotlib") from None
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    rows = [r for r in report.rows if r.rel_err is not None]
    xs = list(range(len(rows)))
    ys = [max(r.rel_err, _FLOOR) if math.isfinite(r.rel_err) else float("nan") for r in rows]
    fig = Figure(figsize=(max(8.0, min(0.12 * len(rows), 40.0)), 4.8), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_yscale("log")
    ok_x = [x for x, r in zip(xs, rows) if r.ok is not False]
    ok_y = [ys[x] for x in ok_x]
    bad_x = [x for x, r in zip(xs, rows) if r.ok is False]
    bad_y = [ys[x] if math.isfinite(ys[x]) else 1.0 for x in bad_x]
    ax.plot(xs, [y if math.isfinite(y) else float("nan") for y in ys], color="0.7", linewidth=0.8, zorder=1)
    ax.scatter(ok_x, ok_y, s=12, color="tab:blue", label="pass", zorder=2)
    if bad_x:
        ax.scatter(bad_x, bad_y, s=16, color="tab:red", label="FAIL", zorder=3)
    ax.axhline(report.rtol, color="tab:orange", linestyle="--", linewidth=1, label=f"rtol {report.rtol:g}")
    first = report.first_divergence_row
    if first is not None and first in rows:
        fx = rows.index(first)
        ax.axvline(fx, color="tab:red", linewidth=1.2)
        ax.annotate(
            f"first divergence: {first.name}",
            xy=(fx, bad_y[bad_x.index(fx)] if fx in bad_x else report.rtol),
            xytext=(6, -28), textcoords="offset points", color="tab:red", fontsize=9,
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85),  # readable over the FAIL points
        )
    step = max(1, math.ceil(len(rows) / _MAX_LABELS))
    ticks = set(xs[::step])
    if first is not None and first in rows:
        ticks.add(rows.index(first))  # the one label a reader looks for must not be thinned away
    ticks_sorted = sorted(ticks)
    ax.set_xticks(ticks_sorted)
    ax.set_xticklabels([rows[x].name for x in ticks_sorted], rotation=90, fontsize=7)
    ax.set_ylabel("max|onnx - torch| / max|torch|")
    ax.set_xlabel("module call, PyTorch execution order")
    ax.set_title("PyTorch vs ONNX Runtime: error per module" + ("" if report.ok else " (diverges)"))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(out, buf.getvalue())
