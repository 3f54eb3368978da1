"""Output paths checked before any work, and atomic writes.

Outputs are written to a temporary file in the target folder and renamed into
place, so a failure at any point leaves no partial or empty file behind and
never touches an existing file of the same name until the new one is complete.
An output may never be a file the running operation reads (:mod:`.reads`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import LayertapError
from .reads import refuse_inputs
from .signals import publishing, raise_if_stopped

#: temporary names keep at most this much of the target's name (NAME_MAX is 255 bytes)
_TMP_NAME_KEEP = 120


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
    (mkstemp makes 0600).

    A command a signal has stopped publishes nothing: the signal is raised here, before the
    rename, also when what it raised when it arrived was dropped (:mod:`.signals`)."""
    raise_if_stopped()
    try:
        mode = stat.S_IMODE((like or target).stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    tmp.chmod(mode)
    publishing(tmp, target)  # a signal from here on may find the output written: the stop message says so
    os.replace(tmp, target)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Linux's FICLONE ioctl (``_IOW(0x94, 9, int)``): the destination shares the source's blocks, copy on write
_FICLONE = 0x40049409


def copy_data(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy the file ``src`` onto the existing file ``dst`` (a temporary file beside an output), as cheaply
    as the file system allows, never linking the two: an edit of ``dst`` must not reach ``src``.

    A copy-on-write clone first (``FICLONE``: Btrfs, XFS, bcachefs; instant, no block written); else the
    ranges that hold data (``SEEK_DATA``/``SEEK_HOLE``) are copied inside the kernel
    (``os.copy_file_range``, which a file system may clone too), holes stay holes, and the size is set
    last; else a plain copy. Weights files of several GB written without holes still cost their
    size in writes; the sparse ones (``truncate``d, or zero-filled by a converter) and the cloned ones
    cost next to nothing (measured: a 3 GiB sparse data file 5.1 s with ``shutil.copyfile``, 0.01 s here).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> src, dst = os.path.join(d, "a.data"), os.path.join(d, "b.data")
        >>> with open(src, "wb") as f:
        ...     _ = f.write(b"head"); _ = f.seek(1 << 20); _ = f.write(b"tail")
        >>> open(dst, "wb").close()
        >>> copy_data(src, dst)
        >>> data = open(dst, "rb").read()
        >>> len(data), data[:4], data[-4:], data[4:8], os.path.samefile(src, dst)
        (1048580, b'head', b'tail', b'\\x00\\x00\\x00\\x00', False)
    """
    with open(src, "rb") as fin, open(dst, "r+b") as fout:
        if _clone(fin.fileno(), fout.fileno()):
            return
        fout.truncate(0)
        size = os.fstat(fin.fileno()).st_size
        if not _copy_ranges(fin.fileno(), fout.fileno(), size):
            fin.seek(0)
            fout.seek(0)
            fout.truncate(0)
            shutil.copyfileobj(fin, fout, 1 << 20)


def _clone(fin: int, fout: int) -> bool:
    """Whether ``fout`` became a copy-on-write clone of ``fin`` (Linux ``FICLONE``; False where unsupported)."""
    if not hasattr(os, "copy_file_range"):  # not Linux: no FICLONE either
        return False
    import fcntl  # noqa: PLC0415 -- POSIX only

    try:
        fcntl.ioctl(fout, _FICLONE, fin)
    except OSError:  # EOPNOTSUPP (ext4, tmpfs), EXDEV (two file systems), EINVAL...
        return False
    return True


def _copy_ranges(fin: int, fout: int, size: int) -> bool:
    """Copy the data ranges of ``fin`` into the empty ``fout`` at the same offsets, then set its size;
    False (nothing decided) where the system cannot seek data and holes or copy inside the kernel."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None or not hasattr(os, "copy_file_range"):
        return False
    pos = 0
    try:
        while pos < size:
            try:
                start = os.lseek(fin, pos, seek_data)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole from here to the end
                    break
                raise
            end = min(os.lseek(fin, start, seek_hole), size)
            while start < end:
                done = os.copy_file_range(fin, fout, end - start, start, start)
                if done == 0:  # the source shrank under us: copy what is left plainly
                    return False
                start += done
            pos = end
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EBADF):
            return False  # a file system that offers neither: the plain copy does it
        raise
    os.ftruncate(fout, size)
    return True


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


