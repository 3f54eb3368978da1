"""``lt.extract_dataset``: tapped features for every sample of a dataset, in shards on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import LayertapError
from ..options import DatasetOptions, Model, RuntimeOptions, SampleOptions
from ..runtimes import open_runtime, plugin_for
from ..samples.for_reference import samples_for
from ..samples.images import Preprocess
from ..samples.sources import Bad, IterSource, MapSource, reference
from ..selectors import parse_taps
from .backends import BackendSpec, check_device, is_file
from .features import Features, load_features
from .job import Job, Options, check_resumed_ids, discard_empty, parse_shard_size, prepare_out
from .local_engine import run_local
from .pooling import DTYPES, POOLS, check_choice
from .ray_engine import run_ray
from .shards import FORMATS

ENGINES = ("local", "ray")


def extract_dataset(
    model_or_path: Any,
    data: Any,
    taps: Sequence[Any],
    out: str | os.PathLike,
    *,
    batch_size: int = 64,
    format: str = "safetensors",  # noqa: A002 - the CLI's --format
    pool: str = "none",
    resume: bool = False,
    device: str = "cpu",
    dataset_options: DatasetOptions | None = None,
    runtime_options: RuntimeOptions | None = None,
    sample_options: SampleOptions | None = None,
) -> Features:
    """Run a model over a whole dataset and save the tapped tensors in shards.

    Args:
        model_or_path: an ``nn.Module``, a MODEL spec (``torchvision:resnet18``), a
            :class:`~layertap.options.Model` (a spec with its ``weights``, ``config``, ``weights_key``,
            ``weights_strict``, ``unsafe_pickle``; the ``method`` run) or an ``.onnx`` file.
        data: a folder of images, of ``.npy``/``.npz`` samples, or a ``datasets``
            ``save_to_disk`` folder; or any sequence / iterable of samples or a DataLoader.
        taps: selectors; each must give a tensor with the batch first.
        out: OUT_DIR (created; must be new or empty, or an extraction to ``resume``).
        batch_size: samples per forward.
        format: ``safetensors``, ``npy`` or ``zarr``.
        pool: ``none``, or ``mean``/``max``/``first`` over spatial (N,C,H,W) or token (N,T,D) axes.
        resume: continue an interrupted run (the options must be the same).
        device: ``cpu`` or ``cuda`` (PyTorch backend).
        dataset_options: the rest of the run (:class:`~layertap.options.DatasetOptions`): ``dtype`` of the
            stored floating features (``float32``, ``float16``, ``bfloat16``), ``shard_size`` (samples per
            shard, ``1024``, or the size of a shard's features, ``"256MB"``, the default: the samples per
            shard then follow from the taps' bytes per sample, and the manifest records the count used),
            ``skip_bad`` (record unreadable samples in the manifest and go on), ``workers`` (DataLoader
            worker processes; threads for ONNX files), ``stop_early`` (as for ``lt.extract``), ``engine``
            (``local`` or ``ray``: Ray Data; ``ray_address`` joins a cluster, else a local one starts) and
            ``progress`` (a progress bar; default: when stderr is a terminal).
        runtime_options: what runs an ``.onnx`` file (:class:`~layertap.options.RuntimeOptions`: ``runtime``
            ``"ort"``, the default, or ``"openvino"``, with ``ov_precision`` and ``ov_device``).
        sample_options: which samples and how images are read (:class:`~layertap.options.SampleOptions`:
            ``limit`` (the first N), ``columns`` (the input columns of a ``datasets`` folder; default its
            image or array column, else every array column, as named inputs; a ``label`` column is kept as
            labels), ``image_size``, ``mean``, ``std`` (when the model's config gives no recipe)).

    Returns:
        :class:`~layertap.dataset.features.Features` over OUT_DIR (see ``lt.load_features``).

    Example:
        >>> import tempfile, numpy as np, layertap as lt
        >>> from torch import nn
        >>> out = tempfile.mkdtemp() + "/feats"
        >>> data = [np.ones((2, 3, 3), np.float32) * i for i in range(10)]
        >>> from layertap.options import DatasetOptions
        >>> f = lt.extract_dataset(nn.Sequential(nn.Conv2d(2, 4, 1)), data, taps=["0"], out=out, batch_size=4,
        ...                        pool="mean", dataset_options=DatasetOptions(shard_size=8, progress=False))
        >>> len(f), f["0"].shape, f["0"].dtype.name, len(f.manifest.data["shards"])
        (10, (10, 4), 'float32', 2)
    """
    runs = RuntimeOptions.merged(runtime_options)
    sampling = SampleOptions.merged(sample_options)
    run = DatasetOptions.merged(dataset_options)
    opts = _options(batch_size, run.shard_size, format, run.dtype, pool, sampling.limit, run.skip_bad, run.workers)
    check_choice("engine", run.engine, ENGINES)
    model = Model.of(model_or_path)
    source = model.spec if model.spec is not None else model.source  # text: it travels to Ray workers
    tap_texts = _tap_texts(taps, source)
    loading = model.loading  # paths absolute: Ray workers run elsewhere
    spec = BackendSpec(_model_arg(source), tap_texts, method=model.method, stop_early=run.stop_early, device=device,
                       weights=None if loading["weights"] is None else str(Path(loading["weights"]).resolve()),
                       config=None if model.config is None else os.fspath(model.config), unsafe_pickle=model.unsafe_pickle,
                       weights_key=model.weights_key, weights_strict=model.weights_strict, runtime=_runtime(source, runs))
    source, out_dir = _open_data(data, out, spec, sampling, same_shape=opts.pool == "none")
    count = (len(source) if opts.limit is None else min(opts.limit, len(source))) if isinstance(source, MapSource) else None
    header = _header(spec, source, opts.recorded(tap_texts, device, _threads(spec)))
    ref = _reference(source, run.skip_bad)
    _check_device(spec, device)
    created = not out_dir.exists()
    manifest = prepare_out(out_dir, header, resume)
    opts.shard_size = manifest.header["options"].get("shard_samples") or opts.shard_size  # a resumed run's
    job = Job(out_dir, source, spec, opts, ref, count, manifest)
    kept = len(manifest.shards)
    if manifest.status != "complete":
        _finish(job, created, run.engine, run.ray_address, run.progress)
    feats = load_features(out)
    feats.kept, feats.written = kept, len(manifest.shards) - kept
    return feats


def _header(spec: BackendSpec, source: MapSource | IterSource, options: dict) -> dict:
    """The manifest's header: model, data, options and the preprocessing used (if the source applies one)."""
    used = source.preprocess.to_dict() if source.preprocess is not None else None
    return {"model": spec.describe(), "data": source.describe(), "options": options, "preprocessing": used}


def _runtime(model: Any, runs: RuntimeOptions) -> dict[str, Any]:
    """The runtime options of an ONNX file, checked now (a bad device or precision writes nothing)."""
    given: dict[str, Any] = runs.one_file()
    if not given:
        return {}
    if not is_file(model):
        raise LayertapError("runtime=, ov_precision= and ov_device= (--runtime, --ov-precision, --ov-device) pick what "
                            "runs an .onnx file; a PyTorch model runs in PyTorch (--device)")

    open_runtime(**given)
    return given


def _open_data(data: Any, out: str | os.PathLike, spec: BackendSpec, sampling: SampleOptions, same_shape: bool
               ) -> tuple[MapSource | IterSource, Path]:
    """The sample source (:func:`~layertap.samples.for_reference.samples_for`: images read by ``--image-size``,
    else the model's zoo recipe, else the file's fixed input size) and OUT_DIR resolved; an OUT_DIR inside the
    data folder is refused."""
    data_dir = Path(data).resolve() if isinstance(data, (str, os.PathLike)) else None
    out_dir = Path(out).resolve()
    if data_dir is not None and (out_dir == data_dir or data_dir in out_dir.parents):
        raise LayertapError(f"OUT_DIR '{out}' is inside the data folder '{data}'; its shards would be read as samples, write elsewhere")
    samples = samples_for(_Zoo(spec), None, sampling, shapes_from=lambda: _declared(spec), data=data_dir or data,
                          same_shape=same_shape)
    assert samples.source is not None  # data given: the dataset itself
    return samples.source, out_dir


def _finish(job: Job, created: bool, engine: str, ray_address: str | None, progress: bool | None) -> None:
    """Write the shards still to do and mark the manifest complete."""
    check_resumed_ids(job)
    try:
        total = _run(job, engine, ray_address, progress)
    except BaseException:
        if not job.manifest.shards:
            discard_empty(job.out, created)  # nothing done: leave no half-made OUT_DIR behind
        raise
    job.manifest.finish(total)


def _run(job: Job, engine: str, ray_address: str | None, progress: bool | None) -> int:
    if engine == "ray":
        return run_ray(job, ray_address, progress)

    return run_local(job, progress)


def _threads(spec: BackendSpec) -> int | None:
    """PyTorch's intra-op thread count here, which every forward of the run will use (None for ONNX files)."""
    if spec.is_onnx:
        return None  # no torch import for ONNX files
    import torch

    return int(torch.get_num_threads())


def _check_device(spec: BackendSpec, device: str) -> None:
    """A PyTorch model's device exists (an ONNX file runs where its runtime says)."""
    if spec.is_onnx or device == "cpu":
        return
    import torch

    check_device(torch, device)


def _options(batch_size: int, shard_size: int | str, fmt: str, dtype: str, pool: str, limit: int | None, skip_bad: bool,
             workers: int) -> Options:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise LayertapError(f"batch_size must be a positive integer, got {batch_size!r}")
    samples, size = parse_shard_size(shard_size)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise LayertapError(f"limit must be a positive integer, got {limit!r}")
    if not isinstance(workers, int) or workers < 0:
        raise LayertapError(f"workers must be an integer >= 0, got {workers!r}")
    return Options(format=check_choice("--format", fmt, FORMATS), dtype=check_choice("--dtype", dtype, DTYPES),
                   pool=check_choice("--pool", pool, POOLS), shard_size=samples or 0, batch_size=batch_size,
                   limit=limit, skip_bad=bool(skip_bad), workers=workers,
                   shard_text=samples or str(shard_size).replace(" ", ""), shard_bytes=size)


def _tap_texts(taps: Sequence[Any], model: Any) -> list[str]:
    texts = [str(t) if not isinstance(t, str) else t for t in taps]
    if not texts:
        raise LayertapError("no taps given; pass taps=[...] (--tap TAP)")
    if not is_file(model):
        parse_taps(texts)  # a typo fails before anything is built
    return texts


def _model_arg(model: Any) -> Any:
    """Paths become absolute (Ray workers run elsewhere); modules pass through."""
    if isinstance(model, os.PathLike) or is_file(model):
        return str(Path(model).resolve())
    if isinstance(model, str):
        head, sep, attr = model.rpartition(":")
        if sep and head.endswith(".py") and Path(head).is_file():
            return f"{Path(head).resolve()}:{attr}"
    return model


def _reference(source: Any, skip_bad: bool) -> Any:
    if not isinstance(source, MapSource):
        return None
    ref = reference(source)
    if ref is None:
        first = source.load(0)
        raise LayertapError(first.error if isinstance(first, Bad) else "no sample of the data can be read")
    return ref


class _Zoo:
    """The image recipe a model spec's zoo records (an ONNX file or a program has none), asked only when images
    turn up: the model is not loaded here (Ray workers build their own)."""

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec

    def recipe(self) -> Preprocess | None:
        if self.spec.is_onnx:
            return None
        from ..pytorch.reference import recipe

        return recipe(self.spec.model)


def _declared(spec: BackendSpec) -> Any:
    """The inputs an ONNX file or a program declares (the graph; a program: as it was lowered), for the
    image size of a file's fixed N x C x H x W input; ``None`` for a PyTorch model."""
    if not spec.is_onnx:
        return None
    path = Path(spec.model)
    program = plugin_for(path)
    if program is not None and program.form == "program":
        return program.input_specs(path)  # type: ignore[attr-defined]
    import onnx

    return onnx.load(str(path), load_external_data=False)
