"""The samples a command runs on, from one place: :func:`samples_for` gives ``compare``, ``fix``, ``repro``,
``export --calib`` and ``extract --data`` their samples for a reference, in one form (:class:`Samples`: each
sample a call's positional and keyword arguments, :class:`Sample`). The samples are given (``args``,
``samples=[...]``), read from a path (``inputs=``: one ``.npz``, a folder, a ``datasets`` folder; a dataset
streamed for ``extract --data``), drawn from ``--input`` specs, or drawn at random at the shapes the file or
program the samples feed was made for (``shapes_from``).

numpy only: a PyTorch reference lends what needs torch through :class:`ModelReference` (its example call,
random tensors like a sample, arrays as tensors, its zoo's image recipe), so an ONNX reference never
imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import LayertapError
from ..files.writes import check_output_path
from ..inputs import InputSpec, as_specs
from ..onnxfile.feeds import declared_inputs, image_input_size, input_types, integer_bounds
from ..onnxfile.kvcache import kv_layout
from ..onnxfile.shapes import input_dims
from ..onnxfile.tensor_types import ORT_NUMPY
from ..options import SampleOptions
from .declared import as_feeds
from .drawn import given_samples, random_for_file, spec_samples, with_cache
from .images import choose_recipe
from .loading import load_samples
from .sources import open_source

if TYPE_CHECKING:  # pragma: no cover
    from .declared import Declared
    from .images import Preprocess
    from .sources import IterSource, MapSource


@dataclass(frozen=True)
class Sample:
    """One sample as a call takes it: positional ``args`` and keyword ``kwargs`` (arrays, or tensors a PyTorch
    reference holds). A file's feed is its keywords by input name, else its arguments in input order.

    Example:
        >>> s = Sample.of({"x": np.zeros(2)})
        >>> s.args, list(s.kwargs), Sample.of(np.ones(2)).feed(["x"])["x"].tolist()
        ((), ['x'], [1.0, 1.0])
    """

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any) -> Sample:
        """A sample given as a dict (by input name), a tuple/list (in input order) or one array/tensor."""
        if isinstance(value, Sample):
            return value
        if isinstance(value, dict):
            return cls((), dict(value))
        return cls(tuple(value) if isinstance(value, (tuple, list)) else (value,))

    def given(self) -> dict[str, Any] | list[Any]:
        """The sample as a file's reference takes it: a dict by input name, else the arrays in input order."""
        return dict(self.kwargs) if self.kwargs and not self.args else list(self.args)

    def feed(self, names: Sequence[str]) -> dict[str, Any]:
        """The sample by input name: its keywords, else its arguments named in ``names``' order."""
        return dict(self.kwargs) if self.kwargs and not self.args else dict(zip(names, self.args))


@dataclass(frozen=True)
class Samples:
    """The samples a command runs on, in order (``items``); for ``extract --data``, the dataset itself
    (``source``, read as the extraction streams it).

    Example:
        >>> s = Samples((Sample((np.zeros(1),)), Sample((), {"x": np.ones(1)})))
        >>> len(s), [type(g).__name__ for g in s.given()], s.calls()[1]
        (2, ['list', 'dict'], ((), {'x': array([1.])}))
    """

    items: tuple[Sample, ...] = ()
    source: MapSource | IterSource | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.items)

    def __getitem__(self, index: int) -> Sample:
        return self.items[index]

    def calls(self) -> list[tuple[tuple, dict]]:
        """``(args, kwargs)`` of each sample: how a PyTorch model is called on them."""
        return [(s.args, dict(s.kwargs)) for s in self.items]

    def given(self) -> list[Any]:
        """Each sample as a file's reference takes it (:meth:`Sample.given`)."""
        return [s.given() for s in self.items]

    def feeds(self, declared: list[Declared], what: str) -> list[dict[str, np.ndarray]]:
        """Each sample as a feed of a file's declared inputs, checked and cast (:func:`.declared.as_feeds`)."""
        return as_feeds(self.given(), declared, what)


@runtime_checkable
class ModelReference(Protocol):
    """What a PyTorch reference lends its samples (:class:`layertap.pytorch.reference.Loaded`): what needs torch."""

    def example(self, args: Any, sampling: SampleOptions) -> tuple[Any, dict[str, Any], SampleOptions]:
        """``(args, kwargs, sampling)``: its example call, ``--input`` specs drawn as the model accepts them."""

    def like(self, args: tuple, seed: int) -> tuple:
        """Random arguments shaped and typed like ``args``, drawn from ``seed``."""

    def tensors(self, arrays: Sequence[np.ndarray]) -> tuple:
        """Arrays as the model's positional arguments."""

    def recipe(self) -> Preprocess | None:
        """The image recipe its zoo records."""


