"""Data-dependent Python control flow that the TorchScript exporter bakes into a file.

The TorchScript exporter traces one run: an ``if`` on a tensor's value takes the
branch the example took, and the file computes that branch for every input.
The tracer says so only in a ``TracerWarning`` per line; this module turns them
into one report note naming the source lines, and makes the inputs for a
verification run that may take the other branch.
"""

from __future__ import annotations

import linecache
import os
import warnings
from pathlib import Path
from typing import Any, Sequence


def traced_branches(caught: Sequence[warnings.WarningMessage], skip: Sequence[str] = ()) -> list[str]:
    """``file.py:37 (if h.sum() > 0:)`` for each line where the tracer turned a tensor into a
    Python boolean (a branch on its value), in first-seen order; lines under the folders in
    ``skip`` are left out.

    Example:
        >>> w = warnings.WarningMessage("Converting a tensor to a Python boolean might cause the trace "
        ...                             "to be incorrect.", UserWarning, "model.py", 3)
        >>> traced_branches([w])
        ['model.py:3']
    """
    out: dict[str, None] = {}
    for w in caught:
        # A boolean is an ``if``/``while`` on a value; numbers are mostly sizes, which the
        # second batch size checks.
        if "Converting a tensor to a Python boolean" not in str(w.message):
            continue
        filename = str(Path(w.filename).resolve()) if os.path.exists(w.filename) else w.filename
        if any(filename.startswith(folder) for folder in skip):
            continue
        source = linecache.getline(w.filename, w.lineno).strip()
        where = f"{_short(w.filename)}:{w.lineno}"
        out[f"{where} ({source})" if source else where] = None
    return list(out)


def branch_note(branches: Sequence[str], show: int = 3) -> str:
    """One report line for the traced branches.

    Example:
        >>> print(branch_note(["m.py:7 (if x.sum() > 0:)"]))  # doctest: +NORMALIZE_WHITESPACE
        the TorchScript exporter traced data-dependent control flow at m.py:7 (if x.sum() > 0:):
        the file computes the branch the example took, for every input
    """
    where = "; ".join(branches[:show]) + (f" and {len(branches) - show} more" if len(branches) > show else "")
    return (f"the TorchScript exporter traced data-dependent control flow at {where}: "
            "the file computes the branch the example took, for every input")


def contrasting(example: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The example with every float tensor negated (sums, means and signs flip, so a branch on
    them may go the other way); None when there is no float input to change."""
    if not any(t.is_floating_point() for t in example):
        return None
    return tuple(-t if t.is_floating_point() else t for t in example)


def _short(filename: str) -> str:
    """A path relative to the working folder when it is inside it."""
    try:
        return os.path.relpath(filename) if not os.path.relpath(filename).startswith("..") else filename
    except ValueError:  # another drive on Windows
        return filename
