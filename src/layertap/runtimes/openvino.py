"""OpenVINO as a :class:`~.base.Runtime`: the ONNX graph (weights held in memory by a
:class:`~layertap.runtimes.source.SessionSource`, handed over inline) or an IR file read once,
intermediates exposed by tensor name (``Model.add_outputs``), compiled on a device with
``INFERENCE_PRECISION_HINT``. ``openvino`` is imported only here, when asked for.

Each set of exposed tensors is one compile: with every module output of torchvision's resnet18
exposed (40 tensors) it took ~1.0 s on this project's 2-core CPU, resnet50 (105 tensors) ~2.1 s,
so the compare batches (memory budget, ``batch_outputs``) cost a compile each, as ORT's sessions do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import LayertapError, OnnxFileError, one_line
from ..files.reads import note_input
from ..onnxfile.branches import padded_outputs
from ..onnxfile.modelfile import ModelFile
from ..onnxfile.tensor_types import ORT_NUMPY
from .ort import int8_probe
from .plugins import VERBS, YES, RuntimeSettings
from .protocol import InputInfo, RuntimeInfo, check_exposed

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.modelfile import ModelFile
    from .source import SessionSource

INSTALL = "pip install 'layertap[openvino]'"
#: ``--ov-precision`` -> OpenVINO's hint value
PRECISIONS = {"f32": "f32", "bf16": "bf16", "f16": "f16"}
_TYPE_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
# OpenVINO documents this "saturation issue" and has no setting against it (ONNX Runtime has one, which
# layertap's sessions use: runtimes.ort.EXACT_INT8); measured on a QDQ file with full-range weights:
# 56 quanta on a Conv's output, against none with 7-bit weights
SATURATION_NOTE = ("its int8 kernels saturate on this CPU: without VNNI they sum pairs of int8 products in 16 bits, "
                   "and 4 x 127 x 127 gave {got:g}, not {exact:g}; quantised layers can differ from exact int8 sums by "
                   "many quanta, which 7-bit weights avoid: quantize_static reduce_range=True")


def load_openvino() -> Any:
    """The ``openvino`` module, or the one-line error naming the install command."""
    try:
        import openvino
    except ImportError:
        raise LayertapError(f"the OpenVINO runtime is not installed; {INSTALL}") from None
    return openvino


class OpenVinoEngine:
    """One compiled model; :meth:`run` hands out the exposed tensors by their ONNX names."""

    def __init__(self, compiled: Any, positions: dict[str, int], inputs: list[InputInfo]) -> None:
        self.compiled = compiled
        self.positions = positions  # tensor name -> index among the compiled outputs
        self._inputs = inputs
        self.request = compiled.create_infer_request()

    def get_inputs(self) -> list[InputInfo]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        first: dict[int, str] = {}
        for name, i in self.positions.items():
            first.setdefault(i, name)
        return [first[i] for i in sorted(first)]

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        wanted = list(names) if names is not None else list(self.positions)
        # np.require keeps a 0-d input (an If's condition) 0-d; np.ascontiguousarray makes it 1-d
        self.request.infer({k: np.require(v, requirements="C") for k, v in feed.items()})
        # the request reuses its buffers on the next run: copy out
        return {n: np.array(self.request.get_output_tensor(self.positions[n]).data, copy=True) for n in wanted}


class OpenVinoRuntime:
    """OpenVINO on ``device`` at ``precision`` (``f32``/``bf16``/``f16``; ``None``: the device's default).

    Example:
        >>> import onnx.helper as h
        >>> from layertap.runtimes.source import SessionSource
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> rt = OpenVinoRuntime("CPU", "f32")
        >>> engine = rt.open(SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path(".")), ["r"])
        >>> engine.run(["r", "y"], {"x": np.array([-1.0, 2.0], np.float32)})
        {'r': array([0., 2.], dtype=float32), 'y': array([-0., -2.], dtype=float32)}
        >>> rt.describe().runtime, rt.describe().precision
        ('OpenVINO', 'float32')
    """

    name = "openvino"
    optimize = True  # its own graph transformations always apply
    carries_branches = False  # its CPU plug-in refuses an If whose branches give tensors of different shapes

    def __init__(self, device: str = "CPU", precision: str | None = None) -> None:
        ov = load_openvino()
        self.ov = ov
        self.core = ov.Core()
        self.device = _check_device(self.core, device)
        if precision is not None and precision not in PRECISIONS:
            raise LayertapError(f"unknown OpenVINO precision {precision!r}; use one of {', '.join(PRECISIONS)}")
        self.config = {"INFERENCE_PRECISION_HINT": PRECISIONS[precision]} if precision else {}
        self.precision = self._probe(precision)
        self._models: dict[int, tuple[Any, Any]] = {}  # id(source) -> (source, ov.Model read once)
        self._int8 = False  # a model read has int8 tensors
        self._int8_sum: tuple[float, float] | None = None  # the int8 probe: (got, exact), measured once

    def _probe(self, asked: str | None) -> str:
        """The precision this device runs at with this config (a one-node model compiled to ask);
        a precision it lacks is refused."""
        import onnx.helper as h

        g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "probe", [h.make_tensor_value_info("x", 1, [1])],
                         [h.make_tensor_value_info("y", 1, [1])])
        model = self.core.read_model(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString())
        try:
            ran = self.core.compile_model(model, self.device, self.config).get_property("INFERENCE_PRECISION_HINT")
        except RuntimeError as e:
            raise LayertapError(f"OpenVINO cannot compile for device {self.device}: {one_line(e, limit=300)}") from None
        got = ran.get_type_name() if hasattr(ran, "get_type_name") else str(ran)
        if asked is not None and got != PRECISIONS[asked]:
            raise LayertapError(
                f"OpenVINO's {self.device} device does not run --ov-precision {asked} (it ran {_TYPE_NAMES.get(got, got)} "
                f"when asked); use --ov-precision {got if got in PRECISIONS else 'f32'} or another --ov-device")
        return _TYPE_NAMES.get(got, got)

    def read(self, model: "SessionSource | Path") -> Any:
        """The OpenVINO model of ``model``, read once: from its file when it has one (an ONNX/IR path,
        or a graph whose ``origin`` file is unedited: 25-60 ms on resnet50, against seconds for the
        graph serialised with its weights and read from bytes, and no 2 GB protobuf limit)."""
        key = id(model)
        held = self._models.get(key)
        if held is not None and held[0] is model:
            return held[1]
        try:
            if isinstance(model, Path) or model.origin is not None:
                ov_model = self.core.read_model(str(model if isinstance(model, Path) else model.origin))
            else:
                ov_model = self.core.read_model(model.inlined().SerializeToString())
        except RuntimeError as e:
            where = f"'{model}'" if isinstance(model, Path) else "the ONNX graph"
            raise OnnxFileError(f"OpenVINO cannot read {where}: {one_line(e, limit=300)}") from None
        self._models[key] = (model, ov_model)
        self._int8 = self._int8 or has_int8(ov_model)
        return ov_model

    def int8_saturates(self) -> bool:
        """Whether this device's int8 kernels saturate: :func:`~layertap.runtimes.ort.int8_probe`
        (a QDQ Conv whose pairs of products overflow 16 bits) compiled here at this precision."""
        if self._int8_sum is None:
            model, feed, exact, _ = int8_probe("Conv")
            compiled = self.core.compile_model(self.core.read_model(model.SerializeToString()), self.device, self.config)
            self._int8_sum = (float(np.asarray(compiled(feed)[compiled.output(0)]).item()), exact)
        return self._int8_sum[0] != self._int8_sum[1]

    def open(self, model: "SessionSource | Path", outputs: Sequence["str | onnx.ValueInfoProto"] = (), *,
             only: bool = False) -> OpenVinoEngine:
        names = [o if isinstance(o, str) else o.name for o in outputs]
        if not isinstance(model, Path):
            refuse_padded(names, model.model.graph)
        base = self.read(model)
        check_exposed(names, self.exposable(model), "OpenVINO")
        m = base.clone()
        own = [n for n in names if not any(n in o.get_names() for o in m.outputs)]
        if own:
            m.add_outputs(own)
        return self._compile(m, names if only else None)

    def open_tapped(self, source: "SessionSource", tensors: Sequence[str]) -> OpenVinoEngine:
        return self.open(source, tensors)  # read from the unedited file: the taps exposed by name

    def settings(self) -> str:
        return ""  # device and precision: describe()

    def rounding_note(self) -> str:
        return ""

    def open_part(self, source: "SessionSource", part: "onnx.ModelProto") -> OpenVinoEngine:
        try:
            m = self.core.read_model(source.inlined(part).SerializeToString())
        except RuntimeError as e:
            raise OnnxFileError(f"OpenVINO cannot read the part graph: {one_line(e, limit=300)}") from None
        return self._compile(m, None)

    def open_file(self, path: Path, *, timing: bool = False) -> OpenVinoEngine:
        """The file read by OpenVINO (ONNX or IR), compiled as its settings say (``timing`` changes nothing)."""
        return self._compile(self.read(path), None)

    def _compile(self, m: Any, only: Sequence[str] | None) -> OpenVinoEngine:
        """Compile ``m``; its outputs by every name they carry (positions taken before compiling:
        compiled outputs keep the order, not always the names)."""
        positions: dict[str, int] = {}
        for i, out in enumerate(m.outputs):
            for n in out.get_names():
                positions.setdefault(n, i)
        if only is not None:
            positions = {n: positions[n] for n in only}
        try:
            compiled = self.core.compile_model(m, self.device, self.config)
        except RuntimeError as e:
            raise OnnxFileError(f"OpenVINO cannot compile the model for {self.device}: {one_line(e, limit=300)}") from None
        return OpenVinoEngine(compiled, positions, _inputs(m))

    def exposable(self, model: "SessionSource | Path") -> set[str] | None:
        base = self.read(model)
        names = {n for op in base.get_ops() for out in op.outputs() for n in out.get_names()}
        return names if isinstance(model, Path) else names - quantized_away(model.model.graph)

    def describe(self) -> RuntimeInfo:
        """What ran; once a model with int8 tensors was read, whether the int8 kernels saturate here."""
        note = ""
        if self._int8 and self.int8_saturates() and self._int8_sum is not None:
            note = SATURATION_NOTE.format(got=self._int8_sum[0], exact=self._int8_sum[1])
        return RuntimeInfo("OpenVINO", self.ov.__version__.split("-")[0], self.device, self.precision, note)


def _check_device(core: Any, device: str) -> str:
    """``device`` when OpenVINO has it here (``GPU`` also matches ``GPU.0``), else a one-line error."""
    available = list(core.available_devices)
    if device in available or any(a.startswith(device + ".") for a in available):
        return device
    raise LayertapError(f"OpenVINO has no device {device!r} on this machine (available: {', '.join(available)}); "
                        "pick one with --ov-device")


def _inputs(m: Any) -> list[InputInfo]:
    """The model's inputs as ONNX Runtime names their types (``tensor(float)``)."""
    by_dtype = {np.dtype(v): k for k, v in ORT_NUMPY.items()}
    out = []
    for p in m.inputs:
        try:
            kind = by_dtype.get(np.dtype(p.get_element_type().to_dtype()), "tensor(unknown)")
        except (TypeError, RuntimeError):
            kind = "tensor(unknown)"
        shape = p.get_partial_shape()
        dims = None if shape.rank.is_dynamic else [d.get_length() if d.is_static else None for d in shape]
        out.append(InputInfo(p.get_any_name(), kind, dims))
    return out