@dataclass(frozen=True)
class _Inputs:
    """What the samples feed: input names, ranks (``None``: any), the fixed image size, the file itself
    (to draw at its declared shapes) and the folder of its config, or a program's ``--input`` specs."""

    names: list[str]
    ranks: list[int | None]
    image_size: tuple[int, int] | None = None
    model: Any = None
    folder: Path | None = None
    specs: list[InputSpec] | None = None


def _inputs(shapes_from: Any, folder: Path | None) -> _Inputs | None:
    """``shapes_from`` read: an ONNX model (or a read file), a program's inputs (``.name``, ``.type``, ``.shape``),
    or ranks of positional inputs (named ``input_0``, ...); a callable gives one of those when first needed."""
    if callable(shapes_from):
        shapes_from = shapes_from()
    if shapes_from is None:
        return None
    model = getattr(shapes_from, "model", shapes_from)  # a ModelFile holds its model
    if hasattr(model, "graph"):
        names, ranks = declared_inputs(model.graph)
        return _Inputs(names, ranks, image_input_size(model.graph), model, folder)
    items = list(shapes_from)
    if all(r is None or isinstance(r, int) for r in items):
        return _Inputs([f"input_{i}" for i in range(len(items))], items)
    shapes = [tuple(i.shape or ()) for i in items]
    image = next(((int(s[2]), int(s[3])) for s in shapes[:1] if len(s) == 4), None)
    specs = [InputSpec(None, tuple(d if isinstance(d, int) else 1 for d in s),
                       np.dtype(ORT_NUMPY.get(getattr(i, "type", ""), np.float32)).name) for i, s in zip(items, shapes)]
    return _Inputs([i.name for i in items], [len(s) or None for s in shapes], image, specs=specs)


def samples_for(ref: Any, args: Any = None, sampling: SampleOptions | None = None, *, shapes_from: Any = None,
                folder: Path | None = None, data: Any = None, same_shape: bool = False) -> Samples:
    """The samples a command runs on for ``ref``, in one form.

    Args:
        ref: a PyTorch reference (a :class:`ModelReference`: the samples are its calls' tensors), or the file
            or program ``shapes_from`` describes (anything else: the samples are arrays).
        args: one sample (a dict by input name, an array/tensor, or a tuple of them), or ``--input`` specs.
        sampling: ``samples`` (``N``, or a list that replaces ``args``), ``inputs`` (a path read for the inputs
            the samples feed; ``limit``, ``columns``, the image recipe), ``seed``; ``save_inputs`` is checked.
        shapes_from: what the samples feed: an ONNX model (its declared inputs: names and ranks to read
            ``inputs`` by, shapes and integer bounds to draw random samples at, a decoder's prefill), a
            program's inputs (the shapes it was lowered for: a model without ``args`` is drawn there), or the
            ranks of positional inputs; a callable that gives one, asked only when needed.
        folder: where a decoder file's config lives (its prefill is sized by it).
        data: a dataset streamed rather than read at once (``extract --data``: a path, a sequence, an iterable
            or a DataLoader): the result holds it as ``source`` (``same_shape`` refuses ragged token columns).

    Random samples (``samples=N`` beyond those given) are shaped like the first for a PyTorch reference, and
    drawn at the file's declared inputs otherwise, sample ``i`` from ``seed + 1 + i``.

    Example:
        >>> import onnx.helper as h
        >>> model = h.make_model(h.make_graph([], "g", [h.make_tensor_value_info("x", 1, [1, 3])], []))
        >>> from layertap.options import SampleOptions
        >>> s = samples_for(None, None, SampleOptions(samples=2), shapes_from=model)
        >>> len(s), s[0].kwargs["x"].shape, s.given()[1]["x"].dtype.name
        (2, (1, 3), 'float32')
        >>> [x.kwargs["x"].shape for x in samples_for(None, ["x=2x5"], SampleOptions(samples=2))]
        [(2, 5), (2, 5)]
    """
    sampling = sampling or SampleOptions()
    model = ref if isinstance(ref, ModelReference) else None
    lazy = _Lazy(shapes_from, folder)
    if data is not None:
        return Samples(source=open_source(data, _recipe(sampling, ref, lazy), columns=sampling.columns,
                                          same_shape=same_shape))
    if sampling.save_inputs is not None:
        inputs = (sampling.inputs,) if sampling.inputs is not None else ()
        check_output_path(sampling.save_inputs, inputs=inputs, suffixes=(".npz",))
    if model is not None:
        return _model_samples(model, args, sampling, lazy)
    specs = as_specs(args)
    if specs is not None:  # --input specs: drawn once per sample (specs beside inputs= only said the shapes)
        n = sampling.samples if isinstance(sampling.samples, int) else 1
        args = None
        if sampling.inputs is None:
            sampling = replace(sampling, samples=spec_samples(specs, n, sampling.seed))
    given, n_random = given_samples(args, _read(sampling, args, None, lazy))
    shapes = lazy.get() if n_random or any(isinstance(g, dict) for g in given) else None
    decoder = kv_layout(shapes.model.graph) if shapes is not None and shapes.model is not None else None
    items = [Sample.of(with_cache(g, decoder, shapes.folder) if isinstance(g, dict) and shapes else g) for g in given]
    return Samples(tuple(items) + tuple(Sample.of(s) for s in _random(lazy, n_random, sampling.seed, decoder)))


