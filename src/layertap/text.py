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


def field(row: Any, key: str, default: Any = None) -> Any:
    """A row's field whether the row is a dataclass or a dict (rows of any report version).

    Example:
        >>> field({"name": "fc"}, "name"), field({"name": "fc"}, "ok", "?")
        ('fc', '?')
    """
    return row.get(key, default) if isinstance(row, dict) else getattr(row, key, default)


def token_grid(rows: Any, limit: int = 40) -> tuple[list[str], list[tuple[str, list[tuple[float | None, bool | None]]]]]:
    """A layer x token grid of compare rows that carry token positions (``steps=``): the column
    names (token positions, the prompt's as ``FIRST..LAST``), then per module path its
    ``(rel_err, ok)`` per column. Decoder layers (paths ending in a layer number) and the model
    output are the grid's rows; without compared layers, every compared path (at most ``limit``).
    Rows are read by field name (``path``, ``token``, ``tokens``, ``rel_err``, ``ok``).

    Example:
        >>> from types import SimpleNamespace as R
        >>> rows = [R(path="m.layers.0", token=0, tokens=3, rel_err=1e-7, ok=True),
        ...         R(path="m.layers.0", token=3, tokens=1, rel_err=0.2, ok=False), R(path="m.act", token=3, tokens=1,
        ...         rel_err=0.1, ok=False)]
        >>> token_grid(rows)
        (['0..2', '3'], [('m.layers.0', [(1e-07, True), (0.2, False)])])
        >>> token_grid([R(path="m.layers.0", token=None, tokens=None, rel_err=0.0, ok=True)])
        ([], [])
    """
    stepped = [(field(r, "path"), field(r, "token"), field(r, "tokens") or 1, field(r, "rel_err"), field(r, "ok"))
               for r in rows if field(r, "token") is not None]
    columns: dict[int, str] = {}
    for _, token, n, _, _ in stepped:
        columns.setdefault(token, f"{token}..{token + n - 1}" if n > 1 else str(token))
    compared = list(dict.fromkeys(path for path, _, _, _, ok in stepped if ok is not None))
    layers = [p for p in compared if p == "" or re.search(r"\.\d+$", p)]
    paths = layers if any(p for p in layers) else compared[:limit]
    cells: dict[tuple[str, int], tuple[float | None, bool | None]] = {}
    for path, token, _, rel, ok in stepped:
        if path in paths and ok is not None:
            cells.setdefault((path, token), (rel, ok))
    order = sorted(columns)
    grid = [(p or "output", [cells.get((p, t), (None, None)) for t in order]) for p in paths]
    return [columns[t] for t in order], grid


def grid_lines(rows: Any) -> list[str]:
    """:func:`token_grid` as terminal text: rel err per module and token, ``!`` after a failing cell.

    Example:
        >>> from types import SimpleNamespace as R
        >>> print("\\n".join(grid_lines([R(path="m.layers.0", token=0, tokens=2, rel_err=1e-7, ok=True),
        ...                               R(path="m.layers.0", token=2, tokens=1, rel_err=0.25, ok=False)])))
        rel err by module and token position (! = FAIL):
        module          0..1        2
        m.layers.0     1e-07     0.25!
    """
    columns, grid = token_grid(rows)
    if not grid:
        return []
    width = max(len(name) for name, _ in grid) + 2
    cell = [max(len(c), 8) for c in columns]
    head = "module".ljust(width) + "".join(c.rjust(w) + " " for c, w in zip(columns, cell))
    lines = ["rel err by module and token position (! = FAIL):", head.rstrip()]
    for name, values in grid:
        text = [fmt_float(v).rjust(w) + ("!" if ok is False else " ") for (v, ok), w in zip(values, cell)]
        lines.append((name.ljust(width) + "".join(text)).rstrip())
    return lines
