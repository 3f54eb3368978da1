"""Inputs for running an ONNX file: the ones given, checked, and generated ones a model accepts.

Generated inputs follow the model by the package's one rule
(:func:`layertap.inputs.random_input`): fixed dimensions as declared; a symbolic
dimension named by a number is that number; the batch axis is 1; a 4-D float
input is an image (3 channels, 224x224); other symbolic axes are 16 (512 for
the samples axis of a 2-D float input such as audio); inputs named ``*mask*``
are all ones. Integers feeding a ``Gather`` (an embedding table) stay below
that table's size. Every generated input is described in one line
(:meth:`Feeds.note`), and an ONNX Runtime refusal on generated inputs says so.

A 0-d input can be given as its value: ``--input sr=16000:int64`` reads
``16000`` as the value when the model's ``sr`` is a scalar (a 1-D shape could
never fit it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..errors import InputSpecError, unknown_name
from ..inputs import DEFAULT_INT_HIGH, InputSpec, random_input
from .kvcache import KvLayout, complete_feeds, kv_layout
from .shapes import declared_dims
from .tensor_types import ORT_NUMPY

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_PASS_THROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand", "Clip"}
_HOW_TO_PASS = "pass them with --input NAME=SHAPE[:DTYPE] or NAME=FILE.npy (lt.run(..., inputs={NAME: array}))"


@dataclass
class Feeds:
    """Arrays to feed, and a description of each one that was generated.

    Example:
        >>> Feeds({"x": np.zeros(2)}, ["x=2 float32 (normal)"]).note().split(";")[0]
        'generated inputs: x=2 float32 (normal)'
    """

    arrays: dict[str, np.ndarray]
    generated: list[str] = field(default_factory=list)
    cache: str | None = None  # what a decoder file's cache inputs were made of (kvcache.complete_feeds)

    def options(self) -> str:
        """``--input`` options that would give the generated inputs explicitly (to edit).

        Example:
            >>> Feeds({"ids": np.zeros((1, 16), np.int64), "sr": np.array(3)}, ["ids=...", "sr=..."]).options()
            '--input ids=1x16:int64 --input sr=VALUE:int64'
        """
        names = [g.split("=", 1)[0] for g in self.generated]
        return " ".join(f"--input {n}={_shape_text(self.arrays[n])}:{self.arrays[n].dtype.name}" for n in names)

    def note(self) -> str | None:
        """One line naming the generated inputs, or ``None`` when all were given."""
        if not self.generated:
            return self.cache
        cache = f"; {self.cache}" if self.cache else ""
        return f"generated inputs: {', '.join(self.generated)}{cache}; {_HOW_TO_PASS}"


def make_feeds(sess: Any, graph: "onnx.GraphProto", inputs: Any, seed: int = 0, *,
               folder: Path | None = None, config: Any = None) -> Feeds:
    """Check the given inputs against the engine's and generate the missing ones.

    ``sess``: anything whose ``get_inputs()`` lists the inputs with ``name``, ``type`` (ONNX Runtime's
    text, ``tensor(int64)``) and ``shape`` (a runtime's engine). ``inputs``: ``None``, a dict name ->
    array or :class:`~layertap.inputs.InputSpec`,
    or a list of those in input order. A decoder file's missing cache inputs make a
    prefill (:func:`~layertap.onnxfile.kvcache.complete_feeds`: empty past sized by the
    file, ``config`` or the config next to it in ``folder``; mask and positions).

    Example:
        >>> import onnx.helper as h
        >>> from types import SimpleNamespace as Engine
        >>> g = h.make_graph([h.make_node("Gather", ["E", "ids"], ["y"])], "g",
        ...     [h.make_tensor_value_info("ids", 7, ["batch", "seq"])], [h.make_tensor_value_info("y", 1, None)],
        ...     [h.make_tensor("E", 1, [5, 2], [0.0] * 10)])
        >>> engine = Engine(get_inputs=lambda: [Engine(name="ids", type="tensor(int64)", shape=["batch", "seq"])])
        >>> f = make_feeds(engine, g, None)
        >>> f.arrays["ids"].shape, int(f.arrays["ids"].max()) < 5, f.generated
        ((1, 16), True, ['ids=1x16 int64 in [0, 5)'])
    """
    specs = sess.get_inputs()
    given = _given(specs, inputs)
    bounds = _GatherBounds(graph)
    made = _from_specs(specs, given, bounds, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    feeds = Feeds({})
    layout = kv_layout(graph)
    for spec in specs:
        dtype = ORT_NUMPY.get(spec.type)
        value = made.get(spec.name, given.get(spec.name))
        if value is None and layout is not None and spec.name in layout.names:
            continue  # made below, to fit the tokens
        if value is not None:
            arr = np.asarray(value)
            arr = arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
            _check_input(spec, arr.shape, arr.dtype, dtype)
            feeds.arrays[spec.name] = arr
            continue
        if dtype is None:
            raise InputSpecError(f"cannot make random data for input {spec.name!r} of type {spec.type}; pass it "
                                 "with --input NAME=FILE.npy")
        arr, text = random_input(spec.name, spec.shape or [], dtype, rng, int_high=bounds.high(spec.name))
        feeds.arrays[spec.name] = arr
        feeds.generated.append(text)
    if layout is not None:
        _add_cache(feeds, layout, specs, folder, config)
    return feeds


def _add_cache(feeds: Feeds, layout: KvLayout, specs: Sequence[Any], folder: Path | None, config: Any) -> None:
    """A decoder file's cache inputs, made to fit the tokens and the past given (in input order)."""
    made, feeds.cache = complete_feeds(layout, feeds.arrays, config=config, folder=folder)
    missing = [s.name for s in specs if s.name not in feeds.arrays and s.name not in made]
    if missing:
        raise InputSpecError(f"cannot make input {missing[0]!r} of this decoder file without its token ids "
                             f"({layout.ids or 'input_ids'}); {_HOW_TO_PASS}")
    for spec in specs:
        if spec.name in made:
            want = ORT_NUMPY.get(spec.type)
            arr = made[spec.name] if want is None else made[spec.name].astype(want, copy=False)
            _check_input(spec, arr.shape, arr.dtype, want)
            feeds.arrays[spec.name] = arr
    feeds.arrays = {s.name: feeds.arrays[s.name] for s in specs}


def _shape_text(arr: np.ndarray) -> str:
    return "x".join(str(d) for d in arr.shape) if arr.ndim else "VALUE"


def _given(specs: Sequence[Any], inputs: Any) -> dict[str, Any]:
    names = [s.name for s in specs]
    if inputs is None:
        return {}
    if isinstance(inputs, Mapping):
        extra = [k for k in inputs if k not in names]
        if extra:
            raise InputSpecError(unknown_name("input", extra[0], names, hint=f"the model's inputs are {', '.join(names)}"))
        return dict(inputs)
    seq = list(inputs)
    if len(seq) != len(names):
        raise InputSpecError(f"the model takes {len(names)} input(s) ({', '.join(names)}), got {len(seq)}")
    return dict(zip(names, seq))


def _from_specs(specs: Sequence[Any], given: dict[str, Any], bounds: "_GatherBounds",
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Data for the :class:`InputSpec` values, each checked against its input before it is made or read.

    Specs draw from ``rng`` in the order given; integers stay below the
    embedding table they feed; a 1-D shape of one number on a 0-d input is its value.
    """
    by_name = {s.name: s for s in specs}
    out: dict[str, np.ndarray] = {}
    for name, value in given.items():
        if not isinstance(value, InputSpec):
            continue
        spec = by_name[name]
        if spec.shape is not None and len(spec.shape) == 0 and value.path is None and len(value.shape or ()) == 1:
            out[name] = np.array((value.shape or (0,))[0], dtype=np.dtype(value.dtype))
            continue
        _check_input(spec, *value.header(), ORT_NUMPY.get(spec.type))
        out[name] = value.array(rng, int_high=bounds.high(name) or DEFAULT_INT_HIGH)
    return out


def integer_bounds(graph: "onnx.GraphProto", names: Sequence[str]) -> dict[str, int | None]:
    """For each input name, the size of the embedding table a ``Gather`` indexes with it (random
    integers must stay below it), or ``None`` when it feeds no table.

    Example:
        >>> import onnx.helper as h, onnx.numpy_helper as nh
        >>> g = h.make_graph([h.make_node("Gather", ["table", "ids"], ["y"])], "g",
        ...     [h.make_tensor_value_info("ids", 7, [1, 3])], [h.make_tensor_value_info("y", 1, None)],
        ...     [nh.from_array(np.zeros((10, 4), np.float32), "table")])
        >>> integer_bounds(g, ["ids", "other"])
        {'ids': 10, 'other': None}
    """
    bounds = _GatherBounds(graph)
    return {name: bounds.high(name) for name in names}


def input_types(graph: "onnx.GraphProto") -> list[tuple[str, str]]:
    """``(name, numpy dtype name)`` of the graph's inputs (initializers left out); ``""`` for a type numpy
    lacks (bfloat16, float8), which is fed as given.

    Example:
        >>> import onnx.helper as h
        >>> input_types(h.make_graph([], "g", [h.make_tensor_value_info("x", 7, [1])], []))
        [('x', 'int64')]
    """
    import onnx

    inits = {i.name for i in graph.initializer}
    out = []
    for i in graph.input:
        if i.name in inits:
            continue
        et = i.type.tensor_type.elem_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(et).name if et else ""
        except (KeyError, ValueError, TypeError):
            dtype = ""
        out.append((i.name, dtype))
    return out


def declared_inputs(graph: "onnx.GraphProto") -> tuple[list[str], list[int | None]]:
    """The graph's input names (initializers left out) and their ranks (None: no declared shape).

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([], "g", [h.make_tensor_value_info("x", 1, [1, 3, 8, 8])], [])
        >>> declared_inputs(g), image_input_size(g)
        ((['x'], [4]), (8, 8))
    """
    inits = {i.name for i in graph.initializer}
    names, ranks = [], []
    for i in graph.input:
        if i.name in inits:
            continue
        names.append(i.name)
        tt = i.type.tensor_type
        ranks.append(len(tt.shape.dim) if tt.HasField("shape") else None)
    return names, ranks


def image_input_size(graph: "onnx.GraphProto") -> tuple[int, int] | None:
    """H, W of the graph's first input when it is a static N x C x H x W (an image model's size).

    Example:
        >>> import onnx.helper as h
        >>> image_input_size(h.make_graph([], "g", [h.make_tensor_value_info("x", 1, ["n", 3, "h", "w"])], []))
    """
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if not inputs:
        return None
    dims = declared_dims(inputs[0]) or ()
    if len(dims) == 4 and isinstance(dims[2], int) and isinstance(dims[3], int):
        return dims[2], dims[3]
    return None


class _GatherBounds:
    """Upper bounds for integer inputs: the size of the table a ``Gather`` indexes with them."""

    def __init__(self, graph: "onnx.GraphProto") -> None:
        self.graph = graph
        self.uses: dict[str, list[Any]] = {}
        for n in graph.node:
            for t in n.input:
                self.uses.setdefault(t, []).append(n)
        self.dims = {i.name: list(i.dims) for i in graph.initializer}
        self.producer = {t: n for n in graph.node for t in n.output}

    def high(self, name: str) -> int | None:
        found: list[int] = []
        todo, seen = [name], {name}
        while todo:
            t = todo.pop()
            for n in self.uses.get(t, ()):
                if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == t:
                    size = self._table_size(n)
                    if size:
                        found.append(size)
                elif n.op_type in _PASS_THROUGH and n.input and n.input[0] == t:
                    for o in n.output:
                        if o not in seen:
                            seen.add(o)
                            todo.append(o)
        return min(found) if found else None

    def _table_size(self, gather: Any) -> int | None:
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
        table = gather.input[0]
        for _ in range(4):  # through a DequantizeLinear or Cast of the table
            if table in self.dims:
                dims = self.dims[table]
                return int(dims[axis]) if -len(dims) <= axis < len(dims) else None
            node = self.producer.get(table)
            if node is None or not node.input:
                return None
            table = node.input[0]
        return None


def _check_input(spec: Any, shape: tuple[int, ...], got: np.dtype, dtype: Any) -> None:
    want = [d if isinstance(d, int) and d > 0 else None for d in (spec.shape or [])]
    shown = "x".join(str(d) if isinstance(d, int) and d > 0 else str(d or "?") for d in (spec.shape or [])) or "scalar"
    if dtype is not None and got != np.dtype(dtype):
        raise InputSpecError(
            f"input {spec.name!r} must be {np.dtype(dtype).name} with shape {shown}, got {got.name}"
        )
    if len(want) != len(shape) or any(w is not None and w != a for w, a in zip(want, shape)):
        text = "x".join(str(d) for d in shape) or "scalar"
        kind = np.dtype(dtype).name if dtype else spec.type
        raise InputSpecError(f"input {spec.name!r} must have shape {shown} ({kind}), got {text}")
