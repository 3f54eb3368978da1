"""The record of files an operation reads: no output may replace one.

Every file an operation reads is recorded (:func:`note_input`) while an
:func:`operation` scope is open (the CLI opens one per command); every output
path is checked against that record (resolved paths and ``os.path.samefile``)
when it is validated and again just before anything is written, so no command
can overwrite what it reads: a weights file, an ``--input`` array, a model's
``.py`` file, an ONNX file's external data.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import LayertapError

#: (resolved path, (st_dev, st_ino) or None, what it is) for each file the operation reads
_READS: contextvars.ContextVar[list[tuple[Path, tuple[int, int] | None, str]] | None] = contextvars.ContextVar(
    "layertap_reads", default=None
)


@contextlib.contextmanager
def operation() -> Iterator[None]:
    """Scope for one operation: files read inside it may not be written by it.

    Nested scopes share the outermost one (a CLI command that calls
    ``lt.add_outputs`` checks against everything the command read).

    Example:
        >>> import tempfile, os
        >>> from layertap.files.writes import check_output_path
        >>> src = os.path.join(tempfile.mkdtemp(), "w.npz")
        >>> _ = open(src, "wb").write(b"x")
        >>> with operation():
        ...     note_input(src, "--weights")
        ...     check_output_path(src)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: output '...w.npz' is the input file (--weights); write to a new path (inputs are never modified)
    """
    if _READS.get() is not None:
        yield
        return
    token = _READS.set([])
    try:
        yield
    finally:
        _READS.reset(token)


def note_input(path: str | os.PathLike | None, what: str = "") -> None:
    """Record that the running :func:`operation` reads ``path`` (no-op outside one)."""
    reads = _READS.get()
    if reads is None or path is None or str(path) == "":
        return
    p = Path(path)
    reads.append((_resolved(p), _file_id(p), what))


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare as written
        return p.absolute()


def _file_id(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def refuse_inputs(out: str | os.PathLike, inputs: Iterable[Any] = ()) -> None:
    """Raise when ``out`` is (or links to) a file the operation reads, or one of ``inputs``."""
    what = _input_kind(Path(out), inputs)
    if what is not None:
        shown = f" ({what})" if what else ""
        raise LayertapError(f"output '{out}' is the input file{shown}; write to a new path (inputs are never modified)")


def is_input(path: str | os.PathLike) -> bool:
    """Whether the running :func:`operation` reads ``path``."""
    return _input_kind(Path(path)) is not None


def _input_kind(target: Path, inputs: Iterable[Any] = ()) -> str | None:
    resolved, fid = _resolved(target), _file_id(target)
    extra = [(_resolved(Path(p)), _file_id(Path(p)), "") for p in inputs if p is not None and str(p)]
    for path, other, what in [*(_READS.get() or []), *extra]:
        if path == resolved or (fid is not None and other == fid):
            return what
    return None