def refuse_padded(names: Sequence[str], graph: "onnx.GraphProto") -> None:
    """Refuse a tensor carried out of one branch of an If (the other branch gives an empty value):
    OpenVINO's CPU plug-in refuses an If whose branches give tensors of different ranks or sizes."""
    padded = padded_outputs(graph)
    hit = next((n for n in names if n in padded), None)
    if hit is not None:
        raise OnnxFileError(
            f"OpenVINO cannot expose {hit!r}: it is computed in one branch of If node {padded[hit]!r} only, and OpenVINO's "
            "CPU plug-in refuses an If whose branches give tensors of different shapes (the other branch's is empty); "
            "run it with --runtime ort, or tap a tensor both branches compute")


def has_int8(m: Any) -> bool:
    """Whether OpenVINO model ``m`` quantises (a ``FakeQuantize``, or an int8/uint8 tensor)."""
    return any(op.get_type_name() == "FakeQuantize" or any(out.get_element_type().get_type_name() in ("i8", "u8")
                                                             for out in op.outputs()) for op in m.get_ops())


def quantized_away(graph: "onnx.GraphProto") -> set[str]:
    """Float tensors that only a ``QuantizeLinear`` reads: OpenVINO's low-precision transformations
    fold them into the quantised kernel, and an exposed copy is not the value the graph goes on with
    (the ``DequantizeLinear`` after it is).

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("QuantizeLinear", ["c", "s"], ["q"]),
        ...                   h.make_node("DequantizeLinear", ["q", "s"], ["d"])], "g", [], [])
        >>> sorted(quantized_away(g))
        ['c']
    """
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for t in node.input:
            if t:
                readers.setdefault(t, set()).add(node.op_type)
    outputs = {o.name for o in graph.output}
    return {t for t, ops in readers.items() if ops == {"QuantizeLinear"} and t not in outputs}