class _Lazy:
    """``shapes_from`` read once, when first needed."""

    def __init__(self, shapes_from: Any, folder: Path | None) -> None:
        self._from, self._folder, self._read = shapes_from, folder, False
        self._inputs: _Inputs | None = None

    def get(self) -> _Inputs | None:
        if not self._read:
            self._inputs, self._read = _inputs(self._from, self._folder), True
        return self._inputs

    def required(self, what: str) -> _Inputs:
        inputs = self.get()
        if inputs is None:
            raise LayertapError(f"{what} needs the inputs the samples feed: give the samples (args=, samples=[...])")
        return inputs


def _model_samples(model: ModelReference, args: Any, sampling: SampleOptions, lazy: _Lazy) -> Samples:
    """A PyTorch reference's samples: its example call (``--input`` specs, a program's own shapes, a spec's
    defaults), those read from ``sampling.inputs`` as tensors in input order, then random ones like the first."""
    listed = sampling.samples is not None and not isinstance(sampling.samples, int)
    if args is None and sampling.inputs is None and not listed:
        shapes = lazy.get()
        args = shapes.specs if shapes is not None and shapes.specs is not None else None
    args, kwargs, sampling = model.example(args, sampling)
    given, n_random = given_samples(None if args is None else _as_args(args), _read(sampling, args, model, lazy))
    out = [Sample((), {**kwargs, **s}) if isinstance(s, dict) else Sample(_as_args(s), kwargs) for s in given]
    seeds = range(len(given), len(given) + n_random)
    return Samples(tuple(out) + tuple(Sample(model.like(out[0].args, sampling.seed + i), kwargs) for i in seeds))


def _read(sampling: SampleOptions, args: Any, model: ModelReference | None, lazy: _Lazy) -> Any:
    """``sampling.samples``, or the samples ``sampling.inputs`` holds read for the inputs they feed (dicts by
    input name; a PyTorch reference's as tensors in input order), with the image recipe."""
    if sampling.inputs is None:
        return sampling.samples
    if args is not None or sampling.samples is not None:
        raise LayertapError("give the samples one way: inputs=PATH (--inputs), or args/samples (--input/--samples)")
    shapes = lazy.required("inputs=")
    read = load_samples(sampling.inputs, shapes.names, shapes.ranks, preprocess=_recipe(sampling, model, lazy),
                        columns=sampling.columns, limit=sampling.limit)
    return read if model is None else [model.tensors(list(s.values())) for s in read]


def _recipe(sampling: SampleOptions, model: Any, lazy: _Lazy) -> Callable[[], Preprocess | None]:
    """The image recipe, found only when images turn up: ``image_size``, else the model's own
    (``sampling.preprocess``, a zoo's), else the fixed image size of the inputs the images feed;
    ``mean``/``std`` replace the normalisation."""
    def zoo() -> Preprocess | None:
        if sampling.preprocess is not None or model is None:
            return sampling.preprocess
        return model.recipe() if hasattr(model, "recipe") else None

    def size() -> tuple[int, int] | None:
        shapes = lazy.get()
        return None if shapes is None else shapes.image_size

    return lambda: choose_recipe(sampling.image_size, sampling.mean, sampling.std, zoo, size)


def _random(lazy: _Lazy, n: int, seed: int, decoder: Any) -> list[dict[str, np.ndarray]]:
    """``n`` random samples at a file's declared inputs (:func:`.drawn.random_for_file`)."""
    if not n:
        return []
    shapes = lazy.required("random samples")
    if shapes.model is None:
        raise LayertapError("random samples are drawn at a file's declared inputs: give the samples")
    graph = shapes.model.graph
    types = input_types(graph)
    dims = {name: d for name, d in input_dims(graph).items() if d is not None}
    bounds = integer_bounds(graph, [name for name, _ in types])  # ids below each table's size
    return random_for_file(seed, decoder, shapes.folder)(types, dims, bounds, n)


def _as_args(args: Any) -> tuple:
    """A PyTorch sample's positional arguments as a tuple."""
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)

