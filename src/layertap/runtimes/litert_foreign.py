"""A LiteRT program layertap did not write (no ``m.tflite.json`` beside it), by PyTorch module path.

Such a program hands out only its signature's outputs, but LiteRT's interpreter keeps every tensor when asked
(``experimental_preserve_all_tensors``), and ``litert-torch`` names each op's output by the modules the op ran in
(:mod:`.litert_graph`). So ``layers`` lists every op's output with the module call whose value it holds, ``run``
taps them by tensor name or module path (:class:`KeptTensors`), and ``compare`` pairs each module call the
program holds a tensor for with the model's (:func:`foreign_program`): matched by module path and call, a
channels-last (NHWC) tensor put back in PyTorch's layout by its shape. Calls the converter fused into another
module's op are ``absorbed`` there; the report says which options give every module a row (the program exported
by layertap: the model converted again with a tap at every module).

:func:`explorer_nodes` names each op as Model Explorer's TFLite adapter does (its index), with the module call it
belongs to: ``compare --node-data`` for a ``.tflite``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import LayertapError, SelectorError, unknown_name
from ..numformats import Format
from ..onnxfile.formats import TensorFormats
from ..onnxfile.tensor_table import OnnxLayers, TensorRow
from ..selectors import Tap
from .executorch import check_static_shape, program_feed
from .litert_graph import (
    ModuleValue,
    ProgramGraph,
    chain_for,
    channels_first,
    module_values,
    parse_locations,
    resolve_chain,
    resolve_location,
    segment_index,
)
from .plugins import ExplorerNode, TappedProgram

#: what gives every module a row, for a program from elsewhere
EXPORT_ADVICE = ("the program carries no layertap record (m.tflite.json beside it): export it with layertap export "
                 "MODEL -o m.tflite (lt.export(model, args, 'm.tflite')) for a row per module (compare converts the "
                 "model again with a tap at every module), and --tap PATH (taps=[...]) to keep a module's value as a "
                 "named output of the program itself")
#: a program whose tensor names carry no module locations (not litert-torch's)
NO_LOCATIONS = ("its tensor names carry no module locations (litert-torch writes them), so only its outputs are "
                "compared; " + EXPORT_ADVICE.split(": ", 1)[1])


@dataclass(frozen=True)
class Pick:
    """A tensor of the program as a tap hands it out: its index, the axes order that puts a channels-last value in
    PyTorch's layout, then the shape it is read as (a Linear's 2-D output as the module's 3-D one)."""

    tensor: int
    perm: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None

    def apply(self, value: np.ndarray) -> np.ndarray:
        """``value`` in the module's layout.

        Example:
            >>> Pick(0, (0, 3, 1, 2)).apply(np.zeros((1, 4, 4, 8))).shape
            (1, 8, 4, 4)
        """
        if self.perm is not None:
            value = np.transpose(value, self.perm)
        if self.shape is not None:
            value = value.reshape(self.shape)
        return np.ascontiguousarray(value)