def ir_graph(runtime: "OpenVinoRuntime | Any", path: Path) -> "onnx.ModelProto":
    """An OpenVINO IR's tensors as an ONNX graph of name-only nodes (domain ``org.openvino``, no
    weights): enough to align its tensors by name with an ONNX file and to pair its outputs; it
    is never run (the IR file is). An unnamed tensor gets the name ``ov:NODE:K``."""
    import onnx.helper as h

    if not isinstance(runtime, OpenVinoRuntime):
        raise LayertapError(f"'{path}' is an OpenVINO IR, which only OpenVINO runs: drop --runtime / --cand-runtime "
                            "for its side (an IR runs in OpenVINO by default), or give it the ONNX file it came from")
    m = runtime.read(path)

    def name(out: Any) -> str:
        names = sorted(out.get_names())
        return names[0] if names else f"ov:{out.get_node().get_friendly_name()}:{out.get_index()}"

    nodes, typed = [], []
    for op in m.get_ordered_ops():
        if op.get_type_name() in ("Parameter", "Result", "Constant"):
            continue
        ins = [name(i.get_source_output()) for i in op.inputs()]
        nodes.append(h.make_node(op.get_type_name(), ins, [name(o) for o in op.outputs()], name=op.get_friendly_name(),
                                 domain="org.openvino"))
        typed += [_value_info(name(o), o) for o in op.outputs()]
    inputs = [h.make_tensor_value_info(i.name, _elem(i.type), i.shape) for i in _inputs(m)]
    outputs = [_value_info(name(o), o) for o in m.outputs]
    graph = h.make_graph(nodes, path.stem, inputs, outputs, value_info=typed)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("org.openvino", 1)])


