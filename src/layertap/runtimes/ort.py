"""ONNX Runtime as a :class:`~.base.Runtime`, and every ONNX Runtime session layertap makes.

:func:`open_session` is the one place an ``InferenceSession`` is made: engines on a
:class:`~.source.SessionSource` (its held weights handed over as ``add_external_initializers``,
so a session parses only the graph), engines on a file as it is (export's check, fix's trials,
repro's reference part), the small programs of :mod:`.ort_kernels` and the typing of tensors
shape inference leaves open (:func:`ort_types`). Only a repro package's standalone
``repro.py`` has its own (it runs without layertap). Every session has the same options: ORT's
log lines off stderr (its exceptions keep the text), worker threads that do not spin between
runs, exact int8 sums on every CPU. ``onnxruntime`` is imported inside functions only.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import LayertapError
from ..onnxfile.tensor_types import ORT_ELEM
from .plugins import VERBS, YES, RuntimeSettings
from .protocol import InputInfo, RuntimeInfo, as_input_infos
from .source import SessionSource, open_source

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.tensor_types import TensorTyper

# short names users type -> ORT's provider names
_PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider", "openvino": "OpenVINOExecutionProvider", "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider", "directml": "DmlExecutionProvider", "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider", "qnn": "QNNExecutionProvider", "xnnpack": "XnnpackExecutionProvider",
}
_FATAL = 4
# ONNX Runtime's own session option: on x86 CPUs without VNNI its u8 x s8 int8 kernels add pairs of
# products into 16 bits with saturation (VPMADDUBSW), so a file with full-range int8 weights gives other
# numbers there than on a VNNI CPU (measured: 16 quanta on a QGemm's output); "1" makes ORT turn the
# weights of its fused int8 nodes into u8 and use its exact u8 x u8 kernels instead
EXACT_INT8 = ("session.x64quantprecision", "1")
# ORT 1.32 refuses that rewrite where two nodes read one int8 weight (a part graph's pieces, tied weights)
_EXACT_REFUSED = "Attempt to replace the existing tensor"
#: what a compare says when its first divergence is within rounding and ORT optimised the graph
FUSION_NOTE = (
    "exposing intermediate tensors as ONNX Runtime outputs can stop ORT from fusing the nodes that "
    "produce them, so this run may differ slightly from a plain run of the file; compare with "
    "ort_optimizations=False (--no-ort-opt) to rule ORT's graph optimisations out"
)


def resolve_providers(names: Sequence[str] | str | None) -> list[str]:
    """ORT execution provider names from user text (``CUDA``, ``cuda,cpu``, ``TensorrtExecutionProvider``).

    The CPU provider is appended as the fallback ORT needs for nodes the others
    cannot run. Raises :class:`~layertap.errors.LayertapError` naming the
    available providers when one is not installed.

    Example:
        >>> resolve_providers(None), resolve_providers("cpu")
        (['CPUExecutionProvider'], ['CPUExecutionProvider'])
    """
    import onnxruntime as ort

    if names is None:
        return ["CPUExecutionProvider"]
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    available = ort.get_available_providers()
    out: list[str] = []
    for raw in names:
        text = raw.strip()
        full = _PROVIDER_ALIASES.get(text.lower().removesuffix("executionprovider"), text)
        if full not in available:
            raise LayertapError(
                f"execution provider {text!r} is not available in this onnxruntime (available: {', '.join(available)}); "
                "install the onnxruntime build for it (e.g. onnxruntime-gpu for CUDA)"
            )
        if full not in out:
            out.append(full)
    if "CPUExecutionProvider" not in out:
        out.append("CPUExecutionProvider")
    return out


# -- sessions ------------------------------------------------------------------------------------


def open_session(model: "str | bytes", options: Callable[[], Any] | None = None, providers: Sequence[str] | None = None,
                 *, exact_int8: bool = True) -> Any:
    """An ``InferenceSession`` on ``model`` (a path or serialised bytes) with the ``SessionOptions``
    ``options()`` makes (default :func:`session_options`): the one place layertap creates an ONNX
    Runtime session (only a repro package's standalone ``repro.py`` has its own). Its int8 sums
    are exact on every CPU: :data:`EXACT_INT8` is added where ORT's kernels saturate
    (:func:`int8_saturates`; it applies with graph optimisations, as at ``ORT_DISABLE_ALL`` nothing
    is fused and the float QDQ path runs). Where ORT refuses it (two nodes reading one int8
    weight), or with ``exact_int8=False``, the session is opened as ORT opens it by default.

    Example:
        >>> model, feed, exact, saturated = int8_probe()
        >>> float(open_session(model.SerializeToString()).run(None, feed)[0].item()) == exact, exact, saturated
        (True, 64516.0, 510.0)
    """
    import onnxruntime as ort

    quiet_logs()
    make = options or session_options
    chosen = list(providers or ["CPUExecutionProvider"])
    if not exact_int8 or not int8_saturates():
        return ort.InferenceSession(model, make(), providers=chosen)
    so = make()
    so.add_session_config_entry(*EXACT_INT8)
    try:
        return ort.InferenceSession(model, so, providers=chosen)
    except Exception as e:  # ORT raises its own exception types
        if _EXACT_REFUSED not in str(e):
            raise
        return ort.InferenceSession(model, make(), providers=chosen)


def session_options(*, optimize: bool = True, spin: bool = False, folder: Path | None = None,
                    held: Mapping[str, np.ndarray] | None = None) -> Any:
    """The ``SessionOptions`` of every session layertap opens: ORT's log lines off stderr, graph
    optimisations unless ``optimize`` is False, worker threads that wait without spinning unless
    ``spin`` (a latency measured as ORT runs by default), and for a graph in memory its data files'
    ``folder`` and the arrays of its ``held`` weights.

    Example:
        >>> so = session_options(optimize=False)
        >>> so.log_severity_level, str(so.graph_optimization_level).rsplit(".", 1)[-1]
        (4, 'ORT_DISABLE_ALL')
        >>> so.get_session_config_entry("session.intra_op.allow_spinning")
        '0'
    """
    import onnxruntime as ort

    so = quiet_options()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if not spin:
        # ORT's worker threads spin-wait for work by default, taking cores from what layertap does
        # between runs (PyTorch's forward, the weight check on its own thread, numpy's statistics)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if folder is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder.resolve()))
    if held:
        so.add_external_initializers(list(held), [ort.OrtValue.ortvalue_from_numpy(a) for a in held.values()])
    return so


def source_session(source: SessionSource, outputs: Sequence["str | onnx.ValueInfoProto"] = (), *, only: bool = False,
                   optimize: bool = True, providers: Sequence[str] | None = None,
                   part: "onnx.ModelProto | None" = None) -> Any:
    """A session on ``source`` whose outputs are its model's plus ``outputs`` (names, typed or not;
    ``only``: just ``outputs``), or on ``part``, a graph built from its nodes; either reads the held
    weights in place, none copied. ``providers``: full ORT provider names (CPU when ``None``).

    Example:
        >>> import onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
        >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
        >>> src = SessionSource.with_weights_held(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."))
        >>> sess = source_session(src, ["m"])
        >>> [o.name for o in sess.get_outputs()], float(sess.run(None, {"x": np.ones((1, 512), np.float32)})[1].sum())
        (['y', 'm'], 512.0)
        >>> part = h.make_model(h.make_graph([h.make_node("MatMul", ["w", "w"], ["ww"])], "part", [],
        ...     [h.make_empty_tensor_value_info("ww")], list(src.model.graph.initializer)), opset_imports=[h.make_opsetid("", 17)])
        >>> float(source_session(src, part=part).run(None, {})[0].sum())
        512.0
    """
    data = source.serialized(outputs, only=only) if part is None else part.SerializeToString()
    held = source.held if part is None else source.weights_of(part)
    return open_session(data, lambda: session_options(optimize=optimize, folder=source.folder, held=held), providers,
                        exact_int8=source.quantised)


@functools.cache
def int8_saturates() -> bool:
    """Whether ONNX Runtime's int8 kernels saturate on this CPU as it runs them by default
    (:func:`int8_probe` run once per process): ``True`` on x86 CPUs with AVX2 and no VNNI.

    Example:
        >>> int8_saturates() in (True, False)
        True
    """
    model, feed, exact, _ = int8_probe()
    got = open_session(model.SerializeToString(), quiet_options, exact_int8=False).run(None, feed)[0]
    return float(np.asarray(got).item()) != exact


def int8_probe(op: str = "MatMul") -> tuple["onnx.ModelProto", dict[str, np.ndarray], float, float]:
    """A QDQ ``op`` (``MatMul`` or a 1x1 ``Conv``) of four int8 activations 127 by four int8 weights
    127 (scales 1): the model, its feed, the exact result (4 x 127 x 127 = 64516) and what an int8
    kernel that sums pairs of products in 16 bits gives (510: with the activations shifted to u8,
    each pair 255 x 127 x 2 saturates at 32767, less the shift's 128 x 508).

    Example:
        >>> model, feed, exact, saturated = int8_probe("Conv")
        >>> [o.name for o in model.graph.output], feed["x"].shape, exact, saturated
        (['y'], (1, 4, 1, 1), 64516.0, 510.0)
    """
    import onnx.helper as h
    from onnx import numpy_helper

    shape = [1, 4, 1, 1] if op == "Conv" else [1, 4]
    weights = np.full([1, 4, 1, 1] if op == "Conv" else [4, 1], 127, np.int8)
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "scale"), numpy_helper.from_array(np.array(0, np.int8), "zero"),
             numpy_helper.from_array(weights, "w_q")]
    nodes = [h.make_node("QuantizeLinear", ["x", "scale", "zero"], ["x_q"]),
             h.make_node("DequantizeLinear", ["x_q", "scale", "zero"], ["x_dq"]),
             h.make_node("DequantizeLinear", ["w_q", "scale", "zero"], ["w_dq"]), h.make_node(op, ["x_dq", "w_dq"], ["y"])]
    graph = h.make_graph(nodes, "int8_probe", [h.make_tensor_value_info("x", 1, shape)], [h.make_tensor_value_info("y", 1, None)],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return model, {"x": np.full(shape, 127, np.float32)}, 4.0 * 127 * 127, 2.0 * 32767 - 128 * 4 * 127


def quiet_options() -> Any:
    """``SessionOptions`` that keep ONNX Runtime's own log lines off stderr (its exception keeps the text).

    Example:
        >>> quiet_options().log_severity_level
        4
    """
    import onnxruntime as ort

    return _quiet(ort.SessionOptions())


def quiet_logs() -> None:
    """Silence ONNX Runtime's process-wide logger (load-time warnings and errors print to stderr otherwise).

    Example:
        >>> quiet_logs()
    """
    import onnxruntime as ort

    ort.set_default_logger_severity(_FATAL)


def run_options() -> Any:
    """``RunOptions`` that keep ONNX Runtime's per-run log lines off stderr (the exception has the text).

    Example:
        >>> run_options().log_severity_level
        4
    """
    import onnxruntime as ort

    return _quiet(ort.RunOptions())


def _quiet(options: Any) -> Any:
    """``options`` (session or run) with ONNX Runtime's log lines for them off."""
    options.log_severity_level = _FATAL
    return options


# -- the runtime ---------------------------------------------------------------------------------


class OrtEngine:
    """One ONNX Runtime session.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> src = SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."))
        >>> engine = OrtRuntime().open(src)
        >>> engine.output_names(), engine.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
        (['y'], {'y': array([0., 2.], dtype=float32)})
    """

    def __init__(self, session: Any) -> None:
        self.session = session

    def get_inputs(self) -> list[InputInfo]:
        return as_input_infos(self.session.get_inputs())

    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        wanted = list(names) if names is not None else self.output_names()
        return dict(zip(wanted, self.session.run(wanted, feed, run_options())))


class OrtRuntime:
    """ONNX Runtime on ``providers`` (CPU by default), graph optimisations on unless ``optimize`` is False.

    Example:
        >>> rt = OrtRuntime(optimize=False)
        >>> rt.settings(), rt.rounding_note(), OrtRuntime().settings()
        ('with graph optimisations disabled (ORT_DISABLE_ALL)', '', 'with graph optimisations')
    """

    name = "ort"
    carries_branches = True  # a tensor carried out of an If branch: an empty value when the branch did not run

    def __init__(self, providers: Sequence[str] | str | None = None, optimize: bool = True) -> None:
        self.providers = resolve_providers(providers)
        self.optimize = optimize
        self.ran: list[str] | None = None  # the providers the last session runs on (ORT drops one that fails to load)

    def open(self, model: "SessionSource | Path", outputs: Sequence["str | onnx.ValueInfoProto"] = (), *,
             only: bool = False) -> OrtEngine:
        source = open_source(model)[0] if isinstance(model, Path) else model
        return self._engine(source_session(source, outputs, only=only, optimize=self.optimize, providers=self.providers))

    def open_tapped(self, source: SessionSource, tensors: Sequence[str]) -> OrtEngine:
        return self.open(source)  # the taps are outputs of the in-memory graph, typed there

    def open_part(self, source: SessionSource, part: "onnx.ModelProto") -> OrtEngine:
        return self._engine(source_session(source, part=part, optimize=self.optimize, providers=self.providers))

    def open_file(self, path: Path, *, timing: bool = False) -> OrtEngine:
        """ORT reads the file itself (its external data from beside it), as any user of it would."""
        options = functools.partial(session_options, optimize=self.optimize, spin=timing)
        return self._engine(open_session(str(path), options, self.providers))

    def settings(self) -> str:
        return "with graph optimisations" if self.optimize else "with graph optimisations disabled (ORT_DISABLE_ALL)"

    def rounding_note(self) -> str:
        return FUSION_NOTE if self.optimize else ""

    def _engine(self, session: Any) -> OrtEngine:
        self.ran = list(session.get_providers())
        return OrtEngine(session)

    def exposable(self, model: "SessionSource | Path") -> set[str] | None:
        return None  # every tensor of the graph can be a graph output

    def describe(self) -> RuntimeInfo:
        """The providers the sessions ran on (those asked for until one was built), and a note
        naming any asked for that ORT left out."""
        import onnxruntime as ort

        ran = self.ran if self.ran is not None else self.providers
        return RuntimeInfo("ONNX Runtime", ort.__version__, _short(ran), "the file's own types",
                           providers_note(self.providers, ran))


def providers_note(asked: Sequence[str], ran: Sequence[str]) -> str:
    """What to say when ORT left out a provider that was asked for (it falls back to the others,
    silently, when one fails to load); ``""`` when all ran.

    Example:
        >>> providers_note(["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"])
        'CUDA was asked for but did not load: ONNX Runtime ran on CPU'
        >>> providers_note(["CPUExecutionProvider"], ["CPUExecutionProvider"])
        ''
    """
    missing = [p for p in asked if p not in ran]
    if not missing:
        return ""
    return f"{_short(missing)} was asked for but did not load: ONNX Runtime ran on {_short(ran)}"


def _short(providers: Sequence[str]) -> str:
    return ", ".join(p.removesuffix("ExecutionProvider") for p in providers)


# -- typing what shape inference leaves open -----------------------------------------------------


def ort_typer(held: Mapping[str, np.ndarray] | None = None) -> "TensorTyper":
    """ONNX Runtime as the fallback typer of :func:`~layertap.onnxfile.tensor_types.tensor_types`:
    the types ORT infers for a model's untyped tensors (``held``: the arrays its weights held in
    memory refer to).

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        >>> ort_typer()(m, Path("."), ["y"])["y"].type.tensor_type.elem_type
        1
    """
    def typer(model: "onnx.ModelProto", folder: Path, tensors: Sequence[str]) -> dict[str, "onnx.ValueInfoProto"]:
        return ort_types(SessionSource(model, folder, held=held), tensors)

    return typer


def ort_types(source: SessionSource, tensors: Sequence[str]) -> dict[str, "onnx.ValueInfoProto"]:
    """Ask ONNX Runtime for the types of tensors that shape inference left untyped.

    ORT accepts untyped graph outputs and reports their types after its own
    inference; nothing is run. Tensors ORT cannot type are left out.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        >>> ort_types(SessionSource(m, Path(".")), ["x"])["x"].type.tensor_type.elem_type
        1
    """
    import onnx

    try:
        sess = source_session(source, tensors)
    except Exception:  # noqa: BLE001 - reported by the caller as untyped
        return {}
    out = {}
    for o in sess.get_outputs():
        if o.name not in tensors:
            continue
        seq = o.type.startswith("seq(tensor(")
        inner = o.type[len("seq("):-1] if seq else o.type
        if not inner.startswith("tensor("):
            continue
        elem = ORT_ELEM.get(inner[len("tensor("):-1])
        if elem is None:
            continue
        shape = [d if isinstance(d, (int, str)) and d != "" else None for d in (o.shape or [])]
        if seq:
            out[o.name] = onnx.helper.make_tensor_sequence_value_info(o.name, elem, None)
        else:
            out[o.name] = onnx.helper.make_tensor_value_info(o.name, elem, shape if o.shape is not None else None)
    return out


class _OrtPlugin:
    """ONNX Runtime as a runtime plug-in (:class:`~.plugins.RuntimePlugin`): the default graph runtime."""

    name = "ort"
    title = "ONNX Runtime"
    short = "ORT"  # where a column header has little room (fix's latency)
    form = "graph"
    suffixes: tuple[str, ...] = ()
    matrix = {verb: YES for verb in VERBS}

    def open(self, settings: RuntimeSettings) -> OrtRuntime:
        settings.refuse(self.name, ("providers", "optimize"),
                        "--ov-precision and --ov-device are OpenVINO's: add --runtime openvino")
        return OrtRuntime(settings.providers, True if settings.optimize is None else settings.optimize)


PLUGIN = _OrtPlugin()
