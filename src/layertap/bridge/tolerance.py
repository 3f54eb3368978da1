"""The one error statistic layertap uses for every PyTorch vs ONNX check.

Both ``lt.export``'s verification and ``lt.compare`` judge an ONNX Runtime
value ``got`` against its PyTorch reference ``ref`` (same shape) by::

    max_abs = max |got - ref|
    scale   = max |ref|
    rel_err = max_abs / scale          (0 when both are 0; inf when only ref is 0)
    pass   <=> max_abs <= atol + rtol * scale

``rel_err`` is relative to the reference tensor's largest magnitude, not
element-wise: an element-wise relative error explodes on values near zero
(FIELD-NOTES: 762 on a ReLU output that is right to float rounding), while
this one stays comparable across layers and matches how float32 rounding
actually accumulates. ``atol`` only matters for tensors that are (almost)
all zero. NaN in both at the same place counts as equal, as do equal
infinities; any other NaN/inf mismatch is an infinite error. Integer and
bool values must match exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-5


@dataclass(frozen=True)
class ErrorStats:
    """Error of one ONNX tensor against its PyTorch reference."""

    max_abs: float
    scale: float
    rel_err: float
    ok: bool


def error_stats(ref: np.ndarray, got: np.ndarray, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> ErrorStats:
    """Compare ``got`` (ONNX) with ``ref`` (PyTorch), same shape.

    Example:
        >>> s = error_stats(np.array([0.0, 2.0]), np.array([1e-4, 2.0]))
        >>> (s.max_abs, s.rel_err, s.ok)
        (0.0001, 5e-05, True)
        >>> error_stats(np.array([1, 2]), np.array([1, 3])).ok
        False
    """
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.dtype == np.bool_ or got.dtype == np.bool_:
        ref, got = ref.astype(np.int8), got.astype(np.int8)
    exact = not (np.issubdtype(ref.dtype, np.floating) or np.issubdtype(ref.dtype, np.complexfloating))
    if ref.size and ref.dtype == got.dtype and ref.dtype in (np.float32, np.float64):
        # Fast path (most calls): no NaN/inf anywhere, so plain reductions suffice.
        diff = np.abs(np.subtract(ref, got))
        max_abs = float(diff.max())
        scale = float(np.abs(ref).max())
        if math.isfinite(max_abs) and math.isfinite(scale):
            return ErrorStats(max_abs, scale, _rel(max_abs, scale), bool(max_abs <= atol + rtol * scale))
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(got, dtype=np.float64)
    if a.size == 0:
        return ErrorStats(0.0, 0.0, 0.0, True)
    finite = np.isfinite(a) & np.isfinite(b)
    special_ok = bool(np.all(finite | (a == b) | (np.isnan(a) & np.isnan(b))))
    diff = np.abs(a[finite] - b[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    if not special_ok:
        max_abs = math.inf
    fa = np.abs(a[np.isfinite(a)])
    scale = float(fa.max()) if fa.size else 0.0
    ok = max_abs == 0.0 if exact else max_abs <= atol + rtol * scale
    return ErrorStats(max_abs, scale, _rel(max_abs, scale), bool(ok))


def _rel(max_abs: float, scale: float) -> float:
    if scale > 0:
        return max_abs / scale
    return 0.0 if max_abs == 0 else math.inf
