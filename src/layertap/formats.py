"""Short text forms of values, shared by terminal tables and HTML pages: floats,
decibels, shapes, pass/fail cells, a ``describe`` structure. Pure Python."""

from __future__ import annotations

import math
import re
from typing import Any


def fmt_float(x: Any) -> str:
    """Short float text: ``1.2e-05``, ``0.031``, ``-`` for missing.

    Example:
        >>> fmt_float(1.23456e-5), fmt_float(None), fmt_float(float("nan"))
        ('1.23e-05', '-', 'nan')
    """
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.3g}"


def fmt_db(x: Any) -> str:
    """Decibels to two decimals, so a value just under a threshold never reads as the threshold.

    Example:
        >>> fmt_db(29.956), fmt_db(None), fmt_db(float("inf"))
        ('29.96', '-', 'inf')
    """
    return "-" if x is None else f"{x:.2f}"


def fmt_shape(shape: Any) -> str:
    """``[1, 3, 'batch']`` -> ``1x3xbatch``; ``None`` -> ``-``."""
    if shape is None:
        return "-"
    if isinstance(shape, str):
        return shape
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def fmt_ok(ok: Any) -> str:
    """Status cell: pass / FAIL / '-' (not compared)."""
    if ok is None:
        return "-"
    return "pass" if ok else "FAIL"


_TENSOR_RE = re.compile(r"Tensor\[([^\]]*)\]")
_CLASS_RE = re.compile(r"\b[A-Za-z_]\w*\(")


def compact_structure(structure: str) -> str:
    """The table's short form of a ``describe`` text: shapes as ``1x16x32`` and no
    class names, keeping the keys that ``[index]`` selectors use.

    Example:
        >>> compact_structure("BaseModelOutput(last_hidden_state=Tensor[1,16,32], pooler_output=Tensor[1,32]:float16)")
        '(last_hidden_state=1x16x32, pooler_output=1x32:float16)'
    """
    text = _TENSOR_RE.sub(lambda m: m.group(1).replace(",", "x") or "scalar", structure)
    return _CLASS_RE.sub("(", text)
