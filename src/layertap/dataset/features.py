"""``lt.load_features(OUT_DIR)``: read an extraction back without loading it all."""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import LayertapError, unknown_name
from .manifest import Manifest
from .pooling import numpy_dtype
from .shards import open_array


class ShardedArray:
    """One tap over all samples: shards stay on disk, indexing reads only what it needs.

    Supports ``len``, ``.shape``, ``.dtype``, integer / slice / index-array
    indexing along the sample axis (then any further indices), and
    ``np.asarray(a)`` to load everything when asked.

    Example:
        >>> a = ShardedArray([np.arange(6).reshape(3, 2), np.arange(6, 10).reshape(2, 2)], np.dtype(int))
        >>> a.shape, a[3].tolist(), a[1:4, 0].tolist()
        ((5, 2), [6, 7], [2, 4, 6])
    """

    def __init__(self, parts: Sequence[Any], dtype: np.dtype, row_shape: tuple[int, ...] | None = None) -> None:
        self.parts = list(parts)
        self.dtype = dtype
        self._starts = [0]
        for p in self.parts:
            self._starts.append(self._starts[-1] + int(p.shape[0]))
        rest = tuple(self.parts[0].shape[1:]) if self.parts else tuple(row_shape or ())
        self.shape = (self._starts[-1], *rest)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"ShardedArray(shape={self.shape}, dtype={self.dtype}, shards={len(self.parts)})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out.astype(dtype) if dtype is not None else out

    def __getitem__(self, key: Any) -> Any:
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if isinstance(first, (int, np.integer)):
            i = int(first) + (len(self) if first < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"sample {int(first)} is out of range for {len(self)} samples")
            s = bisect.bisect_right(self._starts, i) - 1
            return np.asarray(self.parts[s][(i - self._starts[s],) + rest])
        rows = np.arange(len(self))[first]  # slices, index arrays and masks, as numpy reads them
        return self._rows(np.atleast_1d(rows), rest)

    def _rows(self, rows: np.ndarray, rest: tuple) -> np.ndarray:
        pieces = []
        # consecutive rows in one shard are read with one slice
        shard_of = np.searchsorted(self._starts, rows, side="right") - 1
        cuts = np.flatnonzero(np.diff(shard_of) != 0) + 1
        for run_rows, run_shard in zip(np.split(rows, cuts), np.split(shard_of, cuts)):
            if not len(run_rows):
                continue
            s = int(run_shard[0])
            local = run_rows - self._starts[s]
            part = self.parts[s]
            if np.all(np.diff(local) == 1):
                pieces.append(np.asarray(part[(slice(int(local[0]), int(local[-1]) + 1),) + rest]))
            else:
                pieces.append(np.stack([np.asarray(part[(int(j),) + rest]) for j in local]))
        if not pieces:
            return np.empty((0, *self.shape[1:]), self.dtype)[(slice(None),) + rest]
        return np.concatenate(pieces)


class Features:
    """An extraction on disk: ``.ids``, ``.taps``, ``[tap]`` -> :class:`ShardedArray`.

    Attributes:
        ids: sample ids in row order (file paths relative to the data folder, or indices).
        taps: tap names in manifest order.
        manifest: the parsed ``manifest.json``.
        skipped: samples left out with ``skip_bad`` (``{"id", "index", "error"}``).
        labels: one int per row (an image folder's class folder, a ``label`` column), or None.
        classes: the class name of each label (folder names, a ``ClassLabel``'s names), or None.
        written, kept: from ``lt.extract_dataset``, the shards that call wrote and the
            ones an earlier run had written (``resume``); None from ``lt.load_features``.
    """

    report_kind = "features"  # how layertap.reports draws it (``--report``, notebooks)

    def __init__(self, out: Path, manifest: Manifest) -> None:
        self.path = out
        self.manifest = manifest
        m = manifest.data
        self.ids: list = list(m["ids"])
        self.skipped: list = list(m.get("skipped", []))
        self.labels: np.ndarray | None = np.asarray(m["labels"], dtype=np.int64) if "labels" in m else None
        self.classes: list[str] | None = (m.get("data") or {}).get("classes")
        self.taps: list[str] = [t["name"] for t in m.get("taps") or []]
        self.complete = m["status"] == "complete"
        self.written: int | None = None
        self.kept: int | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, tap: str) -> bool:
        return tap in self.taps

    def __repr__(self) -> str:
        state = "" if self.complete else ", incomplete"
        return f"Features({len(self)} samples, taps={self.taps}{state})"

    def _repr_html_(self) -> str:
        """Notebook view: thumbnails, histograms and NaN/Inf counts over the first samples."""
        from ..reports import repr_html

        return repr_html(self)

    def __getitem__(self, tap: str) -> ShardedArray:
        info = {t["name"]: t for t in self.manifest.data.get("taps") or []}
        if tap not in info:
            raise KeyError(unknown_name("tap", tap, self.taps))
        t = info[tap]
        fmt = self.manifest.data["options"]["format"]
        parts = [open_array(self.path, s["file"], fmt, t["key"], t["dtype"], tuple(t["shape"])) for s in self.manifest.data["shards"]]
        return ShardedArray(parts, numpy_dtype(t["dtype"]), tuple(t["shape"]))


def load_features(out: str | os.PathLike) -> Features:
    """Open an extraction written by ``lt.extract_dataset`` / ``layertap extract --data``.

    Args:
        out: the OUT_DIR holding ``manifest.json`` and the shards.

    Returns:
        A :class:`Features`: ``.ids``, ``.taps`` and ``[tap]`` -> an array over
        all samples that reads shards only when indexed.

    Example:
        >>> import tempfile, numpy as np, layertap as lt
        >>> from torch import nn
        >>> out = tempfile.mkdtemp() + "/feats"
        >>> data = [np.full((3,), i, np.float32) for i in range(5)]
        >>> _ = lt.extract_dataset(nn.Sequential(nn.Linear(3, 2)), data, taps=["0"], out=out,
        ...                        dataset_options=lt.DatasetOptions(progress=False))
        >>> f = lt.load_features(out)
        >>> f.ids, f.taps, f["0"].shape
        ([0, 1, 2, 3, 4], ['0'], (5, 2))
    """
    path = Path(out)
    if not (path / "manifest.json").is_file():
        raise LayertapError(f"'{path}' holds no manifest.json; is it an OUT_DIR written by extract --data?")
    return Features(path, Manifest.read(path))
