"""Visual reports: one self-contained HTML file per command, and notebook rendering.

``--report FILE.html`` on ``layers``, ``compare`` and ``extract`` writes a page
built from the same fragments that ``_repr_html_`` shows in a notebook. The
package needs numpy only (no torch, no matplotlib); PNGs are encoded by files/png.py.

Example:
    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "r.html")
    >>> _ = write_report(path, tensors_page("taps", {"x": np.ones((1, 2, 4, 4))}))
    >>> open(path).read().startswith("<!DOCTYPE html>")
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .html import cards, esc, fragment, page, section, table_fragment

SUFFIXES = (".html", ".htm")


def fragment_html(obj: Any) -> str:
    """The body HTML of a report object (what ``_repr_html_`` wraps), by its ``report_kind``."""
    kind = getattr(obj, "report_kind", "table")
    if kind == "compare":
        from .compare_page import compare_fragment

        return compare_fragment(obj)
    if kind == "layers":
        from .layers_page import layers_fragment

        return layers_fragment(obj)
    if kind == "onnx_layers":
        from .layers_page import onnx_layers_fragment

        return onnx_layers_fragment(obj)
    if kind == "fix":
        from .fix_page import fix_fragment

        return fix_fragment(obj)
    if kind == "features":
        from .features_page import features_fragment

        return features_fragment(obj)
    return table_fragment(obj)


def repr_html(obj: Any) -> str:
    """Notebook HTML for a report object: its fragment with the scoped stylesheet.

    Example:
        >>> from layertap.tables import Column, Table
        >>> class T(Table):
        ...     columns = [Column("name", "Name")]
        >>> repr_html(T([{"name": "a"}])).startswith('<div class="lt">')
        True
    """
    return fragment(fragment_html(obj))


def tensors_html(arrays: Mapping[str, Any]) -> str:
    """Notebook HTML for name -> array (an extraction's ``_repr_html_``)."""
    from .tensors import tensors_fragment

    return fragment(tensors_fragment(arrays))


def report_page(obj: Any, title: str, *, extra: Sequence[str] = (), summary: Sequence[tuple[str, Any]] = ()) -> str:
    """A whole HTML document for a report object, with optional summary cards and extra sections."""
    head = cards(summary) if summary else ""
    return page(title, head, fragment_html(obj), *extra)


def tensors_page(title: str, arrays: Mapping[str, Any], *, summary: Sequence[tuple[str, Any]] = (),
                 notes: Sequence[str] = ()) -> str:
    """A document of tapped tensors: summary cards, thumbnails, histograms, NaN/Inf counts."""
    from .html import notes_list
    from .tensors import tensors_fragment

    return page(title, cards(summary) if summary else "", notes_list(notes),
                section("tapped tensors", tensors_fragment(arrays), anchor="tensors"))


def check_report_path(path: str | os.PathLike, *, inputs: tuple = ()) -> Path:
    """Refuse a report path that cannot be written (before any work is done).

    Example:
        >>> check_report_path("/nonexistent-dir/r.html")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: output folder '/nonexistent-dir' does not exist; create it first
    """
    from ..files.writes import check_output_path

    return check_output_path(path, inputs=inputs, suffixes=SUFFIXES)


def write_report(path: str | os.PathLike, document: str) -> Path:
    """Write an HTML document atomically (a failure leaves any previous file as it was)."""
    from ..files.writes import atomic_write_bytes

    out = check_report_path(path)
    atomic_write_bytes(out, document.encode("utf-8"))
    return out


__all__ = ["check_report_path", "esc", "fragment_html", "repr_html", "report_page", "tensors_html", "tensors_page", "write_report"]
