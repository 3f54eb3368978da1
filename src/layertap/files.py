"""Safe file handling shared by every side: atomic writes, output checks.

Outputs are written to a temporary file in the target folder and renamed into
place, so a failure at any point leaves no partial or empty file behind and
never touches an existing file of the same name until the new one is complete.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import LayertapError


def check_output_path(path: str | os.PathLike, *, inputs: tuple = (), suffixes: tuple[str, ...] = ()) -> Path:
    """Validate an output path before any work is done.

    Refuses a missing folder, a folder given as the file, an output equal to
    one of ``inputs``, and (when given) a suffix outside ``suffixes``.

    Example:
        >>> check_output_path("/nonexistent-dir/out.onnx")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: output folder '/nonexistent-dir' does not exist; create it first
    """
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        if parent.exists():
            raise LayertapError(f"output folder '{parent}' is a file, not a folder")
        raise LayertapError(f"output folder '{parent}' does not exist; create it first")
    if out.is_dir():
        raise LayertapError(f"output '{out}' is a folder; give a file name")
    _check_writable(parent)
    for src in inputs:
        if src is None:
            continue
        try:
            same = out.resolve() == Path(src).resolve()
        except OSError:
            same = False
        if same:
            raise LayertapError(f"output '{out}' is the input file; write to a new path (inputs are never modified)")
    if suffixes and out.suffix.lower() not in suffixes:
        raise LayertapError(f"output '{out}' must end in one of: {', '.join(suffixes)}")
    return out


def _check_writable(folder: Path) -> None:
    # os.access() says yes to root everywhere (even /proc); only creating a
    # file tells the truth, and it costs one empty temporary file.
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise LayertapError(f"cannot write in output folder '{folder}': {e.strerror or e}") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> with atomic_path(os.path.join(d, "a.txt")) as tmp:
        ...     _ = tmp.write_text("hi")
        >>> open(os.path.join(d, "a.txt")).read()
        'hi'
    """
    target = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    except OSError as e:
        raise LayertapError(f"cannot write in output folder '{target.parent}': {e.strerror or e}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if not tmp.exists() or tmp.stat().st_size == 0:
            raise LayertapError(f"nothing was written for '{target}'")
        tmp.chmod(0o666 & ~_umask())  # mkstemp makes 0600; give the mode a plain open() would
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def save_arrays(path: str | os.PathLike, arrays: dict) -> Path:
    """Save name -> numpy array as ``.npz`` or ``.safetensors``, atomically.

    Keys are kept exactly (tap names contain '.', '#', '[' and ':').

    Example:
        >>> import numpy as np, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
        >>> _ = save_arrays(p, {"layer1#0": np.zeros(2)})
        >>> sorted(np.load(p).files)
        ['layer1#0']
    """
    import numpy as np

    out = check_output_path(path, suffixes=(".npz", ".safetensors"))
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    with atomic_path(out) as tmp:
        if out.suffix.lower() == ".npz":
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
        else:
            try:
                from safetensors.numpy import save_file
            except ImportError as e:
                raise LayertapError("writing .safetensors needs the 'safetensors' package; pip install safetensors") from e
            save_file(arrays, str(tmp))
    return out
