"""ONNX Runtime for the ONNX side: sessions on in-memory models, and tensor types.

Everything here imports ``onnx``/``onnxruntime`` lazily, never torch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx

# ORT's type names (``tensor(float)``) -> numpy dtypes
ORT_NUMPY: dict[str, Any] = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}

# ORT's element type names (``tensor(float)``) -> ONNX TensorProto element types
_ORT_ELEM = {
    "float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "string": 8,
    "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13, "bfloat16": 16,
}


# short names users type -> ORT's provider names
_PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider", "openvino": "OpenVINOExecutionProvider", "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider", "directml": "DmlExecutionProvider", "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider", "qnn": "QNNExecutionProvider", "xnnpack": "XnnpackExecutionProvider",
}


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

    from ..errors import LayertapError

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


_FATAL = 4
#: external-data location of weights that live in memory (handed to ORT by :class:`SessionSource`)
IN_MEMORY = "*/layertap-in-memory/*"


class SessionSource:
    """ORT sessions on one in-memory model, any number of times, each with its own extra outputs.

    With ``move_weights``, inline weights above ``threshold`` bytes are taken
    out of the model once, into numpy arrays that every session receives as
    external initializers (on CPU ORT uses them in place): a session then
    parses only the graph, instead of the whole model being serialised again
    for each one (each copy costs the weights' size for a file with inline
    weights). :attr:`model` is then a new, small proto: drop every reference
    to the one passed in, so its memory is freed. Without ``move_weights`` the
    model is used as it is (for a caller that writes it back, weights and all).

    Args:
        model: the loaded model.
        folder: where its external data files lie.
        origin: the file ``model`` was read from, when its nodes and weights are still the file's
            (only outputs added): a runtime that reads files itself (OpenVINO) reads that instead
            of the graph serialised again with its weights.

    Example:
        >>> import numpy as np, onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
        >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
        >>> src = SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."), move_weights=True)
        >>> src.model.graph.initializer[0].HasField("raw_data")
        False
        >>> sess = src.session(["m"])
        >>> [o.name for o in sess.get_outputs()], float(sess.run(None, {"x": np.ones((1, 512), np.float32)})[1].sum())
        (['y', 'm'], 512.0)
    """

    def __init__(self, model: "onnx.ModelProto", folder: Path, *, move_weights: bool = False, threshold: int = 1024,
                 origin: Path | None = None) -> None:
        import onnx

        self.folder = folder
        self.origin = origin
        self.names: list[str] = []
        self.arrays: list[np.ndarray] = []
        if move_weights:
            self.names, self.arrays = _take_inline_weights(model, threshold)
            # protobuf keeps a cleared field's bytes until the whole message is
            # freed: a copy holds only the graph, the caller drops the original
            small = onnx.ModelProto()
            small.CopyFrom(model)
            model = small
        self.model = model
        from .scopemap.graph_facts import is_quantizer
        from .walk import model_nodes

        # only a quantised graph reaches ORT's int8 kernels: a float one never pays for the probe
        self.int8 = any(is_quantizer(n) for n in model_nodes(model))

    def session(self, outputs: Sequence[str | "onnx.ValueInfoProto"] = (), *, optimize: bool = True, only: bool = False,
                providers: Sequence[str] | None = None) -> Any:
        """A session whose outputs are the model's plus ``outputs`` (names, typed or not); ``only``: just ``outputs``.

        ``providers``: full ORT provider names (CPU when ``None``).
        """
        import onnx

        graph = self.model.graph
        saved = list(graph.output)
        if only:
            del graph.output[:]
        for o in outputs:
            graph.output.append(o if isinstance(o, onnx.ValueInfoProto) else onnx.helper.make_empty_tensor_value_info(o))
        try:
            data = self.model.SerializeToString()
        finally:
            del graph.output[:]
            graph.output.extend(saved)
        return self._open(data, self.names, self.arrays, optimize, providers)

    def session_for(self, model: "onnx.ModelProto", *, optimize: bool = True, providers: Sequence[str] | None = None) -> Any:
        """A session on another graph built from this one's nodes (a part of it), reading the
        weights this source took out by reference, without copying them.

        Example:
            >>> import numpy as np, onnx.helper as h, onnx.numpy_helper as nh
            >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
            >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
            ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
            >>> src = SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."), move_weights=True)
            >>> part = h.make_model(h.make_graph([h.make_node("MatMul", ["w", "w"], ["ww"])], "part", [],
            ...     [h.make_empty_tensor_value_info("ww")], list(src.model.graph.initializer)),
            ...     opset_imports=[h.make_opsetid("", 17)])
            >>> float(src.session_for(part).run(None, {})[0].sum())
            512.0
        """
        wanted = {t.name for t in model.graph.initializer if _in_memory(t)}
        picked = [(n, a) for n, a in zip(self.names, self.arrays) if n in wanted]
        return self._open(model.SerializeToString(), [n for n, _ in picked], [a for _, a in picked], optimize, providers)

    def _open(self, data: bytes, names: Sequence[str], arrays: Sequence[np.ndarray], optimize: bool,
              providers: Sequence[str] | None) -> Any:
        import onnxruntime as ort

        quiet_logs()

        def options() -> Any:
            so = quiet_options()
            if not optimize:
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            # ORT's worker threads spin-wait for work by default, taking cores from what layertap does
            # between runs (PyTorch's forward, the weight check on its own thread, numpy's statistics)
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.folder.resolve()))
            if names:
                so.add_external_initializers(list(names), [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays])
            return so

        return open_session(data, options, providers, exact_int8=self.int8)


# ONNX Runtime's own session option: on x86 CPUs without VNNI its u8 x s8 int8 kernels add pairs of
# products into 16 bits with saturation (VPMADDUBSW), so a file with full-range int8 weights gives other
# numbers there than on a VNNI CPU (measured: 16 quanta on a QGemm's output); "1" makes ORT turn the
# weights of its fused int8 nodes into u8 and use its exact u8 x u8 kernels instead
EXACT_INT8 = ("session.x64quantprecision", "1")
# ORT 1.32 refuses that rewrite where two nodes read one int8 weight (a part graph's pieces, tied weights)
_EXACT_REFUSED = "Attempt to replace the existing tensor"


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


def quiet_options() -> Any:
    """``SessionOptions`` that keep ONNX Runtime's own log lines off stderr (its exception keeps the text).

    Example:
        >>> quiet_options().log_severity_level
        4
    """
    import onnxruntime as ort

    return _quiet(ort.SessionOptions())


def open_session(model: "str | bytes", options: Callable[[], Any] | None = None, providers: Sequence[str] | None = None,
                 *, exact_int8: bool = True) -> Any:
    """An ``InferenceSession`` on ``model`` (a path or serialised bytes) with the ``SessionOptions``
    ``options()`` makes: the one place layertap creates an ONNX Runtime session (:class:`SessionSource`
    and the ``ort`` runtime open theirs through it; only a repro package's standalone ``repro.py``
    has its own). Its int8 sums are exact on every CPU: :data:`EXACT_INT8` is added where ORT's
    kernels saturate (:func:`int8_saturates`; it applies with graph optimisations, as at
    ``ORT_DISABLE_ALL`` nothing is fused and the float QDQ path runs). Where ORT refuses it (two
    nodes reading one int8 weight), or with ``exact_int8=False``, the session is opened as ORT
    opens it by default.

    Example:
        >>> model, feed, exact, saturated = int8_probe()
        >>> float(open_session(model.SerializeToString()).run(None, feed)[0].item()) == exact, exact, saturated
        (True, 64516.0, 510.0)
    """
    import onnxruntime as ort

    make = options or ort.SessionOptions
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


def _in_memory(t: Any) -> bool:
    """An initializer whose data :class:`SessionSource` holds (location :data:`IN_MEMORY`)."""
    return any(kv.key == "location" and kv.value == IN_MEMORY for kv in t.external_data)


def _take_inline_weights(model: "onnx.ModelProto", threshold: int) -> tuple[list[str], list[np.ndarray]]:
    """Move the main graph's big inline initializers into arrays; leave references in their place."""
    import onnx
    from onnx import numpy_helper

    names, arrays = [], []
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or tensor_nbytes(t) < threshold:
            continue
        arr = np.ascontiguousarray(numpy_helper.to_array(t))
        if arr.dtype == object or arr.dtype.kind == "V":  # strings, ml_dtypes' bfloat16/float8: ORT cannot take them
            continue
        hold_in_memory(t, arr)
        names.append(t.name)
        arrays.append(arr)
    return names, arrays


