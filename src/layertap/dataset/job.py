"""One extraction, as both engines see it: source, backend, options, OUT_DIR, manifest.

A :class:`Job` is picklable (Ray ships it to each actor); the heavy parts (the
model, the ORT session) are built where they run, from ``backend``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LayertapError
from ..options import DatasetOptions
from ..samples.sources import IterSource, MapSource, Reference
from .backends import BackendSpec
from .batches import BatchRunner, Collated, ShardData, collate, keyed_layout
from .manifest import NAME, Manifest
from .pooling import numpy_dtype
from .shards import remove_leftovers, shard_name, write_shard

DEFAULT_SHARD_SIZE = DatasetOptions().shard_size


@dataclass
class Options:
    """What decides the bytes written (compared on ``--resume``), plus how to run."""

    format: str = "safetensors"
    dtype: str = "float32"
    pool: str = "none"
    shard_size: int = 0  # samples per shard; 0 until a size in bytes is resolved (resolve_shard_size)
    batch_size: int = 64
    limit: int | None = None
    skip_bad: bool = False
    workers: int = 0
    shard_text: int | str = DEFAULT_SHARD_SIZE  # --shard-size as given: a sample count or a size
    shard_bytes: int | None = None

    def recorded(self, taps: list[str], device: str, threads: int | None) -> dict:
        """The options as the manifest records them (``workers`` changes no value).

        ``threads`` is PyTorch's intra-op thread count (None for ONNX files):
        how many threads split a convolution decides the order of its float
        sums, so every engine and every resumed run uses the recorded count.
        ``shard_samples`` is the samples per shard used (a size in bytes is
        resolved from the taps' bytes per sample once the first batch has run).
        """
        return {"taps": list(taps), "format": self.format, "dtype": self.dtype, "pool": self.pool,
                "shard_size": self.shard_text, "shard_samples": self.shard_size or None, "batch_size": self.batch_size,
                "limit": self.limit, "skip_bad": self.skip_bad, "device": device, "threads": threads}


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_shard_size(value: int | str) -> tuple[int | None, int | None]:
    """``--shard-size`` as ``(samples, None)`` for a count or ``(None, bytes)`` for a size.

    Example:
        >>> parse_shard_size(1024), parse_shard_size("256MB"), parse_shard_size("1GiB"), parse_shard_size("512")
        ((1024, None), (None, 256000000), (None, 1073741824), (512, None))
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 1:
            return value, None
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        unit = m.group(2).lower() if m else ""
        if m and not unit and "." not in m.group(1) and int(m.group(1)) >= 1:
            return int(m.group(1)), None
        if m and unit in _UNITS and float(m.group(1)) * _UNITS[unit] >= 1:
            return None, int(float(m.group(1)) * _UNITS[unit])
    raise LayertapError(
        f"bad --shard-size {value!r}: give a number of samples (1024) or a size with its unit (256MB, 1GiB; "
        "units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
    )


def samples_per_shard(shard_bytes: int, layout: list[dict], batch_size: int) -> int:
    """How many samples' features fit in ``shard_bytes`` (whole batches when one or more fit).

    Example:
        >>> samples_per_shard(256 * 10**6, [{"shape": [256, 56, 56], "dtype": "float32"}], 64)
        64
    """
    per_sample = sum(int(np.prod(t["shape"], dtype=np.int64)) * numpy_dtype(t["dtype"]).itemsize for t in layout)
    n = max(1, shard_bytes // max(per_sample, 1))
    return n // batch_size * batch_size if n >= batch_size else n


@dataclass
class Job:
    out: Path
    source: MapSource | IterSource
    backend: BackendSpec
    options: Options
    reference: Reference | None
    count: int | None  # source samples to read (after --limit); None for iterators
    manifest: Manifest

    @property
    def threads(self) -> int | None:
        """PyTorch's intra-op thread count for every forward of this extraction (None: leave it)."""
        return self.manifest.header["options"].get("threads")

    @property
    def done(self) -> set[int]:
        return set(self.manifest.shards)

    def wanted(self, k: int) -> bool:
        return k not in self.manifest.shards

    def load_batch(self, start: int, stop: int) -> Collated:
        """Load and collate source samples ``start..stop-1`` (map-style sources)."""
        src = self.source
        assert isinstance(src, MapSource)
        idx = list(range(start, stop))
        return collate(idx, [src.ids[i] for i in idx], [src.load(i) for i in idx], self.reference, self.options.pool != "none")

    def runner(self, backend: Any) -> BatchRunner:
        return BatchRunner(backend, self.options.pool, self.options.dtype)

    def write(self, shard: ShardData, publish: bool = True) -> dict:
        """Write one shard file; return the manifest record (the manifest is not touched). ``publish=False``
        (a Ray worker): the shard stays under a temporary name, the record's ``tmp``, which the driver renames
        into place (:func:`~.shards.publish_shard`) as it records it, so that a stopped driver leaves no shard
        its manifest does not list."""
        taps = self.manifest.taps or []
        arrays, dtypes = {}, {}
        for t in taps:
            rows = shard.arrays.get(t["name"])
            if rows is None:  # every sample of this shard was skipped
                rows = np.empty((0, *t["shape"]), numpy_dtype(t["dtype"]))
            arrays[t["key"]], dtypes[t["key"]] = rows, t["dtype"]
        file = write_shard(self.out, shard.index, self.options.format, arrays, dtypes, publish)
        record = {"index": shard.index, "file": file, "source": list(shard.source), "ids": list(shard.ids), "skipped": list(shard.skipped)}
        if not publish:
            record["tmp"], record["file"] = file, shard_name(shard.index, self.options.format)
        labels = getattr(self.source, "labels", None)
        if labels is not None:
            a, b = shard.source
            skipped = {x["index"] for x in shard.skipped}
            record["labels"] = [labels[i] for i in range(a, b) if i not in skipped]
        return record

    def set_layout(self, runner: BatchRunner) -> None:
        """Record the taps' shapes and dtypes once the first batch has run (and the samples per shard)."""
        if runner.layout is not None:
            self.manifest.set_taps(keyed_layout(runner.layout, self.options.format))
            self.resolve_shard_size(runner.layout)

    def resolve_shard_size(self, layout: list[dict]) -> None:
        """Samples per shard from a size in bytes and the taps' bytes per sample, recorded in the manifest."""
        if self.options.shard_size:
            return
        assert self.options.shard_bytes is not None
        self.options.shard_size = samples_per_shard(self.options.shard_bytes, layout, self.options.batch_size)
        self.manifest.header["options"]["shard_samples"] = self.options.shard_size
        self.manifest.write()


def prepare_out(out: Path, header: dict, resume: bool) -> Manifest:
    """Check OUT_DIR and return its manifest: new, or the one to resume (same options)."""
    if out.exists() and not out.is_dir():
        raise LayertapError(f"output '{out}' is a file; -o takes a folder (OUT_DIR) with --data")
    if not out.exists():
        if not out.parent.is_dir():
            raise LayertapError(f"output folder '{out.parent}' does not exist; create it first")
        out.mkdir()
    has_manifest = (out / NAME).is_file()
    if has_manifest:
        m = Manifest.read(out)
        if not resume:
            state = "a complete" if m.status == "complete" else "an interrupted"
            raise LayertapError(f"'{out}' already holds {state} extraction; pass --resume to continue it, or choose a new OUT_DIR")
        # the thread count is this machine's, not a user option: the resumed shards use the first run's;
        # so is the samples per shard a size in bytes gave
        header["options"]["threads"] = m.header["options"].get("threads")
        if "shard_samples" not in m.header["options"]:  # written before sizes in bytes: counts only
            header["options"].pop("shard_samples", None)
        elif header["options"].get("shard_samples") is None:
            header["options"]["shard_samples"] = m.header["options"]["shard_samples"]
        m.check_same(header)
        remove_leftovers(out)
        return m
    if any(out.iterdir()):
        first = sorted(p.name for p in out.iterdir())[0]
        raise LayertapError(f"OUT_DIR '{out}' holds other files ({first}, ...) and no manifest.json; give an empty or new folder")
    m = Manifest(out, header)
    m.write()
    return m


def check_resumed_ids(job: Job) -> None:
    """The samples of completed shards must still be the source's samples there."""
    src = job.source
    if not isinstance(src, MapSource):
        return
    for k, r in sorted(job.manifest.shards.items()):
        a, b = r["source"]
        skipped = {x["index"] for x in r["skipped"]}
        expected = [src.ids[i] for i in range(a, min(b, len(src))) if i not in skipped]
        if b > len(src) or expected != r["ids"]:
            raise LayertapError(
                f"cannot resume '{job.out}': the data changed under shard {k} (samples {a}..{b - 1}); "
                "restore it, or start again in a new OUT_DIR"
            )


def discard_empty(out: Path, created: bool) -> None:
    """Remove what a run that wrote no shard left: its manifest, temporary shards, the folder if it made it."""
    remove_leftovers(out)
    (out / NAME).unlink(missing_ok=True)
    if created and out.is_dir() and not any(out.iterdir()):
        out.rmdir()