class KeptTensors:
    """The program run with every tensor kept (``engine``: LiteRT's interpreter opened with
    ``experimental_preserve_all_tensors``), an :class:`~.protocol.Engine`: its signature's outputs, then the
    tensors ``picks`` names (read after each run, dequantised where int8, put in the module's layout).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> interpreter = NS(get_tensor_details=lambda sg: [{"index": 3, "dtype": np.int8, "quantization": (0.5, 1)}],
        ...                  get_tensor=lambda i, sg: np.full((1, 2, 2, 1), 3, np.int8))
        >>> engine = NS(path=Path("m.tflite"), interpreter=interpreter, output_names=lambda: ["output_0"],
        ...             run=lambda names, feed: {"output_0": np.zeros(1)})
        >>> kept = KeptTensors(engine, {"act": Pick(3, (0, 3, 1, 2))})
        >>> kept.output_names(), kept.run(None, {})["act"].tolist()
        (['output_0', 'act'], [[[[1.0, 1.0], [1.0, 1.0]]]])
    """

    def __init__(self, engine: Any, picks: Mapping[str, Pick], subgraph: int = 0) -> None:
        self.engine, self.path, self.picks, self.subgraph = engine, engine.path, dict(picks), subgraph
        details = {d["index"]: d for d in engine.interpreter.get_tensor_details(subgraph)}
        self._details = {n: details.get(p.tensor, {}) for n, p in self.picks.items()}

    def get_inputs(self) -> list[Any]:
        return self.engine.get_inputs()

    def formats(self) -> dict[str, Format]:
        """The integer format each quantised tensor handed out is held in (its scale and zero point)."""
        return {n: f for n, d in self._details.items() if (f := quantised_format(d)) is not None}

    def output_names(self) -> list[str]:
        own = self.engine.output_names()
        return [*own, *[n for n in self.picks if n not in own]]

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.engine.run(None, feed)
        for name, pick in self.picks.items():
            if name not in values and (names is None or name in names):
                raw = self.engine.interpreter.get_tensor(pick.tensor, self.subgraph)
                values[name] = pick.apply(dequantised(raw, self._details[name]))
        return values if names is None else {n: values[n] for n in names}


def quantised_format(details: Mapping[str, Any]) -> Format | None:
    """The integer format an interpreter tensor is held in (its scale and zero point; ``None``: a float tensor, or
    integers that are not quantised).

    Example:
        >>> fmt = quantised_format({"dtype": np.int8, "quantization": (0.5, 1)})
        >>> float(fmt.scale), int(fmt.zero_point), quantised_format({"dtype": np.float32})
        (0.5, 1, None)
    """
    dtype = np.dtype(details.get("dtype", np.float32))
    scale, zero = details.get("quantization", (0.0, 0))
    if dtype.kind not in "iu" or not scale:
        return None
    return Format.quantised(dtype.name, np.float32(scale), np.int64(zero))


def dequantised(value: np.ndarray, details: Mapping[str, Any]) -> np.ndarray:
    """An interpreter tensor's value as float (an int8 one dequantised with its scale and zero point), a copy.

    Example:
        >>> dequantised(np.array([3], np.int8), {"dtype": np.int8, "quantization": (0.5, 1)}).tolist()
        [1.0]
    """
    fmt = quantised_format(details)
    if fmt is None:
        return np.array(value, copy=True)
    return ((value.astype(np.float32) - np.float32(fmt.zero_point)) * np.float32(fmt.scale)).astype(np.float32)


@dataclass
class Located:
    """A program's graph and the module calls its tensor names locate (:func:`~.litert_graph.module_values`).

    Example:
        >>> from layertap.runtimes.litert_graph import Op
        >>> graph = ProgramGraph([Op(0, "CONV_2D", (0,), (1,))], ["x", "m.Net/m.Conv_conv;1"], [(1, 3, 4, 4), (1, 4, 4, 8)],
        ...                      ["float32"] * 2, {"x": 0}, {"y": 1})
        >>> located = Located(graph, module_values(graph), graph.channels_last())
        >>> [(v.location.chain, v.call) for v in located.held], located.shown_shape(1)
        ([('conv', 0)], [1, 8, 4, 4])
    """

    graph: ProgramGraph
    values: list[ModuleValue]
    channels_last: set[int] = field(default_factory=set)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Located":
        graph = ProgramGraph.read(path)
        return cls(graph, module_values(graph), graph.channels_last())

    @property
    def held(self) -> list[ModuleValue]:
        """The module calls a tensor holds."""
        return [v for v in self.values if v.tensor is not None]

    def pick(self, tensor: int) -> Pick:
        """A tensor as ``run`` hands it out: channels-last ones in PyTorch's layout."""
        if tensor in self.channels_last:
            return Pick(tensor, channels_first(self.graph.shapes[tensor]))
        return Pick(tensor)

    def shown_shape(self, tensor: int) -> list[int]:
        shape = self.graph.shapes[tensor]
        perm = self.pick(tensor).perm
        return [int(shape[i]) for i in perm] if perm is not None else [int(d) for d in shape]