def hold_in_memory(t: "onnx.TensorProto", array: np.ndarray) -> None:
    """Make initializer ``t`` a reference to ``array``, which a :class:`SessionSource` holds under its name
    (inline values and any data file reference dropped from the proto)."""
    import onnx

    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        t.ClearField(field)
    del t.external_data[:]
    t.data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", IN_MEMORY), ("offset", "0"), ("length", str(array.nbytes))):
        t.external_data.add(key=key, value=value)


def tensor_nbytes(t: "onnx.TensorProto") -> int:
    """The size of a tensor's values from its shape and type (``ByteSize`` walks the whole proto: 7 ms
    for resnet50's inline weights); a type of unknown size counts a byte per element.

    Example:
        >>> import onnx.helper as h
        >>> tensor_nbytes(h.make_tensor("w", 10, [4, 8], [0.0] * 32))  # float16
        64
    """
    import math

    import onnx

    try:
        size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        size = 1
    return math.prod(t.dims) * size


#: the domain of ONNX Runtime's blocked-layout kernels (``ORT_ENABLE_ALL`` on x86 writes them into saved files)
NCHWC_DOMAIN = "com.microsoft.nchwc"


@functools.lru_cache(maxsize=1)
def nchwc_block_size() -> int | None:
    """The channel block of ONNX Runtime's NCHWc layout on this machine (8 with AVX2, 16 with
    AVX-512), read off one ``ReorderInput`` of a known tensor; ``None`` where ORT has no NCHWc
    kernels (a file that uses them does not run there either).

    Example:
        >>> nchwc_block_size() in (None, 4, 8, 16, 32)
        True
    """
    import onnx.helper as h

    node = h.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC_DOMAIN)
    graph = h.make_graph([node], "probe", [h.make_tensor_value_info("x", 1, [1, 64, 1, 2])],
                         [h.make_empty_tensor_value_info("y")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(NCHWC_DOMAIN, 1)])
    x = np.arange(128, dtype=np.float32).reshape(1, 64, 1, 2)
    try:
        y = SessionSource(model, Path(".")).session(optimize=False).run(None, {"x": x})[0].ravel()
    except Exception:  # noqa: BLE001 - no NCHWc kernels in this build or on this CPU
        return None
    # NCHW keeps x[0, c, 0, 1] (= 2c + 1) after x[0, c, 0, 0]; a block of b channels puts b values first
    at = np.flatnonzero(y == 1.0)
    return int(at[0]) if at.size and at[0] > 1 else None


