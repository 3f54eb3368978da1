"""The option objects the library's entry points take, each option declared once, here:

* :class:`~layertap.metrics.Criterion`: how rows are judged (and whether other weights are compared);
* :class:`RuntimeOptions`: what runs each file, and the memory its runs hold;
* :class:`SampleOptions`: which samples a command runs on;
* :class:`Model`: a PyTorch model as a command takes it (the module or a MODEL spec, its weights, the
  method called);
* :class:`ExportOptions`, :class:`DatasetOptions`, :class:`SearchOptions`: the rest of ``lt.export``,
  ``lt.extract_dataset`` and ``lt.fix``.

The CLI's argument groups build them; the public functions take them beside a few everyday keywords
(at most 12 parameters) and hand the objects to the layers below. A keyword given explicitly wins over
an object's field, whatever its value: the public functions default their keywords to :data:`UNSET`, and
``merged`` replaces exactly the fields given. :func:`reporting` carries a progress receiver to the
commands that report steps.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from .errors import LayertapError
from .metrics import DEFAULT_ATOL, DEFAULT_RTOL, Criterion

_O = TypeVar("_O")


class _Unset:
    """The default of a public keyword: not given (its object's field, else the documented default, applies)."""

    _instance: "_Unset | None" = None

    def __new__(cls) -> "_Unset":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:  # pickled (Ray, worker processes) as the one instance
        return "UNSET"


#: a keyword the caller did not give (see :func:`given`)
UNSET: Any = _Unset()


def given(**keywords: Any) -> dict[str, Any]:
    """The keywords the caller gave (those not :data:`UNSET`), whatever their values.

    Example:
        >>> given(seed=0, limit=UNSET, inputs=None)
        {'seed': 0, 'inputs': None}
    """
    return {k: v for k, v in keywords.items() if v is not UNSET}


def _merged(cls: type[_O], base: _O | None, keywords: dict[str, Any]) -> _O:
    """``base`` (else the defaults) with each keyword that was given (not :data:`UNSET`) in place of the
    object's field: a keyword given explicitly wins over the object, whatever its value."""
    obj = base if base is not None else cls()
    if not isinstance(obj, cls):
        raise LayertapError(f"expected a layertap.options.{cls.__name__}, got {type(obj).__name__}; build one with "
                            f"{cls.__name__}(...) or give the keywords instead")
    changed = given(**keywords)
    unknown = sorted(set(changed) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
    if unknown:
        raise LayertapError(f"{cls.__name__} has no field {', '.join(unknown)}")
    return dataclasses.replace(obj, **changed) if changed else obj  # type: ignore[type-var]


#: bytes of intermediates a comparison holds at once, per side
DEFAULT_MEMORY_BUDGET = 1 << 30


@dataclass(frozen=True)
class RuntimeOptions:
    """What runs each file, and the memory its runs hold.

    ``runtime`` (``ort``, ``openvino``) runs the reference file, or the one file; ``cand_runtime`` a
    candidate (default: the reference's). ``providers``/``cand_providers``: ONNX Runtime's execution
    providers per side (``["CUDA"]``; default CPU); ``ort_optimizations``/``ref_ort_optimizations``:
    its graph optimisations (the reference's ``None``: the candidate's). ``ov_precision``
    (``f32``/``bf16``/``f16``; default the device's) and ``ov_device`` (``CPU``, ``GPU``, ``NPU``):
    OpenVINO's. ``batch_outputs``: at most this many tensors exposed per run; ``memory_budget``: bytes
    of intermediates held at once on each side of a comparison (beyond it PyTorch values spill to a
    temporary folder and runs expose fewer tensors each).

    Example:
        >>> RuntimeOptions.merged(RuntimeOptions(runtime="openvino"), ov_precision="f32").ov_precision
        'f32'
        >>> RuntimeOptions.merged(RuntimeOptions(ort_optimizations=False), ort_optimizations=True).ort_optimizations
        True
    """

    runtime: str | None = None
    cand_runtime: str | None = None
    providers: Sequence[str] | str | None = None
    cand_providers: Sequence[str] | str | None = None
    ort_optimizations: bool = True
    ref_ort_optimizations: bool | None = None  # None: the candidate's
    ov_precision: str | None = None
    ov_device: str | None = None
    batch_outputs: int | None = None
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    #: compiled PyTorch (``cand_runtime="inductor"``): both sides under this autocast dtype (``bf16``, ``fp16``),
    #: and how the reference is compiled into the candidate when no candidate is given (``compile_mode``,
    #: ``compile_backend``: a backend name or callable)
    autocast: str | None = None
    compile_mode: str | None = None
    compile_backend: Any = None

    @classmethod
    def merged(cls, base: RuntimeOptions | None = None, **keywords: Any) -> RuntimeOptions:
        """``base`` with the keywords given (not :data:`UNSET`) in place of its fields."""
        return _merged(cls, base, keywords)

    def one_file(self) -> dict[str, str]:
        """The keywords of a command that runs one file (``lt.run``): ``runtime``, ``ov_precision``,
        ``ov_device``, those given.

        Example:
            >>> RuntimeOptions(runtime="openvino").one_file()
            {'runtime': 'openvino'}
        """
        pairs = (("runtime", self.runtime), ("ov_precision", self.ov_precision), ("ov_device", self.ov_device))
        return {k: v for k, v in pairs if v is not None}


@dataclass(frozen=True)
class SampleOptions:
    """Which samples a command runs on: ``samples`` (``N`` seeded random ones, or the samples
    themselves), ``inputs`` (a path: one ``.npz``, a folder of images/``.npy``/``.npz`` files or a
    ``datasets`` folder; ``limit`` reads its first N, ``columns`` picks a ``datasets`` folder's input
    columns), the image recipe (``image_size``, ``mean``, ``std``; ``preprocess``: the model's own),
    ``save_inputs`` (write the samples run to one ``.npz``), ``seed`` (of random samples) and ``steps``
    (a decoder compared on one prompt, then this many greedy decode steps).

    Example:
        >>> o = SampleOptions.merged(SampleOptions(inputs="images", limit=8, seed=5), limit=2, seed=0)
        >>> o.inputs, o.limit, o.seed
        ('images', 2, 0)
    """

    samples: int | Sequence[Any] | None = None
    inputs: str | os.PathLike | None = None
    limit: int | None = None
    columns: Sequence[str] | None = None
    image_size: Any = None
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    preprocess: Any = None  # a samples.images.Preprocess: the model's own recipe
    save_inputs: str | os.PathLike | None = None
    seed: int = 0
    steps: int | None = None

    @classmethod
    def merged(cls, base: SampleOptions | None = None, **keywords: Any) -> SampleOptions:
        """``base`` with the keywords given (not :data:`UNSET`) in place of its fields."""
        return _merged(cls, base, keywords)

    @property
    def recipe(self) -> tuple[Any, Any, Any, Any]:
        """``(preprocess, image_size, mean, std)``: how images are read."""
        return self.preprocess, self.image_size, self.mean, self.std


def merged_criterion(base: Criterion | None = None, **keywords: Any) -> tuple[Criterion, bool]:
    """``base`` (else the default rule) with the keywords given (not :data:`UNSET`) in place of its
    fields, and whether the tolerances were chosen (an ``rtol`` or ``atol`` keyword, or an object whose
    tolerances are not the defaults): a rule nobody chose may be fitted to a runtime's reduced precision,
    a chosen one never is. ``rtol=None`` / ``atol=None`` given stand for the default tolerance, not chosen.

    Example:
        >>> c, chosen = merged_criterion(Criterion(metric="cosine"), min_cosine=0.99, rtol=UNSET)
        >>> c.metric, c.min_cosine, chosen
        ('cosine', 0.99, False)
        >>> merged_criterion(Criterion(metric="cosine"), metric="rel")[0].metric
        'rel'
        >>> merged_criterion(None, rtol=1e-3)[1]
        True
    """
    obj = base if base is not None else Criterion()
    if not isinstance(obj, Criterion):
        raise LayertapError(f"expected a layertap.metrics.Criterion, got {type(obj).__name__}; build one with "
                            "Criterion(metric=..., rtol=...) or give the keywords instead")
    chosen_now = {k: v for k, v in given(**keywords).items() if k in ("rtol", "atol")}
    defaults = {"rtol": DEFAULT_RTOL, "atol": DEFAULT_ATOL}
    others = {k: v for k, v in keywords.items() if k not in ("rtol", "atol")}
    tolerances: dict[str, Any] = {k: defaults[k] if v is None else v for k, v in chosen_now.items()}
    rule = dataclasses.replace(_merged(Criterion, obj, others), **tolerances)
    chosen = any(v is not None for v in chosen_now.values()) or (rule.rtol, rule.atol) != (DEFAULT_RTOL, DEFAULT_ATOL)
    return rule, chosen


@dataclass(frozen=True)
class Model:
    """A PyTorch model as a command takes it: ``source`` (an ``nn.Module``, or a MODEL spec:
    ``torchvision:resnet18``, ``timm:NAME``, ``transformers:CLASS``, ``pkg.module:ATTR``,
    ``path/file.py:ATTR``), how a spec is loaded (``weights``: a state dict file, ``.pt``/``.pth`` or
    ``.safetensors``; ``weights_key``: the checkpoint entry holding it; ``weights_strict``; ``config``:
    a transformers config; ``unsafe_pickle``: accept a pickled whole module, which runs code from the
    file) and how it is called (``method``: the method run instead of ``forward``, by name or
    ``fn(model, *args, **kwargs)``; ``kwargs``: keyword arguments of every call).

    ``lt.compare``, ``lt.repro``, ``lt.fix`` and ``lt.extract_dataset`` take one wherever they take a
    model; a plain module or spec is ``Model(source)``.

    Example:
        >>> m = Model("torchvision:resnet18", method="forward")
        >>> Model.of(m) is m, Model.of("timm:vit_tiny_patch16_224").source, m.spec
        (True, 'timm:vit_tiny_patch16_224', 'torchvision:resnet18')
    """

    source: Any
    weights: str | os.PathLike | None = None
    weights_key: str | None = None
    weights_strict: bool = True
    config: str | os.PathLike | None = None
    unsafe_pickle: bool = False
    method: str | Callable[..., Any] = "forward"
    kwargs: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, model: Any) -> "Model":
        """``model`` as a :class:`Model` (itself when it is one)."""
        return model if isinstance(model, cls) else cls(model)

    @property
    def spec(self) -> str | None:
        """The MODEL spec text, when the source is one (``None`` for a module); the source may also be the
        :class:`~layertap.specs.ModelSpec` the CLI checked (it is not checked again)."""
        if isinstance(self.source, str):
            return self.source
        return getattr(self.source, "text", None) if type(self.source).__name__ == "ModelSpec" else None

    @property
    def loading(self) -> dict[str, Any]:
        """The keywords of :func:`layertap.pytorch.models.load_model` this model's files give."""
        return dict(weights=None if self.weights is None else os.fspath(self.weights), config=self.config,
                    unsafe_pickle=self.unsafe_pickle, weights_key=self.weights_key, weights_strict=self.weights_strict)


@dataclass(frozen=True)
class ExportOptions:
    """How ``lt.export`` writes the file, beyond its everyday keywords: ``opset``, ``input_names``,
    ``fallback`` (try the other exporter when the first fails), ``external_data`` (weights in a
    ``.data`` file; ``None``: when the model is over 2 GB), ``dynamic_sequence`` (a symbolic sequence
    axis), ``kv_cache`` (a decoder's cache as inputs and outputs); for an ExecuTorch program (``.pte``):
    ``backend`` (``xnnpack`` or ``portable``), ``quantize`` (``int8``: the XNNPACK quantizer, pt2e) and
    ``calibration`` (its samples: a list of samples like ``args``, ``N`` random ones, or a path read as
    ``--inputs`` reads one: a ``.npz`` or a folder; default 16 random); for a LiteRT program (``.tflite``):
    ``quantize`` (``int8``: AI Edge Quantizer's static int8, calibrated on ``calibration``; ``dynamic``: int8
    weights, activations quantised as the kernels run).

    Example:
        >>> ExportOptions.merged(ExportOptions(opset=17), fallback=True).fallback
        True
        >>> ExportOptions(backend="portable").quantize is None
        True
    """

    opset: int | None = None
    input_names: Sequence[str] | None = None
    fallback: bool = False
    external_data: bool | None = None
    dynamic_sequence: bool = False
    kv_cache: bool = False
    backend: str = "xnnpack"
    quantize: str | None = None
    calibration: Any = None

    @classmethod
    def merged(cls, base: ExportOptions | None = None, **keywords: Any) -> ExportOptions:
        """``base`` with the keywords given (not :data:`UNSET`) in place of its fields."""
        return _merged(cls, base, keywords)


@dataclass(frozen=True)
class DatasetOptions:
    """How ``lt.extract_dataset`` stores and runs, beyond its everyday keywords: ``dtype`` of the stored
    floating features (``float32``, ``float16``, ``bfloat16``), ``shard_size`` (samples per shard, or a
    size such as ``"256MB"``), ``skip_bad`` (record unreadable samples and go on), ``workers`` (loader
    processes; threads for ONNX files), ``stop_early`` (as for ``lt.extract``), ``engine`` (``local`` or
    ``ray``; ``ray_address`` joins a cluster) and ``progress`` (a progress bar; ``None``: when stderr is a
    terminal).

    Example:
        >>> DatasetOptions.merged(DatasetOptions(workers=2), dtype="float16").workers
        2
    """

    dtype: str = "float32"
    shard_size: int | str = "256MB"
    skip_bad: bool = False
    workers: int = 0
    stop_early: bool = False
    engine: str = "local"
    ray_address: str | None = None
    progress: bool | None = None

    @classmethod
    def merged(cls, base: DatasetOptions | None = None, **keywords: Any) -> DatasetOptions:
        """``base`` with the keywords given (not :data:`UNSET`) in place of its fields."""
        return _merged(cls, base, keywords)


@dataclass(frozen=True)
class SearchOptions:
    """How ``lt.fix`` searches, beyond its everyday keywords: ``naive`` (one unit at a time in graph
    order, no ranking: what the ranking is measured against), ``rank_report`` (a comparison of a plain
    conversion with REF to rank by; else one is made), ``exporter`` (how a PyTorch REF is exported:
    ``dynamo`` or ``torchscript``), ``on_step`` (called with each step as it is measured) and ``runtime``
    (``"executorch"``: the conversion is an int8 ExecuTorch program).

    Example:
        >>> SearchOptions(naive=True).exporter
        'dynamo'
    """

    naive: bool = False
    rank_report: Any = None
    exporter: str = "dynamo"
    on_step: Callable[[Any], None] | None = None
    #: what runs the conversion: ``None`` (an ONNX file in ONNX Runtime), ``"executorch"`` (an int8 ExecuTorch
    #: program, XNNPACK; also chosen by an output path ending in ``.pte``) or ``"inductor"`` (modules kept eager in
    #: a torch.compile)
    runtime: str | None = None
    #: the runtime's own settings, by :class:`~layertap.runtimes.plugins.RuntimeSettings` field
    #: (``{"compile_backend": fn, "compile_mode": "max-autotune"}``)
    runtime_settings: dict[str, Any] = field(default_factory=dict)


_PROGRESS: contextvars.ContextVar[Any] = contextvars.ContextVar("layertap_progress", default=None)


@contextlib.contextmanager
def reporting(progress: Any) -> Iterator[None]:
    """Inside this block, commands that report steps (``lt.compare``, ``lt.repro``) send them to
    ``progress`` (an object with ``step(text)`` and ``advance(n)``; see
    :class:`layertap.comparing.driver.Progress`).

    Example:
        >>> class Steps:
        ...     def __init__(self): self.seen = []
        ...     def step(self, text, total=None): self.seen.append(text)
        ...     def advance(self, n=1): pass
        >>> with reporting(Steps()) as _:
        ...     current_progress() is not None
        True
        >>> current_progress() is None
        True
    """
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def current_progress() -> Any:
    """The receiver of :func:`reporting` in force here, else ``None`` (silent)."""
    return _PROGRESS.get()