def foreign_layers(path: str | os.PathLike, engine: Any) -> OnnxLayers:
    """``layertap layers m.tflite`` for a program from elsewhere: its inputs, its outputs, then every op's output
    with the module call whose value it holds (the innermost, where several end at one tensor).

    Example:
        >>> foreign_layers("missing.tflite", None)
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such LiteRT program: 'missing.tflite'
    """
    located = Located.read(path)
    graph = located.graph
    rows = [TensorRow(i.name, "input", None, _dtype(graph, graph.inputs.get(i.name)), i.shape, None, None)
            for i in engine.get_inputs()]
    own = {t: n for n, t in graph.outputs.items()}
    owner: dict[int, ModuleValue] = {}
    for v in located.held:  # sorted outer first for the same op: the innermost wins
        owner[v.tensor] = v  # type: ignore[index]
    for op in graph.ops:
        for t in op.outputs:
            held = owner.get(t)
            rows.append(TensorRow(own.get(t, graph.short_names[t]), "output" if t in own else op.kind, str(op.index),
                                  _dtype(graph, t), located.shown_shape(t), held.location.chain if held else None,
                                  held.call if held else None))
    table = OnnxLayers(rows, source="litert-torch" if located.held else "none")
    table.__dict__["title"] = "LiteRT program: its tensors"
    table.notes.append(_located_note(located) if located.held else NO_LOCATIONS)
    return table


def _located_note(located: Located) -> str:
    held, fused = len(located.held), sum(v.tensor is None for v in located.values)
    return (f"module paths come from the locations litert-torch writes into tensor names: {held} module calls have a "
            f"tensor, {fused} were fused into other ops; a path names the modules that ran, not containers never "
            "called (layers.0 of an nn.ModuleList shows as 0; --tap takes either); channels-last (NHWC) tensors are "
            "shown and handed out in PyTorch's layout (NCHW); " + EXPORT_ADVICE)


def _dtype(graph: ProgramGraph, tensor: int | None) -> str | None:
    return graph.dtypes[tensor] if tensor is not None else None