def as_float32(a: np.ndarray) -> np.ndarray:
    """A float16 array as float32 through one ONNX Runtime ``Cast`` (vectorised, on every core:
    5-10x numpy's one-thread cast, which was most of the cost of judging a float16 file).
    Exact, like numpy's; small arrays, and any ORT refuses, take numpy.

    Example:
        >>> out = as_float32(np.full(5000, 1.5, np.float16))
        >>> out.dtype, float(out.sum())
        (dtype('float32'), 7500.0)
    """
    if a.dtype == np.float16 and a.size >= 4096:
        try:
            return _half_to_float().run(None, {"x": np.ascontiguousarray(a)})[0]
        except Exception:  # noqa: BLE001 - numpy below gives the same values
            pass
    return a.astype(np.float32)


@functools.lru_cache(maxsize=1)
def _half_to_float() -> Any:
    """A session of one ``Cast`` float16 -> float32 for tensors of any shape."""
    import onnx.helper as h

    graph = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=1)], "widen",
                         [h.make_tensor_value_info("x", 10, None)], [h.make_tensor_value_info("y", 1, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return SessionSource(model, Path(".")).session(optimize=False)


def rounded_through(a: np.ndarray, low: str) -> np.ndarray:
    """A float32 array rounded to ``low`` (``float16`` or ``bfloat16``) and back, through one ONNX Runtime
    ``Cast`` pair (vectorised, on every core; an ideal run's weights); small arrays, and any ORT refuses,
    take numpy (:meth:`layertap.numformats.Format.rounded`), which gives the same values.

    Example:
        >>> rounded_through(np.full(5000, 1.0 + 2**-12, np.float32), "float16")[:2].tolist()
        [1.0, 1.0]
    """
    from ..numformats import Format

    if a.dtype == np.float32 and a.size >= 4096 and low in ("float16", "bfloat16"):
        try:
            return _round_trip(low).run(None, {"x": np.ascontiguousarray(a)})[0]
        except Exception:  # noqa: BLE001 - numpy below gives the same values
            pass
    return Format(low).rounded(a)


@functools.lru_cache(maxsize=2)
def _round_trip(low: str) -> Any:
    """A session of ``Cast`` float32 -> ``low`` -> float32 for tensors of any shape."""
    import onnx.helper as h

    to = {"float16": 10, "bfloat16": 16}[low]
    graph = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=to), h.make_node("Cast", ["y"], ["z"], to=1)], "round",
                         [h.make_tensor_value_info("x", 1, None)], [h.make_tensor_value_info("z", 1, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return SessionSource(model, Path(".")).session(optimize=False)


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


def tensor_types(
    model: "onnx.ModelProto", folder: Path, tensors: Sequence[str] | None = None, *, source: SessionSource | None = None
) -> dict[str, "onnx.ValueInfoProto"]:
    """Typed value infos: ONNX shape inference first, ONNX Runtime for what it leaves untyped.

    ``tensors``: the names that must be typed (default: every node output).
    Files with ops ONNX does not know (``com.microsoft`` fusions) are typed by
    ONNX Runtime (through ``source`` when given); tensors neither can type are left out.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> sorted(tensor_types(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path(".")))
        ['x', 'y']
    """
    known = inferred_types(model)
    wanted = tensors if tensors is not None else [t for n in model.graph.node for t in n.output if t]
    missing = [t for t in dict.fromkeys(wanted) if t not in known]
    if missing:
        known.update(ort_types(source or SessionSource(model, folder), missing))
    return known


def inferred_types(model: "onnx.ModelProto") -> dict[str, "onnx.ValueInfoProto"]:
    """Typed value infos by tensor name from ONNX shape inference (non-strict), plus initializers.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 0, None)])
        >>> inferred_types(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))["y"].type.tensor_type.elem_type
        1
    """
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - shape inference fails on some valid files; ORT types the rest
        inferred = model
    g = inferred.graph
    out: dict[str, onnx.ValueInfoProto] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if is_typed(vi):
            out[vi.name] = vi
    for init in g.initializer:
        if init.name not in out:
            out[init.name] = onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
    return out


def is_typed(vi: Any) -> bool:
    """True when ``vi`` has a type (a tensor: with its element type)."""
    which = vi.type.WhichOneof("value")
    if which != "tensor_type":
        return which is not None
    return vi.type.tensor_type.elem_type != 0


def ort_types(source: SessionSource, tensors: Sequence[str]) -> dict[str, "onnx.ValueInfoProto"]:
    """Ask ONNX Runtime for the types of tensors that shape inference left untyped.

    ORT accepts untyped graph outputs and reports their types after its own
    inference; nothing is run. Tensors ORT cannot type are left out.

    Example:
        >>> import onnx.helper as h
        >>> from pathlib import Path
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        >>> ort_types(SessionSource(m, Path(".")), ["x"])["x"].type.tensor_type.elem_type
        1
    """
    import onnx

    try:
        sess = source.session(tensors)
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
        elem = _ORT_ELEM.get(inner[len("tensor("):-1])
        if elem is None:
            continue
        shape = [d if isinstance(d, (int, str)) and d != "" else None for d in (o.shape or [])]
        if seq:
            out[o.name] = onnx.helper.make_tensor_sequence_value_info(o.name, elem, None)
        else:
            out[o.name] = onnx.helper.make_tensor_value_info(o.name, elem, shape if o.shape is not None else None)
    return out
