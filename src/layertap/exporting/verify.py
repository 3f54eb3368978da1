"""Numbers for export verification: per-output checks and the report (numpy only).

Each output is judged with :func:`layertap.metrics.error_stats`, the
statistic ``lt.compare`` uses too: pass when
``max|onnx - torch| <= atol + rtol * max|torch|``; ``rel_err`` is
``max|onnx - torch| / max|torch|``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..metrics import error_stats
from ..tables import Column, ToleranceReport
from ..text import fmt_float, fmt_ok, fmt_shape


def _has_special(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" and not bool(np.isfinite(a).all())


@dataclass
class Check:
    """One output compared on one set of inputs."""

    batch: dict[str, int]
    shape: list[int] | None
    max_abs: float | None
    rel_err: float | None
    ok: bool
    problem: str | None = None


def check_output(ort: Any, ref: Any, *, rtol: float, atol: float, batch: dict[str, int]) -> Check:
    """Compare one ONNX Runtime output with its PyTorch value.

    Example:
        >>> c = check_output(np.array([1.0, 0.0]), np.array([1.0, 1e-7]), rtol=1e-3, atol=1e-4, batch={"x": 2})
        >>> c.ok, c.max_abs, c.rel_err
        (True, 1e-07, 1e-07)
    """
    a = np.asarray(ort)
    b = np.asarray(ref)
    if a.shape != b.shape:
        return Check(batch, list(a.shape), None, None, False, f"shape {list(a.shape)} != PyTorch {list(b.shape)}")
    stats = error_stats(b, a, rtol=rtol, atol=atol)
    problem = None if math.isfinite(stats.max_abs) else "NaN or inf where PyTorch has a different value"
    if problem is None and _has_special(b):
        problem = "PyTorch's values hold inf or NaN (ONNX Runtime gives the same ones)"
    return Check(batch, list(a.shape), stats.max_abs, stats.rel_err, stats.ok, problem)


@dataclass
class ExportRow:
    """One graph output of an exported model.

    ``max_abs``/``rel_err`` are the worst over every check; ``checks`` holds
    one entry per set of inputs run (per batch size).
    """

    name: str
    source: str
    shape: list | None
    dtype: str
    max_abs: float | None = None
    rel_err: float | None = None
    ok: bool | None = None
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        self.ok = (self.ok is not False) and check.ok
        self.max_abs = _worst(self.max_abs, check.max_abs)
        self.rel_err = _worst(self.rel_err, check.rel_err)

    @property
    def origin(self) -> str:
        """The selector, shown only when it differs from the name (an alias)."""
        return "" if self.source == self.name else self.source

    @property
    def problem(self) -> str | None:
        """The first thing that went wrong beyond a number (shape, NaN, ORT refusing to run)."""
        return next((c.problem for c in self.checks if c.problem), None)

    @property
    def batches(self) -> str:
        """The batch sizes run, each once (another sequence length or a decode step runs the same batch)."""
        return ", ".join(dict.fromkeys(_batch_text(c.batch) for c in self.checks)) or "-"


def _worst(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    if old is None or np.isnan(new) or new > old:
        return new
    return old


def _batch_text(batch: dict[str, int]) -> str:
    sizes = list(dict.fromkeys(batch.values()))
    if len(sizes) == 1:
        return str(sizes[0])
    return "/".join(str(v) for v in batch.values())


class ExportReport(ToleranceReport):
    """What ``lt.export`` returns: one row per graph output, in graph order.

    Attributes:
        path: the written ONNX file.
        exporter: ``"dynamo"`` or ``"torchscript"`` (the one that produced the file).
        inputs: graph input names with their declared shapes.
        rtol, atol: the tolerances used.
        verified: False when ``verify=False`` (rows then have ``ok=None``).
        runtime: the runtime the file was checked in (its name heads the table).

    Example:
        >>> import layertap as lt
        >>> row = ExportRow("output", "output", [1, 3], "float32")
        >>> report = lt.ExportReport([row], path="m.onnx", exporter="dynamo", inputs={"x": [1, 4]},
        ...                          rtol=1e-3, atol=1e-5, verified=False)
        >>> report.exporter, [r.name for r in report.rows], report.rows[0].ok
        ('dynamo', ['output'], None)
    """

    title = "Export verification (ONNX Runtime vs PyTorch)"
    columns = (
        Column("name", "Output", name=True),
        Column("origin", "From", name=True, drop=2),
        Column("shape", "Shape", fmt_shape, no_wrap=True),
        Column("batches", "Batches", justify="right", drop=4),
        Column("max_abs", "Max abs", fmt_float, "right", drop=1),
        Column("rel_err", "Rel err", fmt_float, "right", drop=3),
        Column("ok", "Result", fmt_ok),
    )

    def __init__(self, rows, *, path: str, exporter: str, inputs: dict, rtol: float, atol: float,
                 verified: bool, notes=(), runtime: str = "ONNX Runtime") -> None:
        super().__init__(rows, notes, rtol=rtol, atol=atol)
        self.title = f"Export verification ({runtime} vs PyTorch)"  # the runtime the file was checked in
        self.path = path
        self.exporter = exporter
        self.inputs = inputs
        self.verified = verified

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(path=self.path, exporter=self.exporter, inputs=self.inputs, verified=self.verified)
        return out

    def footer(self) -> list[str]:
        lines = list(self.notes)
        lines.append(f"wrote {self.path} ({self.exporter} exporter)")
        if not self.verified:
            lines.append("not verified (--no-verify)")
            return lines
        fails = self.failures
        tol = f"rtol={self.rtol:g}, atol={self.atol:g}: pass when max abs <= atol + rtol x max|value|"
        for problem in dict.fromkeys(r.problem for r in self.rows if r.problem):  # passing rows may have notes
            names = [r.name for r in self.rows if r.problem == problem]
            lines.append(f"{_names_text(names)}: {problem}")
        if fails:
            lines.append(f"{len(fails)} of {len(self.rows)} outputs FAILED ({tol}): " + ", ".join(r.name for r in fails))
        else:
            what = "the output matches" if len(self.rows) == 1 else f"all {len(self.rows)} outputs match"
            lines.append(f"{what} PyTorch ({tol})")
        return lines


def _names_text(names: list[str], show: int = 3) -> str:
    """``a, b, c`` or ``a, b, c and 4 more``."""
    head = ", ".join(names[:show])
    return head if len(names) <= show else f"{head} and {len(names) - show} more"