def run_foreign(kept: Any, inputs: Any, taps: Sequence[str], *, seed: int = 0,
                notify: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """``lt.run`` of a program from elsewhere with taps: its outputs, then each tap (a tensor name, or a module path
    its tensor names locate, ``PATH#k`` for one call) read from the interpreter; ``kept``: the program opened
    with every tensor kept (a :class:`~.litert.LiteRTEngine` with ``preserve_all=True``).

    Example:
        >>> from types import SimpleNamespace
        >>> run_foreign(SimpleNamespace(path=Path("missing.tflite")), None, ["layer1"])
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such LiteRT program: 'missing.tflite'
    """
    located = Located.read(kept.path)
    picks: dict[str, Pick] = {}
    own = set(kept.output_names())
    for text in taps:
        if str(text) not in own:  # the program's own outputs come anyway
            picks.update(_resolve_tap(located, str(text)))
    engine = KeptTensors(kept, picks, located.graph.subgraph)
    feed = program_feed(engine, inputs, seed, notify)  # type: ignore[arg-type]
    return engine.run(None, feed)


def _resolve_tap(located: Located, text: str) -> dict[str, Pick]:
    """One tap: a tensor name as it is, else a module path (or its chain) and call; ``{name: pick}``."""
    graph = located.graph
    tensor = graph.tensor_named(text)
    if tensor is not None:
        return {text: located.pick(tensor)}
    try:
        tap = Tap.parse(text)
    except SelectorError:
        raise LayertapError(unknown_name("tensor", text, graph.short_names)) from None
    if tap.port != "output" or tap.index or tap.pos is not None:
        raise LayertapError(f"tap {text!r}: a program's tensors are module outputs; taps on them take PATH or "
                            "PATH#CALL (no :input, [INDEX] or @POS)")
    chain = chain_for(tap.path, {v.location.chain for v in located.values})
    calls = [v for v in located.values if v.location.chain == chain] if chain is not None else []
    if not calls or not tap.path:
        known = sorted({v.location.chain for v in located.held})
        raise LayertapError(unknown_name("tap", text, known, hint="the module paths this program's tensor names "
                                         "locate (layertap layers m.tflite lists them), or a tensor name"))
    if tap.call is not None:
        if not -len(calls) <= tap.call < len(calls):
            raise LayertapError(f"tap {text!r}: {tap.path} ran {len(calls)} time(s) in the program")
        calls = [calls[tap.call]]
        names = [tap.name]
    else:
        names = [tap.name] if len(calls) == 1 else [f"{tap.name}#{v.call}" for v in calls]
    out = {}
    for name, v in zip(names, calls):
        if v.tensor is None:
            into = f"{v.fused_into.chain}'s op" if v.fused_into is not None else "other ops"
            raise LayertapError(f"tap {text!r}: no tensor of the program holds {v.location.chain}#{v.call}: the "
                                f"converter fused it into {into}; tap that, or export the model with layertap export "
                                f"MODEL -o m.tflite --tap {tap.path}")
        out[name] = located.pick(v.tensor)
    return out


@dataclass
class CallMap:
    """The model's module calls paired with the program's tensors (:func:`match_calls`): the names of each call's
    tensors, how each reads as the module's output, the calls fused into another's op and why others have none.

    Example:
        >>> CallMap().names
        {}
    """

    names: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    picks: dict[str, Pick] = field(default_factory=dict)
    absorbed: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    missing: dict[tuple[str, int], str] = field(default_factory=dict)


def match_calls(located: Located, shapes: Mapping[tuple[str, int], tuple[int, ...] | None],
                classes: Mapping[str, str], wanted: Callable[[str], bool] = lambda p: True) -> CallMap:
    """Each module call of the model (``shapes``: its output shape, by ``(path, call)``; ``classes``: each module's
    class) paired with the tensor the program holds its value in, matched by module path (each location level
    by its class and attribute) and call; calls fused into another op absorbed there.

    Example:
        >>> from layertap.runtimes.litert_graph import Op
        >>> graph = ProgramGraph([Op(0, "CONV_2D", (0,), (1,))], ["x", "m.Net/m.Conv_conv;1"], [(1, 3, 4, 4), (1, 4, 4, 8)],
        ...                      ["float32"] * 2, {"x": 0}, {"y": 1})
        >>> located = Located(graph, module_values(graph), graph.channels_last())
        >>> match_calls(located, {("conv", 0): (1, 8, 4, 4)}, {"": "m.Net", "conv": "m.Conv"}).names
        {('conv', 0): ('conv;1',)}
    """
    index = segment_index(classes)
    by_path: dict[str, list[ModuleValue]] = {}
    for v in located.values:
        path = resolve_location(v.location, index)
        if path is not None and wanted(path):
            by_path.setdefault(path, []).append(v)
    counts: dict[str, int] = {}
    for path, _ in shapes:
        counts[path] = counts.get(path, 0) + 1
    out = CallMap()
    call_of = {(v.location, k): v.call for v in located.values for k in v.ops}  # the call an op belongs to
    for path, values in by_path.items():
        ran = counts.get(path, 0)
        if ran and len(values) != ran:
            for c in range(ran):
                out.missing[(path, c)] = (f"its {ran} calls are {len(values)} groups of ops in the program (calls "
                                          "run back to back join): not told apart")
            continue
        for v in values if ran else ():
            _match_one(located, (path, v.call), v, shapes.get((path, v.call)), index, call_of, out)
    return out


def _match_one(located: Located, key: tuple[str, int], value: ModuleValue, shape: tuple[int, ...] | None,
               index: Mapping[str, Sequence[str]], call_of: Mapping[tuple[Any, int], int], out: CallMap) -> None:
    if value.tensor is None:
        holder = resolve_location(value.fused_into, index) if value.fused_into is not None else None
        if holder is not None:
            out.absorbed[key] = (holder, call_of.get((value.fused_into, value.fused_op or 0), 0))
        else:
            out.missing[key] = "the converter fused it away: no tensor of the program holds its value"
        return
    if shape is None:
        out.missing[key] = "its output is not one floating tensor"
        return
    pick = fit(located, value.tensor, shape)
    if pick is None:
        have = list(located.graph.shapes[value.tensor])
        out.missing[key] = (f"the program's tensor of it ({located.graph.short_names[value.tensor]}) has shape {have}, "
                            f"the module's output {list(shape)}")
        return
    name = located.graph.short_names[value.tensor]
    out.names[key], out.picks[name] = (name,), pick


def fit(located: Located, tensor: int, shape: Sequence[int]) -> Pick | None:
    """How the program's ``tensor`` reads as a module output of ``shape``: as it is, channels-last put back in
    PyTorch's layout (the graph's own layout first, where a shape fits both), or reshaped where only size-1 axes
    or merged leading axes differ; ``None``: it cannot be that output.

    Example:
        >>> graph = ProgramGraph([], ["t"], [(1, 4, 4, 8)], ["float32"], {}, {})
        >>> fit(Located(graph, []), 0, (1, 8, 4, 4))
        Pick(tensor=0, perm=(0, 3, 1, 2), shape=None)
    """
    have, want = tuple(located.graph.shapes[tensor]), tuple(int(d) for d in shape)
    perm = channels_first(have) if len(have) >= 3 else None
    moved = tuple(have[i] for i in perm) if perm is not None else None
    layouts = [(perm, moved), (None, have)] if tensor in located.channels_last else [(None, have), (perm, moved)]
    for p, got in layouts:
        if got == want:
            return Pick(tensor, p)
    for p, got in layouts:
        if got is not None and _reshapes(got, want):
            return Pick(tensor, p, want)
    return None


def _reshapes(have: Sequence[int], want: Sequence[int]) -> bool:
    """Whether ``have`` is ``want`` with size-1 axes or leading axes merged (a Linear's ``[B*T, C]``)."""
    if int(np.prod(have)) != int(np.prod(want)) or not want:
        return False
    return [d for d in have if d != 1] == [d for d in want if d != 1] or (bool(have) and have[-1] == want[-1])


@dataclass
class ModelCalls:
    """What the model's forward on one sample says of its module calls (the PyTorch side's, handed in): each
    call's output shape (``None``: not one floating tensor), each module's class, and which module returns each
    of the model's outputs (``output``, ``output[0]``).

    Example:
        >>> ModelCalls({("fc", 0): (1, 10)}, {"": "m.Net", "fc": "torch.nn.modules.linear.Linear"}, {"fc": ["output"]}).owners
        {'fc': ['output']}
    """

    shapes: dict[tuple[str, int], tuple[int, ...] | None]
    classes: dict[str, str]
    owners: dict[str, list[str]]


def foreign_program(path: str | os.PathLike, runs: list[tuple[tuple, dict]], wanted: Callable[[str], bool],
                    engines: tuple[Any, Callable[[], Any]], runtime: Any, own: list[str],
                    model_calls: Callable[[tuple, dict], ModelCalls]) -> TappedProgram:
    """A program from elsewhere as a compare candidate: the program (``engines``: it, and a maker of it opened with
    every tensor kept), and beside it the program run with every tensor kept, its tensors paired with the model's
    module calls (:func:`match_calls`; ``model_calls``: the model's forward on a sample's arguments).

    Example:
        >>> foreign_program("missing.tflite", [((), {})], bool, (None, None), None, ["output_0"], None)
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such LiteRT program: 'missing.tflite'
    """
    engine, keeping = engines
    located = Located.read(path)
    if not located.held:
        return TappedProgram(Path(path), engine, runtime, own, untapped=NO_LOCATIONS)
    args, kwargs = runs[0]
    for info, a in zip(engine.get_inputs(), args):
        check_static_shape(info, list(getattr(a, "shape", [])), engine.path.name,
                           f"give --input {'x'.join(str(d) for d in info.shape or [])}")
    model = model_calls(tuple(args), kwargs)
    shapes = model.shapes
    calls = match_calls(located, shapes, model.classes, wanted)
    if len(own) == 1:  # the module that returns the model's output holds the program's output
        for path_, outs in model.owners.items():
            key = (path_, 0)
            if outs == ["output"] and key not in calls.names and wanted(path_):
                calls.names[key] = (own[0],)
                calls.missing.pop(key, None)
                calls.absorbed.pop(key, None)
    tapped = KeptTensors(keeping(), calls.picks, located.graph.subgraph)
    formats = {**tapped.formats(), **{n: f for n in own for f in [engine.output_format(n)] if f is not None}}
    held = sum(1 for k in shapes if k in calls.names)
    rows_from = (f"module rows come from the program's own tensors, kept by LiteRT's interpreter "
                 f"(experimental_preserve_all_tensors) and found by the module locations litert-torch writes into "
                 f"tensor names: {held} of {len(shapes)} module calls have one, {len(calls.absorbed)} were fused into "
                 "another module's op (absorbed); channels-last (NHWC) tensors are compared in PyTorch's layout")
    if formats:  # int8 tensors: judged at int8 by the fixed rule (no ideal run: no recipe to run the model by)
        runtime.precision = "int8"
        rows_from += ("; its int8 tensors are judged by the fixed rule at int8's rounding, with no ideal run (a "
                      "program layertap exports is judged against the model run at the program's own scales)")
    return TappedProgram(Path(path), engine, runtime, own, tapped, calls.names, untapped=EXPORT_ADVICE,
                         formats=TensorFormats(formats) if formats else None,
                         absorbed=calls.absorbed, missing=calls.missing, rows_from=rows_from,
                         unmatched="no tensor of the program carries its location: the converter fused it away, or "
                                   "it computes nothing of its own")


def chain_locator(paths: Sequence[str]) -> Callable[[str], list[str]]:
    """A constant's name in a program converted from elsewhere -> the module paths (of ``paths``, the model's) its
    locations name, the producing op's first (:func:`~.litert_graph.parse_locations`, each chain resolved by
    :func:`~.litert_graph.resolve_chain`): the weight check's reading of a name.

    Example:
        >>> name = "m.Net/torch.nn.modules.linear.Linear_fc;1"
        >>> chain_locator(["fc", "head.fc"])(name), chain_locator(["body"])(name)
        (['fc'], [])
    """
    def locate(name: str) -> list[str]:
        out: list[str] = []
        for loc in parse_locations(name):
            found = resolve_chain(loc.chain, paths)
            if found is not None and found not in out:
                out.append(found)
        return out

    return locate


def explorer_nodes(path: str | os.PathLike, paths: Sequence[str]) -> list[ExplorerNode]:
    """Every op of the program as a node of Model Explorer's TFLite adapter (node id: the op's index in the
    signature's subgraph), with the tensors it writes (signature outputs by their names too) and the module call
    it belongs to (its innermost located call, resolved to one of ``paths``, a report's module paths).

    Example:
        >>> explorer_nodes("missing.tflite", ["fc"])
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such LiteRT program: 'missing.tflite'
    """
    located = Located.read(path)
    graph = located.graph
    own = {t: n for n, t in graph.outputs.items()}
    innermost: dict[int, ModuleValue] = {}
    for v in located.values:  # an op belongs to the deepest call among those its producing location is in
        for k in v.ops:
            if graph.locations[k][0].within(v.location) and (
                    k not in innermost or innermost[k].location.depth < v.location.depth):
                innermost[k] = v
    by_last: dict[str, list[str]] = {}  # a chain names only paths that end as it does
    for p in paths:
        by_last.setdefault(p.rsplit(".", 1)[-1], []).append(p)
    chains = {c: resolve_chain(c, by_last.get(c.rsplit(".", 1)[-1], [])) for c in {v.location.chain for v in located.values}}
    nodes = []
    for op in graph.ops:
        call = innermost.get(op.index)
        names = tuple(n for t in op.outputs for n in (graph.names[t], graph.short_names[t], own.get(t)) if n)
        nodes.append(ExplorerNode(str(op.index), names, chains.get(call.location.chain) if call else None,
                                  call.call if call else None))
    return nodes