def ir_file(runtime: Any, path: str | os.PathLike) -> "ModelFile":
    """An OpenVINO IR as a :class:`~layertap.onnxfile.modelfile.ModelFile` of its tensor names
    (:func:`ir_graph`), its two files recorded as read (no output may replace them)."""
    p = Path(path)
    if not p.is_file():
        raise OnnxFileError(f"OpenVINO IR '{p}' does not exist")
    graph = ir_graph(runtime, p)
    note_input(p)
    note_input(p.with_suffix(".bin"), f"weights of '{p}'")
    return ModelFile(path=p, model=graph, external=[])


def _value_info(name: str, out: Any) -> "onnx.ValueInfoProto":
    """A typed value info of an OpenVINO output (dynamic sizes unnamed)."""
    import onnx.helper as h

    try:
        elem = int(h.np_dtype_to_tensor_dtype(np.dtype(out.get_element_type().to_dtype())))
    except (TypeError, RuntimeError, KeyError, ValueError):
        return h.make_empty_tensor_value_info(name)
    shape = out.get_partial_shape()
    dims = None if shape.rank.is_dynamic else [d.get_length() if d.is_static else None for d in shape]
    return h.make_tensor_value_info(name, elem, dims)


def _elem(kind: str) -> int:
    """ONNX's element type of an ORT type text (``tensor(float)`` -> 1; 0 when unknown)."""
    import onnx.helper as h

    dtype = ORT_NUMPY.get(kind)
    return int(h.np_dtype_to_tensor_dtype(np.dtype(dtype))) if dtype is not None else 0


class _OpenVinoPlugin:
    """OpenVINO as a runtime plug-in (:class:`~.plugins.RuntimePlugin`): a graph runtime that reads ONNX files
    and its own IR (``.xml``, read as a graph: :func:`ir_graph`)."""

    name = "openvino"
    title = "OpenVINO"
    form = "graph"
    suffixes = (".xml",)
    matrix = {**{verb: YES for verb in VERBS},
              "export": "layertap export writes ONNX, which OpenVINO reads as it is; an IR (.xml) is OpenVINO's own "
                        "conversion of it (ovc m.onnx), which every other verb reads",
              "repro": "repro.py runs the packaged part in ONNX Runtime (numpy, onnx, onnxruntime only); a "
                       "divergence of OpenVINO's own kernels is shown call by call by compare --local"}

    def open(self, settings: RuntimeSettings) -> OpenVinoRuntime:
        settings.refuse(self.name, ("ov_precision", "ov_device"),
                        "--providers picks ONNX Runtime's execution providers and --no-ort-opt turns off its graph "
                        "optimisations; OpenVINO's device is --ov-device and its own transformations always apply")
        return OpenVinoRuntime(settings.ov_device or "CPU", settings.ov_precision)


PLUGIN = _OpenVinoPlugin()
