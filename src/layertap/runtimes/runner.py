"""Run an ONNX file (or an OpenVINO IR) in a runtime, in memory: :class:`ModelRunner` exposes
chosen tensors per run (compare's sides, batch after batch), :class:`TappedSession` one set of taps
for many inputs (``lt.run``, dataset extraction).

No edited file is written: the graph (weights taken out once, :func:`~.source.open_source`) gets
the extra outputs in memory, and the runtime (ONNX Runtime, OpenVINO: a
:class:`~layertap.runtimes.protocol.Runtime` handed in by the caller) opens it from there. The
caller's file (a path, or a :class:`~layertap.onnxfile.modelfile.ModelFile` it read) is left as
it was: every edit here is to the runner's own copy, in steps whose names say so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError, SelectorError, one_line, unknown_name
from ..onnxfile.branches import Carrier, branch_tensors, has_subgraphs
from ..onnxfile.feeds import input_types, make_feeds
from ..onnxfile.modelfile import ModelFile
from ..onnxfile.outputs import OutputAdder, dedupe
from ..onnxfile.scopemap import expose_fused_values_in_place, is_fused_llm
from ..onnxfile.shapes import input_dims
from ..selectors import Tap
from .ort import ort_typer
from .plugins import is_ir
from .protocol import Runtime
from .source import SessionSource, open_source

if TYPE_CHECKING:  # pragma: no cover
    import onnx


class ModelRunner:
    """A model in a runtime, run any number of times with chosen tensors exposed: an engine per set
    of names, the last one kept for the next run (one engine for every sample of a batch).

    The model's inline weights are taken out once (:class:`~.source.SessionSource`): every engine,
    and every part of the graph run on its own (``--local``), reads them in place, instead of the
    whole model being serialised and parsed again per engine. Build it with :meth:`reading` (a file)
    or on a source already in memory (an ideal run's rounded copy; ``label`` names it in an error).

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> from layertap.runtimes import open_runtime
        >>> runner = ModelRunner.reading(write_tiny_model(tempfile.mkdtemp()), open_runtime("ort"))
        >>> runner.input_names(), runner.run(["/act/Relu_output_0"], {"x": np.array([[-1.0, 2, 3, 4]], np.float32)})
        ([('x', 'float32')], {'/act/Relu_output_0': array([[0., 2., 3., 4.]], dtype=float32)})
    """

    def __init__(self, source: SessionSource, runtime: Runtime, *, file: Path | None = None, path: Path | None = None,
                 label: str | None = None) -> None:
        self.source = source
        self.runtime = runtime
        self.file = file  # an OpenVINO IR: run from the file (the source is its tensor names only)
        self.path = path or file or source.origin or source.folder  # the file it runs, as the caller named it
        self.label = label or str(file or source.origin or source.folder)  # how an error names what failed to load
        self.folder = source.folder
        self._out_info = {o.name: o for o in source.model.graph.output}
        self._value_info = {v.name: v for v in source.model.graph.value_info}
        self.runs = 0
        self.sessions = 0
        self._session: tuple[tuple[str, ...], Any] | None = None  # the last engine, kept for the next sample

    @classmethod
    def reading(cls, source: "str | os.PathLike | ModelFile", runtime: Runtime) -> "ModelRunner":
        """A runner on a file: an ONNX file read once (a ``ModelFile`` the caller read is not read again,
        nor changed: :func:`~.source.open_source`), or an OpenVINO IR, whose tensors are known by name
        (:func:`~.openvino.ir_graph`) and which its runtime reads itself."""
        if not isinstance(source, ModelFile) and is_ir(source):
            path = Path(source)
            from .openvino import ir_graph  # noqa: PLC0415 -- an IR only: a compare of ONNX files never loads it

            return cls(SessionSource(ir_graph(runtime, path), path.parent), runtime, file=path)
        held, mf = open_source(source)
        return cls(held, runtime, path=mf.path if isinstance(source, ModelFile) else Path(source))

    @property
    def proto(self) -> "onnx.ModelProto":
        """The graph the runner runs (its own copy, weights held apart)."""
        return self.source.model

    @property
    def optimize(self) -> bool:
        """The runtime's graph optimisations (always on for a runtime without that switch)."""
        return self.runtime.optimize

    def exposable(self) -> set[str] | None:
        """The tensors the runtime can hand out (``None``: every tensor of the graph)."""
        return self.runtime.exposable(self.file or self.source)

    def input_names(self) -> list[tuple[str, str]]:
        """(name, element type) of the graph's real inputs (not initializers; ``""``: a type numpy lacks)."""
        return input_types(self.proto.graph)

    def input_shapes(self) -> dict[str, tuple[int | str, ...]]:
        """Declared shape of each graph input: a fixed size as an int, a symbolic one as its
        name (``""`` when unnamed or negative: :func:`~layertap.onnxfile.shapes.declared_dims`)."""
        return {name: dims for name, dims in input_dims(self.proto.graph).items() if dims is not None}

    def expose_fused_values_in_place(self) -> bool:
        """Make the values a fused decoder's ops hide tensors of the runner's own graph, so its module
        calls (:meth:`~layertap.onnxfile.scopemap.ScopeMap.from_model`) can be exposed; whether any
        node was added (the graph is then no longer the file's)."""
        graph = self.proto.graph
        if self.file is not None or not is_fused_llm(graph) or not expose_fused_values_in_place(graph):
            return False
        self.source.origin = None
        return True

    def carry_branches_in_place(self, ops: Collection[str]) -> list[str]:
        """Make every tensor inside the runner's own graph's subgraphs of ``ops`` (``If``) an output of
        its node (see :mod:`layertap.onnxfile.branches`), so runs can expose them; the names carried.

        Only where the runtime carries branches (:attr:`~.base.Runtime.carries_branches`; OpenVINO's CPU
        plug-in refuses an ``If`` whose branches give tensors of different shapes, the branch not taken
        giving an empty one). A tensor that cannot be carried (a name several subgraphs define, an
        untyped one) stays inside.
        """
        graph = self.proto.graph
        if not self.runtime.carries_branches or self.file is not None or not has_subgraphs(graph):
            return []
        carrier, carried = Carrier(self.proto), []
        for name in branch_tensors(graph, ops=ops):
            try:
                if carrier.carry(name) is not None:
                    carried.append(name)
            except OnnxFileError:
                continue
        if carried:
            self.source.origin = None  # the graph is no longer the file's
        return carried

    def prepare(self, names: list[str]) -> Any:
        """The engine exposing ``names``: the last one while the names stay the same (one
        engine for every sample of a batch), else a new one."""
        key = tuple(names)
        if self._session is None or self._session[0] != key:
            self._session = None  # drop the old engine (and its exposed-output graph) first
            self._session = (key, self._new_session(names))
            self.sessions += 1
        return self._session[1]

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run exposing ``names`` (in the engine :meth:`prepare` keeps)."""
        sess = self.prepare(names)
        try:
            values = sess.run(names, feed)
        except Exception as e:  # noqa: BLE001
            raise InputSpecError(f"{self.runtime.describe().runtime} rejected the inputs: {one_line(e)}") from None
        self.runs += 1
        return values

    def _new_session(self, names: list[str]) -> Any:
        import onnx

        infos = []
        for n in names:
            info = self._out_info.get(n) or self._value_info.get(n)
            infos.append(info if info is not None else onnx.helper.make_empty_tensor_value_info(n))
        try:
            return self.runtime.open(self.file or self.source, infos, only=True)
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT raises its own types
            raise OnnxFileError(self._load_failure(names, e)) from None

    def _load_failure(self, names: list[str], error: Exception) -> str:
        """What failed to load: the file itself, or only with the tensors exposed (it is opened again as it is, to tell)."""
        runtime = self.runtime.describe().runtime
        try:
            self.runtime.open(self.file or self.source)
        except Exception as plain:  # noqa: BLE001 - ORT raises its own types
            return f"{runtime} cannot load '{self.label}' (as it is, without layertap's outputs too): {one_line(plain)}"
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return (f"{runtime} loads '{self.label}' but not with its tensors {shown} exposed as outputs: {one_line(error)}; "
                "compare fewer modules (--module) to find the tensor it refuses")

    def close(self) -> None:
        self._session = None


class TappedSession:
    """One engine of ``runtime`` on ``path`` with ``taps`` exposed in memory.

    Build it once and call :meth:`run` for many inputs (dataset extraction);
    ``lt.run`` is one such call. ``tap_names`` lists the names the taps give.
    ``runtime``: a :class:`~layertap.runtimes.protocol.Runtime`; its :meth:`~.base.Runtime.open_tapped`
    opens the graph whose taps were made outputs here (``file``: a file it reads itself, an
    OpenVINO IR, the taps exposed by name).

    Example:
        >>> import os, tempfile, onnx, onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])], "g",
        ...                  [h.make_tensor_value_info("x", 1, [None, 2])], [h.make_tensor_value_info("y", 1, [None, 2])])
        >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
        >>> from layertap.runtimes import open_runtime
        >>> sess = TappedSession(path, open_runtime("ort"), taps=["r"])
        >>> sess.tap_names, sess.run([np.array([[-1.0, 2.0]], np.float32)])["r"]
        (['r'], array([[0., 2.]], dtype=float32))
    """

    def __init__(self, path: "str | os.PathLike | ModelFile", runtime: Runtime, taps: Sequence[str] = (), *,
                 file: Path | None = None) -> None:
        self.path = path.path if isinstance(path, ModelFile) else path
        self.runtime = runtime
        # the weights go to the runtime once, as arrays; the taps are added to the source's own graph
        self.source, self.mf = open_source(path)
        adder = OutputAdder(self.mf, typer=ort_typer(self.source.held))
        self.positions: dict[str, tuple[str, int]] = {}  # a PATH@POS tap's name -> (its whole value's name, POS)
        pairs: list[tuple[str, str]] = []
        plain: set[str] = set()
        for tap in taps:
            got = self._resolve(adder, tap)
            plain.update(n for n, _ in got if _whole(tap) == tap)
            pairs.extend(got)
        self.pairs = dedupe(pairs)
        self.hidden = {whole for whole, _ in self.positions.values()} - plain  # read only to be sliced
        if not self.pairs and not list(adder.outputs):
            raise OnnxFileError(f"'{path}' has no graph outputs, so there is nothing to run; pass --tap NAME to pick tensors")
        self.own = list(adder.outputs)
        self.added = adder.apply(self.pairs)
        self.carried = adder.carried  # branch tensors: an empty value means their branch did not run
        if adder.carried or adder.exposed_fused:
            self.source.origin = None  # the graph is no longer the file's: a runtime must read this one
        self.tap_names = list(dict.fromkeys([*(n for n, _ in self.pairs if n not in self.hidden), *self.positions]))
        try:
            # ``file``: a file the runtime reads itself (an OpenVINO IR, ``mf`` its tensor names)
            tensors = list(dict.fromkeys(t for _, t in self.pairs))
            self.session = runtime.open(file, tensors) if file is not None else runtime.open_tapped(self.source, tensors)
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT's own message, one line
            raise OnnxFileError(f"{runtime.describe().runtime} cannot load '{self.path}': {one_line(e)}") from None

    def _resolve(self, adder: OutputAdder, text: str) -> list[tuple[str, str]]:
        """A tap's (name, tensor) pairs; a ``PATH@POS`` tap reads PATH's whole value, sliced in :meth:`run`."""
        whole = _whole(text)
        pairs = _resolve_tap(adder, whole)
        if whole != text:
            tap = Tap.parse(text)
            assert tap.pos is not None  # _whole changed only a tap with a position
            for name, _ in pairs:
                self.positions[tap.name if len(pairs) == 1 else f"{name}@{tap.pos}"] = (name, tap.pos)
        return pairs

    def run(
        self, inputs: Mapping[str, Any] | Sequence[Any] | None = None, *, seed: int = 0, notify: Callable[[str], None] | None = None,
        flatten: bool = True,
    ) -> dict[str, Any]:
        """The model's outputs (a single one named ``output``), then each tap; a sequence-valued one is the list of
        its tensors, or, with ``flatten`` (arrays for a file), its elements ``NAME[0]``, ``NAME[1]``, ...
        (:func:`flatten_sequences`)."""
        sess, path = self.session, self.path
        feeds = make_feeds(sess, self.mf.model.graph, inputs, seed, folder=self.mf.folder)
        if feeds.note() and notify is not None:
            notify(feeds.note() or "")
        try:
            got = sess.run(None, feeds.arrays)
        except Exception as e:  # noqa: BLE001
            on = f" on generated inputs ({', '.join(feeds.generated)})" if feeds.generated else ""
            hint = (f"; pass the inputs it needs, e.g. {feeds.options()} with the sizes it expects, or NAME=FILE.npy"
                    if feeds.generated else "")
            raise OnnxFileError(f"{self.runtime.describe().runtime} failed to run '{path}'{on}: {one_line(e)}{hint}") from None
        result: dict[str, Any] = {}
        for name in self.own:
            key = "output" if len(self.own) == 1 and "output" not in self.added else name
            result[key] = got[name]
        tensor_of = dict(self.pairs)
        for name in self.added:  # an alias the runtime does not know by name: its tensor
            result[name] = got[name] if name in got else got[tensor_of[name]]
        for name, tensor in self.pairs:  # a tap on a graph output: also under the tap's own name
            if name not in result:
                result[name] = got[name if name in got else tensor]
        for name, (whole, pos) in self.positions.items():
            result[name] = _at_position(result[whole], pos, whole)
        self._note_not_run(result, notify)
        shown = {k: v for k, v in result.items() if k not in self.hidden}
        return flatten_sequences(shown, notify) if flatten else shown


    def _note_not_run(self, result: dict[str, Any], notify: Callable[[str], None] | None) -> None:
        """One line per tapped branch tensor that came back empty: its branch did not run."""
        if notify is None or not self.carried:
            return
        for name, tensor in self.pairs:
            value = result.get(name)
            if tensor in self.carried and value is not None and np.size(value) == 0 and name not in self.hidden:
                notify(f"{name!r} is inside {self.carried[tensor]}, which did not run on these inputs "
                       "(an empty value: every dimension 0)")


def flatten_sequences(values: dict[str, Any], notify: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """A sequence-valued output (ORT returns a list) becomes ``NAME[0]``, ``NAME[1]``, ...;
    an empty one gives no value, and ``notify`` a line saying so (what a file of arrays holds: ``run -o``,
    a dataset's shards).

    Example:
        >>> {k: v.shape for k, v in flatten_sequences({"s": [np.zeros(2), np.zeros(3)], "t": np.zeros(())}).items()}
        {'s[0]': (2,), 's[1]': (3,), 't': ()}
        >>> flatten_sequences({"s": []}, print)
        's' is an empty sequence on these inputs: it has no elements (s[0], s[1], ...) to show or save
        {}
    """
    out: dict[str, np.ndarray] = {}
    for name, v in values.items():
        if isinstance(v, (list, tuple)):
            if not v and notify is not None:
                notify(f"{name!r} is an empty sequence on these inputs: it has no elements ({name}[0], {name}[1], ...) "
                       "to show or save")
            out.update((f"{name}[{i}]", np.asarray(e)) for i, e in enumerate(v))
        else:
            out[name] = v
    return out


def _whole(text: str) -> str:
    """A ``PATH@POS`` tap's text without its position (any other text unchanged)."""
    try:
        tap = Tap.parse(text)
    except SelectorError:
        return text
    return text if tap.pos is None else tap.with_pos(None).canonical


def _at_position(value: np.ndarray, pos: int, name: str) -> np.ndarray:
    """Token position ``pos`` of a ``[batch, sequence, hidden]`` value (negative: from the end).

    Example:
        >>> _at_position(np.arange(6.0).reshape(1, 3, 2), -1, "h").tolist()
        [[4.0, 5.0]]
    """
    if np.ndim(value) != 3:
        shape = "x".join(map(str, np.shape(value)))
        raise OnnxFileError(f"tap {name}@{pos}: a token position is read along axis 1 of a [batch, sequence, hidden] "
                            f"value, and {name!r} is {shape or 'a scalar'}; tap {name!r} and index its value")
    length = value.shape[1]
    if not -length <= pos < length:
        raise OnnxFileError(f"token position {pos} is outside the sequence {name!r} holds (0..{length - 1}, "
                            f"or -{length}..-1 from the end)")
    return value[:, pos]


def _resolve_tap(adder: OutputAdder, text: str) -> list[tuple[str, str]]:
    """Export-recorded names and graph outputs first, then modules, then tensor names."""
    recorded = {r["name"] for r in adder.mf.taps_metadata()}
    if text in adder.outputs or text in recorded:
        if text not in adder.outputs:
            raise OnnxFileError(f"tap {text!r} is recorded by lt.export but is not an output of this file")
        return [(text, text)]
    try:
        tap = _parse(text)
    except SelectorError:
        tap = None
    if tap is not None and adder.scopes.source != "none" and adder.scopes.calls(tap.path):
        return adder.resolve_scoped(tap)
    if text in adder.known_tensors():
        adder.note_quantized(text)
        return [(text, text)]
    if adder.carry(text) is not None:
        return [(text, text)]
    scoped = adder.scopes.source != "none"
    if tap is not None and scoped and ("." in tap.path or tap.call is not None or tap.port == "input"):
        return adder.resolve_scoped(tap)  # raises the module error with close matches
    where = adder.nested_location(text)
    if where:
        raise OnnxFileError(f"tensor {text!r} is {where}; only tensors of the main graph can be tapped")
    pool = sorted(adder.known_tensors() | set(adder.branch_tensors()) | set(adder.scopes.modules()) | recorded)
    hint = "" if scoped or tap is None else (
        "this file carries no module scopes (no torch.onnx dynamo metadata, no TorchScript-style node names), so "
        "module paths cannot be resolved; tap tensors by name (layertap layers FILE.onnx lists them)")
    raise OnnxFileError(unknown_name("tap (module or tensor)", text, pool, hint=hint))


def _parse(text: str) -> Tap:
    return Tap.parse(text)
