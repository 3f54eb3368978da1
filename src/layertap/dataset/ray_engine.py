"""The Ray Data engine: the same shards, written by actors that each load the model once.

The pipeline is ``ray.data.from_items`` over the shards still to do, then
``map_batches`` with :class:`ShardWorker` (an actor class in a fixed-size
``ActorPoolStrategy``: the model or ORT session is built in ``__init__``, once
per actor; one actor per GPU when the run is on CUDA, else one per ``threads``
CPUs). Each actor runs PyTorch on the manifest's thread count and each call
reads its shard's samples with the same loaders and batch boundaries as the
local engine, writes the shard file into OUT_DIR (which must be on storage
every node sees) and returns its manifest record; the driver writes the
manifest. Ids and values therefore equal a local run's.

Samples are read by layertap's loaders rather than ``ray.data.read_images`` /
``read_numpy``: ``read_numpy`` splits every file along its first axis, and
reading inside the actor keeps corrupt files named and ``skip_bad`` working.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from typing import Any

from ..errors import LayertapError
from ..samples.sources import MapSource
from .backends import pin_threads
from .batches import ShardAssembler, ShardData, batch_ranges, shard_count
from .job import Job
from .local_engine import progress_bar
from .manifest import Manifest
from .shards import discard, publish_shard, remove_leftovers


def run_ray(job: Job, address: str | None, progress: bool | None) -> int:
    """Run the shards the manifest lacks on Ray Data; return the number of source samples."""
    if not isinstance(job.source, MapSource) or job.count is None:
        raise LayertapError(
            "engine='ray' needs data it can split: a folder, a datasets folder or a sequence with len(); "
            "an iterator or DataLoader is read once, in order: use the local engine"
        )
    ray = _ray()
    _connect(ray, address)
    if not job.options.shard_size:
        _probe_layout(job)
    todo = [k for k in range(shard_count(job.count, job.options.shard_size)) if job.wanted(k)]
    if todo:
        _run_shards(ray, job, todo, progress)
    return job.count


def _probe_layout(job: Job) -> None:
    """The taps' bytes per sample, from the first samples run here on the CPU, to size the shards
    before they are handed out (a size in bytes)."""
    runner = job.runner(dataclasses.replace(job.backend, device="cpu").build())
    for a in range(0, job.count or 0, job.options.batch_size):
        runner.run(job.load_batch(a, min(a + job.options.batch_size, job.count or 0)))
        if runner.layout is not None:
            job.set_layout(runner)
            return
    raise LayertapError("no sample of the data can be read")


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise LayertapError("--ray needs Ray Data; pip install 'layertap[ray]' (or 'ray[data]')") from None
    return ray


def _connect(ray: Any, address: str | None) -> None:
    """Join ``address``, or start a local Ray; a session already started (tests, notebooks) is reused."""
    if ray.is_initialized():
        return
    try:
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(include_dashboard=False, **quiet)
    except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, ... from Ray
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise LayertapError(f"cannot start or join {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _run_shards(ray: Any, job: Job, todo: list[int], progress: bool | None) -> None:
    import ray.data

    gpus = int(ray.cluster_resources().get("GPU", 0)) if job.backend.device.startswith("cuda") else 0
    per_actor = 1 if gpus else _cpus_per_actor(ray, job.threads)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    actors = max(1, min(len(todo), gpus or cpus // per_actor))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # layertap shows its own bar
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ds = ray.data.from_items([{"shard": k} for k in todo], override_num_blocks=len(todo)).map_batches(
        ShardWorker, fn_constructor_kwargs={"job": job}, batch_size=1, compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=1 if gpus else 0, num_cpus=per_actor,
    )
    errors: list[tuple[int, str]] = []
    bar = progress_bar() if (progress if progress is not None else _tty()) else None
    if bar is not None:
        bar.start()
        task = bar.add_task("extracting on Ray", total=job.count)
    try:
        for row in ds.iter_rows():
            rec = json.loads(row["record"])
            if "error" in rec:
                errors.append((rec["index"], rec["error"]))
                continue
            job.manifest.set_taps(rec.pop("taps"))
            _record(job, rec)
            if bar is not None:
                bar.advance(task, rec["source"][1] - rec["source"][0])
    except BaseException:
        remove_leftovers(job.out)  # the workers' shards the driver will not publish now (a resume redoes them)
        raise
    finally:
        if bar is not None:
            bar.stop()
    if errors:
        raise LayertapError(min(errors)[1])


def _record(job: Job, rec: dict) -> None:
    """Publish a worker's shard and record it in the manifest. A stop between the two (a signal, whose handler runs
    when a rename returns) takes the shard away again unless the manifest on disk lists it: the folder never holds
    a shard its manifest does not."""
    name = publish_shard(job.out, rec.pop("tmp"), rec["index"], job.options.format)
    try:
        job.manifest.add_shard(rec)
    except BaseException:
        try:
            listed = rec["index"] in Manifest.read(job.out).shards
        except LayertapError:
            listed = False
        if not listed:
            job.manifest.shards.pop(rec["index"], None)
            discard(job.out / name)
        raise


def _cpus_per_actor(ray: Any, threads: int | None) -> int:
    """CPUs each actor reserves: its PyTorch thread count, capped by the largest node (else it never starts)."""
    largest = max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=1)
    return max(1, min(threads or 1, largest))


def _tty() -> bool:
    return sys.stderr.isatty()


class ShardWorker:
    """A Ray Data actor: builds the backend once, then writes one shard per call."""

    def __init__(self, job: Job) -> None:
        pin_threads(job.threads)  # Ray starts actors with OMP_NUM_THREADS=num_cpus; the local run used job.threads
        self.job = job
        self.runner = job.runner(job.backend.build())

    def __call__(self, batch: dict) -> dict:
        records = []
        for k in batch["shard"]:
            try:
                records.append(json.dumps(self._shard(int(k))))
            except LayertapError as e:
                records.append(json.dumps({"index": int(k), "error": str(e)}))
        return {"record": records}

    def _shard(self, k: int) -> dict:
        job = self.job
        size, count = job.options.shard_size, job.count
        assert count is not None
        stop = min((k + 1) * size, count)
        done: list[ShardData] = []
        asm = ShardAssembler(size, lambda s: s == k, done.append, job.options.skip_bad)
        for a, b in batch_ranges(count, job.options.batch_size, size, lambda s: s == k):
            result = self.runner.run(job.load_batch(a, b))
            job.set_layout(self.runner)
            asm.add(result)
        asm.close(stop)
        record = job.write(done[0], publish=False)  # the driver publishes it as it records it
        record["taps"] = job.manifest.taps
        return record
