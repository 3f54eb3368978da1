"""Write an ``.onnx`` file and its external data as one unit.

A model and its data file cannot be renamed together, so a replaced pair is
never edited in place: the new data goes under a name no file has yet
(``OUT.data`` when free, else ``OUT.<random>.data``) that only the new
``.onnx`` refers to, the ``.onnx`` is renamed into place last, and only then
are the data files that just the replaced ``.onnx`` used removed. A failure at
any step leaves the previous pair loading as before. Writers of one folder
take turns through an advisory lock on the folder (``flock``), so two
commands writing the same ``-o`` at once cannot end with one run's ``.onnx``
and the other's data.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

from ..files.reads import is_input, refuse_inputs
from ..files.writes import atomic_write_bytes, replace_keeping_mode
from .walk import all_tensors

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_NAME_MAX = 255


def publish(model: "onnx.ModelProto", out: Path, data: Mapping[str, Path] = {}) -> None:
    """Write ``model`` (weights left external) to ``out`` together with new data files.

    Args:
        model: the graph; edited in place (new data locations).
        out: the ``.onnx`` path.
        data: location in ``model`` -> a finished temporary file in ``out``'s
            folder holding that data; it is renamed to a fresh name. Locations
            not listed are files the model shares with others (left alone).

    Example:
        >>> import onnx, tempfile
        >>> from onnx import helper, TensorProto
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        >>> out = Path(tempfile.mkdtemp()) / "m.onnx"
        >>> publish(helper.make_model(g), out)
        >>> onnx.load(str(out)).graph.node[0].op_type
        'Relu'
    """
    with _folder_lock(out.parent):
        old = _own_locations(out)
        placed: list[Path] = []
        try:
            renames = {}
            for k, (loc, tmp) in enumerate(data.items()):
                name = _fresh_data_name(out, k)
                replace_keeping_mode(tmp, out.parent / name, like=out if out.exists() else None)  # a 0600 pair stays 0600
                placed.append(out.parent / name)
                renames[loc] = name
            relocate(model, renames)
            atomic_write_bytes(out, model.SerializeToString())
        except BaseException:
            for p in placed:
                with contextlib.suppress(OSError):
                    p.unlink()
            raise
        _remove_stale(out, old - external_locations(model))


def publish_file(src: Path, out: Path) -> None:
    """Rename a finished ``.onnx`` that uses no external data onto ``out``.

    The file is not parsed or rewritten (for a model with its weights inline
    that is the whole model again); ``src`` must be in ``out``'s folder, so
    the rename is atomic. Data files only the replaced ``out`` used go.

    Example:
        >>> import onnx, tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], [])), str(d / ".work.onnx"))
        >>> publish_file(d / ".work.onnx", d / "m.onnx")
        >>> sorted(p.name for p in d.iterdir())
        ['m.onnx']
    """
    with _folder_lock(out.parent):
        refuse_inputs(out)
        old = _own_locations(out)
        replace_keeping_mode(src, out, like=out if out.exists() else None)
        _remove_stale(out, old)


def _remove_stale(out: Path, names: set[str]) -> None:
    """Remove data files beside ``out`` that nothing published refers to any more (never an input)."""
    for name in names:
        stale = out.parent / name
        if not is_input(stale):
            with contextlib.suppress(OSError):
                stale.unlink()


def external_locations(model: "onnx.ModelProto") -> set[str]:
    """Every external-data location the model's tensors name."""
    import onnx

    return {
        kv.value
        for t in all_tensors(model)
        if t.data_location == onnx.TensorProto.EXTERNAL
        for kv in t.external_data
        if kv.key == "location"
    }


def relocate(model: "onnx.ModelProto", renames: Mapping[str, str]) -> None:
    """Point external-data references at new file names (``old location -> new``)."""
    for t in all_tensors(model):
        for kv in t.external_data:
            if kv.key == "location" and kv.value in renames:
                kv.value = renames[kv.value]


def _own_locations(out: Path) -> set[str]:
    """Data files beside ``out`` that belong to it alone by name (``OUT.*``), as it refers to them now."""
    if not out.is_file():
        return set()
    prefix = _stem(out) + "."
    if not any(n.startswith(prefix) for n in os.listdir(out.parent)):
        return set()  # nothing to remove: do not parse a file whose weights may be inline
    try:
        import onnx

        locations = external_locations(onnx.load(str(out), load_external_data=False))
    except Exception:  # noqa: BLE001 - not ONNX or unreadable: leave its neighbours alone
        return set()
    prefix = _stem(out) + "."
    return {loc for loc in locations if "/" not in loc and "\\" not in loc and loc.startswith(prefix)}


def _stem(out: Path) -> str:
    """The part of ``out``'s name every data name starts with (short enough for NAME_MAX)."""
    name = out.name
    if len(os.fsencode(name)) + len(".12345678.data99") <= _NAME_MAX:
        return name

    return name[:150] + "." + hashlib.sha1(os.fsencode(name)).hexdigest()[:8]


def _fresh_data_name(out: Path, k: int) -> str:
    """``OUT.data`` (``OUT.data1``... for later files) when no file has that name, else a random one."""
    suffix = ".data" + (str(k) if k else "")
    name = _stem(out) + suffix
    while os.path.lexists(out.parent / name):
        name = f"{_stem(out)}.{secrets.token_hex(4)}{suffix}"
    return name


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``folder`` (waits for other layertap writers)."""
    try:
        import fcntl  # noqa: PLC0415 -- POSIX only
    except ImportError:  # pragma: no cover - Windows: renames still keep each pair whole
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
