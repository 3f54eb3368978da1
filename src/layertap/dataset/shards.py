"""Shard files: write one atomically, open one lazily, in safetensors, npy or zarr.

A shard is written under a temporary name in OUT_DIR and renamed into place
when complete, so a reader (or ``--resume`` after a crash) never sees half a
shard. Reading memory-maps safetensors and npy shards, and opens zarr arrays
lazily: nothing is loaded until indexed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import LayertapError
from ..files.signals import publishing, raise_if_stopped
from .pooling import numpy_dtype

FORMATS = ("safetensors", "npy", "zarr")
TMP_PREFIX = ".shard-"

_ST_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
    "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64",
    "int64": "I64", "uint64": "U64",
}


def shard_name(index: int, fmt: str) -> str:
    """``shard-00003.safetensors``, ``shard-00003`` (a folder of .npy) or ``shard-00003.zarr``.

    Example:
        >>> shard_name(3, "npy"), shard_name(3, "zarr")
        ('shard-00003', 'shard-00003.zarr')
    """
    stem = f"shard-{index:05d}"
    return {"safetensors": f"{stem}.safetensors", "npy": stem, "zarr": f"{stem}.zarr"}[fmt]


def write_shard(out: Path, index: int, fmt: str, arrays: dict[str, np.ndarray], dtypes: dict[str, str],
                publish: bool = True) -> str:
    """Write ``arrays`` (key -> rows) as shard ``index``; return its file name (``publish=False``: the name of
    the temporary file or folder it stays in until :func:`publish_shard` renames it into place).

    ``dtypes`` gives each key's manifest dtype (``bfloat16`` is stored as bits
    where the format has no such type).
    """
    name = shard_name(index, fmt)
    with _atomic(out / name, is_dir=fmt != "safetensors", publish=publish) as tmp:
        if fmt == "safetensors":
            _write_safetensors(tmp, arrays, dtypes)
        elif fmt == "npy":
            for key, a in arrays.items():
                _write_npy(tmp / f"{key}.npy", a)
        else:
            _write_zarr(tmp, arrays, dtypes)
    return name if publish else tmp.name


def publish_shard(out: Path, tmp: str, index: int, fmt: str) -> str:
    """Rename the shard ``index`` a worker left unpublished (``tmp``, in ``out``) into place; return its name.
    A command a signal has stopped publishes nothing (:func:`~layertap.files.signals.raise_if_stopped`): the
    temporary shard stays for :func:`remove_leftovers`.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp())
        >>> tmp = write_shard(out, 0, "safetensors", {"a": np.zeros((2, 3), np.float32)}, {"a": "float32"}, publish=False)
        >>> tmp.startswith(TMP_PREFIX), publish_shard(out, tmp, 0, "safetensors"), sorted(p.name for p in out.iterdir())
        (True, 'shard-00000.safetensors', ['shard-00000.safetensors'])
    """
    name = shard_name(index, fmt)
    source, target = out / tmp, out / name
    if not (tmp.startswith(TMP_PREFIX) and source.parent == out and source.exists()):
        raise LayertapError(f"shard {index}: the worker's temporary shard {tmp!r} is not in '{out}'")
    raise_if_stopped()
    if source.is_dir() and target.exists():  # left by a run killed before it recorded this shard
        shutil.rmtree(target)
    publishing(source, target)
    os.replace(source, target)
    return name


def _write_npy(path: Path, a: np.ndarray) -> None:
    """``np.save``, but a bfloat16 array keeps its type name in the header (numpy would write raw
    ``V2`` bytes): ``np.load`` then gives bfloat16 wherever ml_dtypes is imported."""
    if a.dtype.name != "bfloat16":
        np.save(path, a, allow_pickle=False)
        return
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "bfloat16", "fortran_order": False, "shape": a.shape})
        np.ascontiguousarray(a).reshape(-1).view(np.uint8).tofile(f)


def _bits(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.view(np.uint16) if dtype == "bfloat16" else a


@contextlib.contextmanager
def _atomic(target: Path, *, is_dir: bool, publish: bool = True) -> Iterator[Path]:
    """A temporary file or folder beside ``target``, renamed onto it when the block succeeds (``publish=False``:
    kept under its temporary name, for the caller to publish)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}.", suffix=".tmp", dir=target.parent)) if is_dir else None
    if tmp is None:
        fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        tmp.chmod((0o777 if is_dir else 0o666) & ~_umask())
        if not publish:
            return
        if is_dir and target.exists():  # left by a run killed before it recorded this shard
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        discard(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_leftovers(out: Path) -> None:
    """Delete temporary shards a killed run left behind (only layertap's own names)."""
    for p in out.glob(f"{TMP_PREFIX}*.tmp"):
        discard(p)


def discard(path: Path) -> None:
    """Delete a shard file or folder (a temporary one, or one its manifest does not list), if it is there."""
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


# -- safetensors (written by hand: memory-mappable, bfloat16 kept as BF16) ------
def _write_safetensors(path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "layertap"}}
    offset = 0
    for key, a in arrays.items():
        header[key] = {"dtype": _ST_DTYPES[dtypes[key]], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in arrays.values():
            np.ascontiguousarray(a).reshape(-1).view(np.uint8).tofile(f)


def _read_safetensors_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def _write_zarr(path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> None:
    zarr = _zarr()
    group = zarr.open_group(str(path), mode="w")
    for key, a in arrays.items():
        bits = _bits(a, dtypes[key])
        arr = group.create_array(key, shape=bits.shape, dtype=bits.dtype, chunks=bits.shape or None)
        if bits.size:
            arr[...] = bits


def _zarr():
    try:
        import zarr
    except ImportError:
        raise LayertapError("--format zarr needs the 'zarr' package; pip install zarr") from None
    return zarr


def open_array(out: Path, file: str, fmt: str, key: str, dtype: str, shape: tuple[int, ...]) -> Any:
    """One tap's rows in one shard, memory-mapped (safetensors, npy) or lazy (zarr)."""
    path = out / file
    if not path.exists():
        raise LayertapError(f"shard '{path}' listed in the manifest is missing")
    if fmt == "safetensors":
        header, start = _read_safetensors_header(path)
        b, e = header[key]["data_offsets"]
        shp = tuple(header[key]["shape"])
        if e == b:
            return np.empty(shp, numpy_dtype(dtype))
        return np.memmap(path, dtype=numpy_dtype(dtype), mode="r", offset=start + b, shape=shp)
    if fmt == "npy":
        want = numpy_dtype(dtype)  # imports ml_dtypes for a bfloat16 header
        a = np.load(path / f"{key}.npy", mmap_mode="r", allow_pickle=False)
        return a.view(want) if a.dtype != want else a  # uint16 bits in shards of earlier versions
    arr = _zarr().open_group(str(path), mode="r")[key]
    return _BitsView(arr, numpy_dtype(dtype)) if dtype == "bfloat16" else arr


class _BitsView:
    """A lazy zarr array of uint16 bits read as bfloat16."""

    def __init__(self, arr: Any, dtype: np.dtype) -> None:
        self.arr, self.dtype, self.shape = arr, dtype, tuple(arr.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        return np.asarray(self.arr[key]).view(self.dtype)
