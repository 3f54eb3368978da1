"""The local engine: load batches (DataLoader workers or threads), run them, write shards behind.

Loading overlaps compute (``workers`` DataLoader worker processes for the
PyTorch backend; threads for ONNX Runtime, which keeps torch out), and shards
are written by a background thread, so the model never waits for the disk.
A shard is handed to the writer once the one before is on disk: memory stays
at about two shards (one written, one filled) plus the batches in flight.
"""

from __future__ import annotations

import queue
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np

from ..errors import LayertapError
from ..samples.sources import Bad, IterSource, reference
from .backends import pin_threads
from .batches import BatchResult, Collated, ShardAssembler, ShardData, batch_ranges, chunked, collate
from .job import Job


def run_local(job: Job, progress: bool | None) -> int:
    """Run every shard the manifest lacks; return the number of source samples."""
    before = pin_threads(job.threads)
    try:
        return _run(job, progress)
    finally:
        pin_threads(before)


def _run(job: Job, progress: bool | None) -> int:
    backend = job.backend.build()
    runner = job.runner(backend)
    writer = BackgroundWriter(job)
    rows = _Rows(job, writer)
    seen = 0
    try:
        with Bar(job, progress) as bar:
            for collated in _batches(job, backend.kind == "pytorch"):
                result = runner.run(collated)
                job.set_layout(runner)
                rows.add(result)
                n = len(collated.indices) + len(collated.bad)
                seen = max(seen, max(collated.indices + [b.index for b in collated.bad]) + 1)
                bar.advance(n)
        count = job.count if job.count is not None else seen
        if count == 0:
            raise LayertapError("the data gave no samples")
        rows.close(count)
    except BaseException:
        writer.close(quiet=True)
        raise
    writer.close()
    return count


class _Rows:
    """The shard assembler, made once the samples per shard are known (a size in bytes needs the
    first batch's features); rows of batches before that wait here."""

    def __init__(self, job: Job, writer: "BackgroundWriter") -> None:
        self.job, self.writer = job, writer
        self.assembler: ShardAssembler | None = None
        self.waiting: list[BatchResult] = []

    def add(self, result: BatchResult) -> None:
        self.waiting.append(result)
        if self.job.options.shard_size:
            if self.assembler is None:
                opts = self.job.options
                self.assembler = ShardAssembler(opts.shard_size, self.job.wanted, self.writer.submit, opts.skip_bad)
            for r in self.waiting:
                self.assembler.add(r)
            self.waiting.clear()

    def close(self, count: int) -> None:
        if self.assembler is None:  # every sample was bad: one shard of skipped samples
            self.job.options.shard_size = max(count, 1)
            self.add(BatchResult(np.zeros(0, np.int64), [], {}, []))
        assert self.assembler is not None
        self.assembler.close(count)


class BackgroundWriter:
    """Writes shards on a thread and records each in the manifest once it is on disk."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.queue: queue.Queue[ShardData | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="layertap-shard-writer", daemon=True)
        self.thread.start()

    def submit(self, shard: ShardData) -> None:
        """Hand a shard over once the one before is on disk: memory holds this one and the next being filled."""
        self.queue.join()
        self._raise()
        self.queue.put(shard)

    def _loop(self) -> None:
        while True:
            shard = self.queue.get()
            try:
                if shard is None:
                    return
                if self.error is None:
                    self.job.manifest.add_shard(self.job.write(shard))
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                self.error = e
            finally:
                del shard  # its buffers go before the next one arrives
                self.queue.task_done()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, quiet: bool = False) -> None:
        """Wait for queued shards; raise a write error unless ``quiet``."""
        self.queue.put(None)
        self.thread.join()
        if not quiet:
            self._raise()


# -- loading ------------------------------------------------------------------
def _batches(job: Job, torch_backend: bool) -> Iterator[Collated]:
    if isinstance(job.source, IterSource):
        yield from _iter_batches(job)
        return
    assert job.count is not None
    # before a size in bytes is resolved no shard exists yet: every batch is wanted
    ranges = batch_ranges(job.count, job.options.batch_size, job.options.shard_size or job.options.batch_size, job.wanted)
    workers = job.options.workers
    if torch_backend:
        yield from _dataloader(job, ranges, workers)
    elif workers > 0:
        with ThreadPoolExecutor(workers) as pool:
            yield from _prefetched(pool, job, ranges, workers)
    else:
        for a, b in ranges:
            yield job.load_batch(a, b)


class _Ranges:
    """A map-style dataset whose items are whole batches (DataLoader with batch_size=None)."""

    def __init__(self, job: Job, ranges: list[tuple[int, int]]) -> None:
        self.job, self.ranges = job, ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, j: int) -> Collated:
        return self.job.load_batch(*self.ranges[j])


def _keep(item: Any) -> Any:
    return item  # no tensor conversion: batches stay numpy until the backend


def _dataloader(job: Job, ranges: list[tuple[int, int]], workers: int) -> Iterator[Collated]:
    from torch.utils.data import DataLoader

    batches: Any = _Ranges(job, ranges)
    loader: Any = DataLoader(
        batches, batch_size=None, shuffle=False, num_workers=workers, collate_fn=_keep,
        prefetch_factor=2 if workers else None, persistent_workers=False,
    )
    yield from loader


def _prefetched(pool: ThreadPoolExecutor, job: Job, ranges: list[tuple[int, int]], depth: int) -> Iterator[Collated]:
    """Batches in order, ``depth`` of them loading ahead on threads."""
    pending = [pool.submit(job.load_batch, a, b) for a, b in ranges[:depth]]
    for a, b in ranges[depth:]:
        done = pending.pop(0)
        pending.append(pool.submit(job.load_batch, a, b))
        yield done.result()
    for done in pending:
        yield done.result()


def _iter_batches(job: Job) -> Iterator[Collated]:
    """Batches of an iterator in order; batches of finished shards are read and dropped."""
    src = job.source
    assert isinstance(src, IterSource)
    limit = job.options.limit
    bs = job.options.batch_size

    def samples() -> Iterator[tuple[int, Any]]:
        for i, s in src.samples():
            if limit is not None and i >= limit:
                return
            yield i, s

    for chunk in chunked(samples(), bs):
        if job.reference is None:
            first = next((s for _, s in chunk if not isinstance(s, Bad)), None)
            job.reference = reference(None, first, next((i for i, s in chunk if s is first), None))
        size = job.options.shard_size or bs  # resolved after the first batch (a size in bytes)
        first_k, last_k = chunk[0][0] // size, chunk[-1][0] // size
        if not any(job.wanted(k) for k in range(first_k, last_k + 1)):
            continue
        idx = [i for i, _ in chunk]
        yield collate(idx, idx, [s for _, s in chunk], job.reference, job.options.pool != "none")


# -- progress -----------------------------------------------------------------
class Bar:
    """A rich progress bar (samples/s, ETA) on stderr, only when it is a terminal."""

    def __init__(self, job: Job, enabled: bool | None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total = job.count
        done = sum(r["source"][1] - r["source"][0] for r in job.manifest.shards.values())
        self.start = done
        self.progress: Any = None

    def __enter__(self) -> "Bar":
        if self.enabled:
            self.progress = progress_bar()
            self.progress.start()
            self.task = self.progress.add_task("extracting", total=self.total, completed=self.start)
        return self

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()


def progress_bar() -> Any:
    """A rich Progress on stderr with samples/s and time left."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.speed or 0:.1f} samples/s")

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)
