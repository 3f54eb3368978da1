"""Safe file handling shared by every side: atomic writes, output checks.

Outputs are written to a temporary file in the target folder and renamed into
place, so a failure at any point leaves no partial or empty file behind and
never touches an existing file of the same name until the new one is complete.

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
import stat
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..errors import LayertapError

#: temporary names keep at most this much of the target's name (NAME_MAX is 255 bytes)
_TMP_NAME_KEEP = 120
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


def check_output_path(path: str | os.PathLike, *, inputs: tuple = (), suffixes: tuple[str, ...] = ()) -> Path:
    """Validate an output path before any work is done.

    Refuses a missing folder, a folder given as the file, an output equal to
    one of ``inputs`` or to any file the :func:`operation` reads, and (when
    given) a suffix outside ``suffixes``.

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
    refuse_inputs(out, inputs)
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
    refuse_inputs(target)
    tmp = temp_path(target)
    try:
        yield tmp
        if not tmp.exists() or tmp.stat().st_size == 0:
            raise LayertapError(f"nothing was written for '{target}'")
        refuse_inputs(target)  # the operation may have read more files since it started
        replace_keeping_mode(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def temp_path(target: Path, suffix: str = ".tmp") -> Path:
    """A new empty hidden file beside ``target`` (its name fits NAME_MAX for any target name)."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name[:_TMP_NAME_KEEP]}.", suffix=suffix, dir=target.parent or ".")
    except OSError as e:
        raise LayertapError(f"cannot write in output folder '{target.parent}': {e.strerror or e}") from None
    os.close(fd)
    return Path(name)


def replace_keeping_mode(tmp: Path, target: Path, like: Path | None = None) -> None:
    """Rename ``tmp`` onto ``target``; the result keeps the permission bits of ``like``
    (default ``target``) when it exists, else gets the mode a plain ``open()`` would
    (mkstemp makes 0600)."""
    try:
        mode = stat.S_IMODE((like or target).stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    tmp.chmod(mode)
    os.replace(tmp, target)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


_ALIAS_HINT = "give the tap an alias (NAME=selector) that no other output uses"


def unique_names(*groups: Iterable[tuple[str, Any]], what: str = "outputs", hint: str = _ALIAS_HINT) -> dict[str, Any]:
    """Join ``(name, value)`` pairs into one dict; refuse a name given twice.

    Every command that names its results (taps, flattened model outputs,
    ONNX outputs) builds the dict here, so a collision is an error, never a
    silently dropped value.

    Example:
        >>> unique_names([("output", 1)], [("body.0", 2)])
        {'output': 1, 'body.0': 2}
        >>> unique_names([("output", 1)], [("output", 2)])
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: two outputs are both named 'output'; give the tap an alias (NAME=selector) that no other output uses
    """
    out: dict[str, Any] = {}
    for group in groups:
        for name, value in group:
            if name in out:
                raise LayertapError(f"two {what} are both named {name!r}; {hint}")
            out[name] = value
    return out


def npz_member(name: str) -> str:
    """The ``.npz`` key for an array name: the name itself, so ``np.load(f)[name]`` works
    (TorchScript tensor names such as ``/layer1/layer1.0/relu/Relu_output_0`` included).

    A key is stored as the zip member ``KEY.npy``, which unzip tools take as a path. A
    leading ``/`` is kept: ``unzip``, Python's ``zipfile`` and ``bsdtar`` drop it and
    extract inside the target folder. A name that could still land outside that
    folder (a ``..`` part, a backslash, a control character) is percent-encoded.

    Example:
        >>> npz_member("layer1#0"), npz_member("/layer1/Relu_output_0"), npz_member("../../x")
        ('layer1#0', '/layer1/Relu_output_0', '%2E%2E/%2E%2E/x')
    """
    unsafe = (
        "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or any(part == ".." for part in name.split("/"))
    )
    if not unsafe:
        return name
    encoded = urllib.parse.quote(name, safe="/#[]:.,=+-_ ")
    return "/".join("%2E%2E" if p == ".." else p for p in encoded.split("/"))


def save_arrays(path: str | os.PathLike, arrays: dict, notify: Callable[[str], None] | None = None) -> Path:
    """Save name -> numpy array as ``.npz`` or ``.safetensors``, atomically.

    Keys are the names exactly (tap names contain '.', '#', '[' and ':', ONNX tensor
    names '/'); in ``.npz`` a name that could land outside the folder when the file is
    unzipped is percent-encoded (see :func:`npz_member`) and ``notify`` gets a line
    naming its key.

    Example:
        >>> import numpy as np, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
        >>> _ = save_arrays(p, {"layer1#0": np.zeros(2), "/fc/Gemm_output_0": np.ones(1)})
        >>> saved = np.load(p)
        >>> saved.files, saved["/fc/Gemm_output_0"]
        (['layer1#0', '/fc/Gemm_output_0'], array([1.]))
    """
    import numpy as np

    out = check_output_path(path, suffixes=(".npz", ".safetensors"))
    arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # ascontiguousarray makes 0-d 1-d
    with atomic_path(out) as tmp:
        if out.suffix.lower() == ".npz":
            members = unique_names(((npz_member(k), v) for k, v in arrays.items()), what="npz members",
                                   hint="write .safetensors instead, which keeps names as they are")
            for name in arrays:
                if npz_member(name) != name and notify is not None:
                    notify(f"{name!r} is saved under the key {npz_member(name)!r}: as a zip member path it could "
                           "land outside the folder the .npz is unzipped in (.safetensors keeps every name)")
            _write_npz(tmp, members)
        else:
            try:
                from safetensors.numpy import save_file
            except ImportError as e:
                raise LayertapError("writing .safetensors needs the 'safetensors' package; pip install safetensors") from e
            save_file(arrays, str(tmp))
    return out


def _write_npz(path: Path, members: dict) -> None:
    """What ``np.savez`` writes, without passing names as keyword arguments (a tap
    named ``file`` or ``allow_pickle`` would collide with savez's own parameters)."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for key, value in members.items():
            with z.open(key + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
