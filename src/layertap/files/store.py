"""Arrays held in memory up to a budget, and on disk (memory-mapped) beyond it (numpy only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import numpy as np

__all__ = ["ArrayStore"]


class ArrayStore:
    """Arrays by key; beyond ``budget`` bytes new ones spill to a temporary folder.

    Spilled arrays come back memory-mapped (copy-on-write: writable, the file
    never changes), so only the pages being read are resident. Used by
    ``lt.compare`` (reference values) and ``lt.extract`` (captured values).

    Example:
        >>> store = ArrayStore(budget=8)
        >>> store.put(0, [np.zeros(2, np.float32)]); store.put(1, [np.ones(4, np.float32)])
        >>> store.held, store.spilled, float(store.get(1)[0].sum())
        (8, 16, 4.0)
        >>> store.put(2, store.get(0), shared=True); store.drop(2); store.held
        8
        >>> store.close()
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.spilled = 0
        self._mem: dict[int, list[np.ndarray]] = {}
        self._disk: dict[int, list[str]] = {}
        self._shapes: dict[int, list[tuple[int, ...]]] = {}
        self._nbytes: dict[int, int] = {}
        self._own: dict[int, int] = {}  # the bytes each entry in memory added to ``held``
        self._dir: str | None = None

    def put(self, key: int, arrays: list[np.ndarray], shared: bool = False) -> None:
        """Store ``arrays``; ``shared`` arrays already held elsewhere cost nothing."""
        nbytes = 0 if shared else sum(a.nbytes for a in arrays)
        self._shapes[key] = [tuple(a.shape) for a in arrays]
        self._nbytes[key] = sum(a.nbytes for a in arrays)
        if shared or self.held + nbytes <= self.budget:
            self._mem[key] = arrays
            self._own[key] = nbytes
            self.held += nbytes
            return
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="layertap-compare-")
        paths = []
        for i, a in enumerate(arrays):
            p = os.path.join(self._dir, f"{key}_{i}.npy")
            np.save(p, a, allow_pickle=False)
            paths.append(p)
        self._disk[key] = paths
        self.spilled += nbytes

    def put_shapes(self, key: int, shapes: list[tuple[int, ...]]) -> None:
        """Know ``key``'s shapes without holding its arrays (:meth:`get` gives none)."""
        self._shapes[key] = [tuple(s) for s in shapes]

    def on_disk(self, key: int) -> bool:
        """Whether ``key``'s arrays went to disk."""
        return key in self._disk

    def has(self, key: int) -> bool:
        return key in self._shapes

    def shapes(self, key: int) -> list[tuple[int, ...]]:
        return self._shapes.get(key, [])

    def nbytes(self, key: int) -> int:
        return self._nbytes.get(key, 0)

    def get(self, key: int) -> list[np.ndarray]:
        if key in self._mem:
            return self._mem[key]
        if key in self._disk:
            return [np.load(p, mmap_mode="c", allow_pickle=False) for p in self._disk[key]]
        return []

    def drop(self, key: int) -> None:
        """Forget ``key``'s arrays (memory, or the spilled files)."""
        if self._mem.pop(key, None) is not None:
            self.held -= self._own.pop(key)  # a shared entry's arrays were counted where they were put first
        for path in self._disk.pop(key, []):
            with contextlib.suppress(OSError):
                os.remove(path)

    def close(self) -> None:
        self._mem.clear()
        self._own.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
