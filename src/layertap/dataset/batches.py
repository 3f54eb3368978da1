"""From samples to shard rows: collate a batch, run it, pool and cast, cut into shards.

Every engine (local, Ray) goes through these steps with the same batch
boundaries: batch ``j`` is always the source samples ``j*B <= i < (j+1)*B``
and shard ``k`` the samples ``k*S <= i < (k+1)*S``. A resumed run and a Ray
worker that starts mid-way therefore run exactly the batches an uninterrupted
run does, and write the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import LayertapError
from ..samples.sources import Bad, Reference, check_sample
from .pooling import cast, pool, pooled_axes


@dataclass
class Collated:
    """One batch after loading: good samples stacked in runs of equal shape, bad ones aside."""

    indices: list[int]
    ids: list[Any]
    groups: list[Any]  # stacked inputs (array or dict of arrays), in index order
    sizes: list[int]
    bad: list[Bad] = field(default_factory=list)


def collate(indices: Sequence[int], ids: Sequence[Any], samples: Sequence[Any], ref: Reference | None, any_shape: bool) -> Collated:
    """Check each sample against the reference and stack consecutive equal-shaped ones.

    Example:
        >>> c = collate([0, 1, 2], ["a", "b", "c"], [np.zeros(2), np.zeros(3), np.ones(3)], None, True)
        >>> c.sizes, [g.shape for g in c.groups]
        ([1, 2], [(1, 2), (2, 3)])
    """
    out = Collated([], [], [], [])
    run: list[Any] = []

    def close_run() -> None:
        if run:
            out.groups.append(_stack(run))
            out.sizes.append(len(run))
            run.clear()

    for i, sid, sample in zip(indices, ids, samples):
        if ref is not None:
            sample = check_sample(sample, ref, i, sid, any_shape)
        if isinstance(sample, Bad):
            out.bad.append(sample)
            continue
        if run and _shape_key(run[0]) != _shape_key(sample):
            close_run()
        run.append(sample)
        out.indices.append(i)
        out.ids.append(sid)
    close_run()
    return out


def _shape_key(sample: Any) -> Any:
    if isinstance(sample, dict):
        return tuple((k, v.shape, v.dtype.str) for k, v in sample.items())
    return (sample.shape, sample.dtype.str)


def _stack(samples: list[Any]) -> Any:
    if isinstance(samples[0], dict):
        return {k: np.stack([s[k] for s in samples]) for k in samples[0]}
    return np.stack(samples)


@dataclass
class BatchResult:
    """Features of one batch: rows in source order (``indices``), the bad samples aside."""

    indices: np.ndarray
    ids: list[Any]
    features: dict[str, np.ndarray]
    bad: list[Bad]


class BatchRunner:
    """Runs collated batches through a backend, then pools and casts (numpy, same for all engines)."""

    def __init__(self, backend: Any, pool_how: str, dtype: str) -> None:
        self.backend = backend
        self.pool = pool_how
        self.dtype = dtype
        self.layout: list[dict] | None = None

    def run(self, c: Collated) -> BatchResult:
        parts: list[dict[str, np.ndarray]] = []
        for group, size in zip(c.groups, c.sizes):
            raw = self.backend.run(group)
            parts.append({k: self._finish(k, v, size) for k, v in raw.items()})
        if parts:
            feats = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
            self._check_layout(feats, raw)
        else:
            feats = {}
        return BatchResult(np.asarray(c.indices, dtype=np.int64), list(c.ids), feats, list(c.bad))

    def _finish(self, name: str, a: np.ndarray, size: int) -> np.ndarray:
        if a.ndim == 0 or a.shape[0] != size:
            raise LayertapError(
                f"tap {name!r} has shape {'x'.join(map(str, a.shape)) or 'scalar'} for a batch of {size}: dataset "
                "extraction needs taps whose first axis is the batch (tap another module, or index into the value)"
            )
        return cast(pool(a, self.pool), self.dtype)

    def _check_layout(self, feats: dict[str, np.ndarray], raw: dict[str, np.ndarray]) -> None:
        layout = [
            {"name": k, "shape": list(v.shape[1:]), "dtype": v.dtype.name, "pooled_axes": pooled_axes(raw[k].ndim, self.pool)}
            for k, v in feats.items()
        ]
        if self.layout is None:
            self.layout = layout
            return
        for old, new in zip(self.layout, layout):
            if old != new:
                raise LayertapError(
                    f"tap {new['name']!r} gives {'x'.join(map(str, new['shape']))} {new['dtype']} for some samples and "
                    f"{'x'.join(map(str, old['shape']))} {old['dtype']} for others; pass --pool mean|max|first "
                    "(or resize the inputs) so every sample gives one shape"
                )


def keyed_layout(layout: list[dict], fmt: str) -> list[dict]:
    """The manifest's tap records: a file-safe ``key`` per tap (safetensors keeps the name, an
    npy shard names each file after its tap, escaped like an npz member), and how to read a
    bfloat16 tap outside layertap.

    Example:
        >>> keyed_layout([{"name": "/fc/Gemm_output_0", "dtype": "bfloat16"}], "npy")[0]["key"]
        '%2Ffc%2FGemm_output_0'
    """
    from ..files.arrays import file_stem  # noqa: PLC0415 -- layertap --help loads this module; files.arrays loads on use

    out = []
    for i, t in enumerate(layout):
        key = {"safetensors": t["name"], "npy": file_stem(t["name"])}.get(fmt, f"t{i}")
        out.append({**t, "key": key, **({"read": BFLOAT16_READ[fmt]} if t["dtype"] == "bfloat16" else {})})
    return out


#: how each format's bfloat16 arrays read outside layertap (the manifest's tap records say it)
BFLOAT16_READ = {
    "safetensors": "safetensors keeps BF16: safetensors.numpy.load_file (after import ml_dtypes) or torch",
    "npy": "np.load gives bfloat16 once ml_dtypes is imported (import ml_dtypes; np.load(f))",
    "zarr": "stored as uint16 bits: zarr.open(f)[...].view(ml_dtypes.bfloat16)",
}


@dataclass
class ShardData:
    """One complete shard, ready to write."""

    index: int
    source: tuple[int, int]
    ids: list[Any]
    skipped: list[dict]
    arrays: dict[str, np.ndarray]  # tap name -> rows


class ShardAssembler:
    """Routes batch rows into shard buffers of ``shard_size`` source samples.

    Rows of shards that ``wanted(k)`` rejects (already on disk) are dropped.
    A buffer is preallocated once per shard, so memory is one shard plus the
    batches in flight, whatever the dataset size. ``emit`` receives each
    complete :class:`ShardData`. A bad sample stops the run here (after the
    rows before it are placed) unless ``skip_bad``.
    """

    def __init__(self, shard_size: int, wanted: Callable[[int], bool], emit: Callable[[ShardData], None], skip_bad: bool) -> None:
        self.size = shard_size
        self.wanted = wanted
        self.emit = emit
        self.skip_bad = skip_bad
        self.current = -1  # shard being filled
        self._reset(0)

    def _reset(self, k: int) -> None:
        self.current = k
        self.ids: list[Any] = []
        self.skipped: list[dict] = []
        self.buffers: dict[str, np.ndarray] = {}
        self.rows = 0

    def add(self, result: BatchResult) -> None:
        """Place a batch's rows (in source order) and its bad samples."""
        for bad in result.bad:
            if not self.skip_bad and self.wanted(bad.index // self.size):
                keep = result.indices < bad.index
                ids = [i for i, k in zip(result.ids, keep) if k]
                self._place(result.indices[keep], ids, {n: v[keep] for n, v in result.features.items()}, [])
                raise LayertapError(
                    f"{bad.error}; the completed shards are kept: fix the sample and rerun with --resume, or pass --skip-bad"
                )
        self._place(result.indices, result.ids, result.features, result.bad)

    def _place(self, indices: np.ndarray, ids: list[Any], feats: dict[str, np.ndarray], bad: list[Bad]) -> None:
        shard_of = indices // self.size
        bad_shards = [b.index // self.size for b in bad]
        for k in sorted(set(shard_of.tolist()) | set(bad_shards)):
            self._advance(k)
            if not self.wanted(k):
                continue
            rows = np.flatnonzero(shard_of == k)  # contiguous: indices are sorted
            if len(rows):
                a, b = int(rows[0]), int(rows[-1]) + 1
                self._put(ids[a:b], {n: v[a:b] for n, v in feats.items()})
            self.skipped.extend({"id": x.id, "index": x.index, "error": x.error} for x, s in zip(bad, bad_shards) if s == k)

    def _advance(self, k: int) -> None:
        while k > self.current:
            self.flush_current(stop=(self.current + 1) * self.size)
            self._reset(self.current + 1)

    def _put(self, ids: list[Any], rows: dict[str, np.ndarray]) -> None:
        if not self.buffers:
            self.buffers = {n: np.empty((self.size, *v.shape[1:]), v.dtype) for n, v in rows.items()}
        n = len(ids)
        for name, v in rows.items():
            self.buffers[name][self.rows : self.rows + n] = v
        self.ids.extend(ids)
        self.rows += n

    def close(self, count: int) -> None:
        """Emit the remaining wanted shards up to source sample ``count``."""
        self._advance(max(count - 1, 0) // self.size)
        self.flush_current(stop=count)

    def flush_current(self, stop: int) -> None:
        """Emit the shard being filled (if wanted), covering source samples up to ``stop``."""
        k = self.current
        if not self.wanted(k):
            return
        arrays = {n: b[: self.rows] for n, b in self.buffers.items()}
        self.emit(ShardData(k, (k * self.size, stop), self.ids, self.skipped, arrays))


def batch_ranges(count: int, batch_size: int, shard_size: int, wanted: Callable[[int], bool]) -> list[tuple[int, int]]:
    """The global batches ``[j*B, (j+1)*B)`` that hold samples of a wanted shard.

    Example:
        >>> batch_ranges(10, 4, 5, lambda k: k == 1)
        [(4, 8), (8, 10)]
    """
    out = []
    for start in range(0, count, batch_size):
        stop = min(start + batch_size, count)
        first, last = start // shard_size, (stop - 1) // shard_size
        if any(wanted(k) for k in range(first, last + 1)):
            out.append((start, stop))
    return out


def shard_count(count: int, shard_size: int) -> int:
    return (count + shard_size - 1) // shard_size


def chunked(items: Iterable[tuple[int, Any]], batch_size: int) -> Iterable[list[tuple[int, Any]]]:
    """(index, sample) pairs in lists of ``batch_size`` aligned on ``j*B``."""
    batch: list[tuple[int, Any]] = []
    for item in items:
        if batch and item[0] // batch_size != batch[0][0] // batch_size:
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch
