"""Numbers for export verification: error measures and the report (numpy only).

Errors of one output, ONNX Runtime value ``a`` against PyTorch value ``b``::

    err_i   = |a_i - b_i|
    scale_i = max(|b_i|, REL_FLOOR * max_j |b_j|)
    max_abs = max_i err_i
    max_rel = max_i err_i / scale_i
    pass   <=> err_i <= atol + rtol * scale_i   for every i

The floor on the denominator keeps the relative error meaningful near zero:
a plain ``err / |b|`` reports errors in the hundreds on ReLU outputs that are
exactly right up to float rounding (FIELD-NOTES: 762 on a resnet50 ReLU).
NaN in both at the same place counts as equal; integer and bool outputs must
match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..report import Column, Report, fmt_float, fmt_ok, fmt_shape

#: fraction of a tensor's largest magnitude below which |b| is not trusted as a scale
REL_FLOOR = 1e-3
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-4


@dataclass
class Check:
    """One output compared on one set of inputs."""

    batch: dict[str, int]
    shape: list[int] | None
    max_abs: float | None
    max_rel: float | None
    ok: bool
    problem: str | None = None


def compare(ort: Any, ref: Any, *, rtol: float, atol: float, batch: dict[str, int]) -> Check:
    """Compare two arrays as described in the module docstring.

    Example:
        >>> c = compare(np.array([1.0, 0.0]), np.array([1.0, 1e-7]), rtol=1e-3, atol=1e-4, batch={"x": 2})
        >>> c.ok, c.max_abs, round(c.max_rel, 6)
        (True, 1e-07, 0.0001)
    """
    a = np.asarray(ort)
    b = np.asarray(ref)
    if a.shape != b.shape:
        return Check(batch, list(a.shape), None, None, False, f"shape {list(a.shape)} != PyTorch {list(b.shape)}")
    if a.size == 0:
        return Check(batch, list(a.shape), 0.0, 0.0, True)
    if not (np.issubdtype(b.dtype, np.floating) or np.issubdtype(b.dtype, np.complexfloating)):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        worst = float(diff.max())
        return Check(batch, list(a.shape), worst, worst, worst == 0.0)
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if (nan_a != nan_b).any():
        return Check(batch, list(a.shape), float("nan"), float("nan"), False, "NaN where PyTorch has a number (or back)")
    a64 = np.where(nan_a, 0.0, a64)
    b64 = np.where(nan_b, 0.0, b64)
    err = np.abs(a64 - b64)
    err = np.where(np.isinf(a64) & np.isinf(b64) & (a64 == b64), 0.0, err)
    mag = np.abs(b64)
    finite = mag[np.isfinite(mag)]
    top = float(finite.max()) if finite.size else 0.0
    scale = np.maximum(mag, max(REL_FLOOR * top, np.finfo(np.float64).tiny))
    ok = bool((err <= atol + rtol * scale).all())
    return Check(batch, list(a.shape), float(err.max()), float((err / scale).max()), ok)


@dataclass
class ExportRow:
    """One graph output of an exported model.

    ``max_abs``/``max_rel`` are the worst over every check; ``checks`` holds
    one entry per set of inputs run (per batch size).
    """

    name: str
    source: str
    shape: list | None
    dtype: str
    max_abs: float | None = None
    max_rel: float | None = None
    ok: bool | None = None
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        self.ok = (self.ok is not False) and check.ok
        self.max_abs = _worst(self.max_abs, check.max_abs)
        self.max_rel = _worst(self.max_rel, check.max_rel)

    @property
    def origin(self) -> str:
        """The selector, shown only when it differs from the name (an alias)."""
        return "" if self.source == self.name else self.source

    @property
    def batches(self) -> str:
        return ", ".join(_batch_text(c.batch) for c in self.checks) or "-"


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


class ExportReport(Report):
    """What ``lt.export`` returns: one row per graph output, in graph order.

    Attributes:
        path: the written ONNX file.
        exporter: ``"dynamo"`` or ``"torchscript"`` (the one that produced the file).
        inputs: graph input names with their declared shapes.
        rtol, atol: the tolerances used.
        verified: False when ``verify=False`` (rows then have ``ok=None``).
    """

    title = "export verification (ONNX Runtime vs PyTorch)"
    columns = (
        Column("name", "output"),
        Column("origin", "from"),
        Column("shape", "onnx shape", fmt_shape),
        Column("batches", "batches", justify="right"),
        Column("max_abs", "max abs", fmt_float, "right"),
        Column("max_rel", "max rel", fmt_float, "right"),
        Column("ok", "result", fmt_ok),
    )

    def __init__(self, rows, *, path: str, exporter: str, inputs: dict, rtol: float, atol: float,
                 verified: bool, notes=()) -> None:
        super().__init__(rows, notes)
        self.path = path
        self.exporter = exporter
        self.inputs = inputs
        self.rtol = rtol
        self.atol = atol
        self.verified = verified

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(path=self.path, exporter=self.exporter, inputs=self.inputs, verified=self.verified,
                   rtol=self.rtol, atol=self.atol)
        return out

    def footer(self) -> list[str]:
        lines = list(self.notes)
        lines.append(f"wrote {self.path} ({self.exporter} exporter)")
        if not self.verified:
            lines.append("not verified (--no-verify)")
            return lines
        fails = self.failures
        tol = f"rtol={self.rtol:g}, atol={self.atol:g}, rel. error floor {REL_FLOOR:g} x max|value|"
        if fails:
            lines.append(f"{len(fails)} of {len(self.rows)} outputs FAILED ({tol}): " + ", ".join(r.name for r in fails))
        else:
            lines.append(f"all {len(self.rows)} outputs match PyTorch ({tol})")
        return lines
