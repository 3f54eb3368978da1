"""The conversions ``layertap fix`` tries, each with a list of ONNX node names kept in float32:
float16 with onnxconverter-common (``keep_io_types=True``, ``node_block_list``) and int8 QDQ with
``onnxruntime.quantization.quantize_static`` (``nodes_to_exclude``), calibrated on real samples
once (ONNX Runtime's calibration cache), so every set is quantised with the same ranges. The
float16 file gets the converter's types repaired where ONNX Runtime would refuse them
(:func:`retype_float16`: taps, model outputs that other nodes read too)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import LayertapError, one_line
from ..onnxfile.tensor_types import constant_tensor

if TYPE_CHECKING:  # pragma: no cover
    import onnx

FORMATS = ("fp16", "int8")
# onnxconverter-common's options besides the block list. Its default max_finite_val (1e4) clamps
# every larger weight, those of the nodes it keeps in float32 too (it casts their inputs first,
# then converts the initializers no longer named by a kept node): the largest finite float16 keeps
# the weights a kept node needs.
FP16_OPTIONS = {"keep_io_types": True, "max_finite_val": 65504.0}


class Converter:
    """Converts a float32 model with some nodes kept in float32; ``to`` is ``fp16`` or ``int8``.

    ``calib`` (int8): feeds (input name -> array with batch axis) to calibrate on. ``folder``:
    where the calibration cache lives (a temporary folder the caller removes).

    Example:
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> import onnx, tempfile; from pathlib import Path
        >>> d = Path(tempfile.mkdtemp()); _ = write_tiny_model(d)
        >>> Converter("fp16", d).convert(onnx.load(d / "m.onnx"), [], d / "h.onnx").name
        'h.onnx'
    """

    def __init__(self, to: str, folder: Path, calib: Sequence[dict[str, Any]] = ()) -> None:
        if to not in FORMATS:
            raise LayertapError(f"unknown conversion {to!r}; use one of {', '.join(FORMATS)}")
        if to == "int8" and not calib:
            raise LayertapError("int8 quantisation needs calibration samples (--calib PATH, else --inputs or --samples)")
        self.to, self.folder, self.calib = to, Path(folder), list(calib)
        self.cache = self.folder / "calibration.json"
        self.retyped: dict[str, None] = {}  # what :func:`retype_float16` repaired in any conversion so far
        self.unshared: dict[str, None] = {}  # weights :func:`unshare_weights` copied in any conversion so far

    @property
    def tool(self) -> str:
        """The converter in words, with its version."""
        if self.to == "fp16":
            import onnxconverter_common

            return f"onnxconverter-common {onnxconverter_common.__version__}"
        import onnxruntime

        return f"onnxruntime.quantization {onnxruntime.__version__}"

    def convert(self, model: "onnx.ModelProto", nodes: Sequence[str], out: Path) -> Path:
        """Write ``model`` converted with ``nodes`` kept in float32 to ``out``; a model the converter
        cannot handle is a one-line error with the converter's reason."""
        try:
            with _quiet():
                if self.to == "fp16":
                    self._fp16(model, nodes, out)
                else:
                    self._int8(model, nodes, out)
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - any converter failure is the converter's reason
            raise LayertapError(f"{self.tool} cannot convert this model: {one_line(e, first=True)}") from None
        return out

    def _fp16(self, model: "onnx.ModelProto", nodes: Sequence[str], out: Path) -> None:
        import onnx
        from onnxconverter_common import float16

        copy = _copy(model)
        declared_once = outputs_declared_once(copy)
        self.unshared.update(dict.fromkeys(unshare_weights(copy, nodes)))
        converted = float16.convert_float_to_float16(copy, node_block_list=list(nodes), **FP16_OPTIONS)
        restore_float32(model, converted, nodes)
        self.retyped.update(dict.fromkeys(declared_once + retype_float16(converted, nodes)))
        onnx.save(converted, str(out))

    def _int8(self, model: "onnx.ModelProto", nodes: Sequence[str], out: Path) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self, feeds: list[dict[str, Any]]) -> None:
                self.it = iter(feeds)

            def get_next(self) -> dict[str, Any] | None:
                return next(self.it, None)

        quantize_static(_copy(model), str(out), Reader(self.calib), quant_format=QuantFormat.QDQ,
                        nodes_to_exclude=list(nodes), calibration_cache_path=str(self.cache))


def unshare_weights(model: "onnx.ModelProto", nodes: Sequence[str]) -> list[str]:
    """Give the kept nodes their own copy of each initializer they share with nodes the converter makes
    float16 (tf2onnx shares one Conv weight among several Convs); returns the names copied. Shared, the
    converter makes the weight float16 for the others and a kept node reads float16 where it computes in
    float32: a file ONNX Runtime refuses. Works in place on ``model`` (the converter's copy).

    Example:
        >>> import numpy as np, onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.ones((2, 2), np.float32), "w")
        >>> nodes = [h.make_node("MatMul", ["x", "w"], ["a"], name="kept"), h.make_node("MatMul", ["a", "w"], ["y"], name="other")]
        >>> g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", 1, [2, 2])], [h.make_tensor_value_info("y", 1, [2, 2])], [w])
        >>> m = h.make_model(g)
        >>> unshare_weights(m, ["kept"]), [list(n.input) for n in m.graph.node]
        (['w'], [['x', 'w_float32'], ['a', 'w']])
    """
    kept = set(nodes)
    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for t in dict.fromkeys(n.input):
            if t in inits:
                readers.setdefault(t, []).append(n)
    taken = set(inits) | {t for n in model.graph.node for t in (*n.input, *n.output)}
    copied = []
    for name, users in readers.items():
        mine = [n for n in users if n.name in kept]
        if not mine or len(mine) == len(users) or inits[name].data_type != 1:
            continue
        copy = model.graph.initializer.add()
        copy.CopyFrom(inits[name])
        copy.name = next(f"{name}_float32{k or ''}" for k in range(len(taken) + 1) if f"{name}_float32{k or ''}" not in taken)
        taken.add(copy.name)
        for n in mine:
            for i, t in enumerate(n.input):
                if t == name:
                    n.input[i] = copy.name
        copied.append(name)
    return copied


def restore_float32(model: "onnx.ModelProto", converted: "onnx.ModelProto", nodes: Sequence[str]) -> list[str]:
    """Undo what onnxconverter-common does to the nodes it keeps in float32; returns the names of the
    weights and outputs put back.

    It casts a kept node's inputs first and then converts every initializer no kept node names any
    more, so a kept node may read its weights through ``Cast(float16 -> float)``: rounded, and
    clamped at ``max_finite_val``; such a weight, read only by casts that feed kept nodes, gets its
    float32 values back (the cast then casts float to float). And a kept node that makes a model
    output has that output cast to float16 despite ``keep_io_types``: the cast is made to float.
    """
    kept = set(nodes)
    original = {t.name: t for t in model.graph.initializer if t.data_type == 1}
    users: dict[str, list[Any]] = {}
    for n in converted.graph.node:
        for name in n.input:
            users.setdefault(name, []).append(n)

    def kept_only(name: str) -> bool:  # read only through casts that feed kept nodes
        casts = users.get(name, [])
        return bool(casts) and all(c.op_type == "Cast" and all(u.name in kept for o in c.output for u in users.get(o, ()))
                                   for c in casts)

    restored = []
    for t in converted.graph.initializer:
        if t.name in original and t.data_type != 1 and kept_only(t.name):
            t.CopyFrom(original[t.name])
            restored.append(t.name)
    restored += _float_constants(model, converted, kept_only)
    restored += _float_outputs(model, converted)
    return restored


def _float_constants(model: "onnx.ModelProto", converted: "onnx.ModelProto", kept_only: Any) -> list[str]:
    """``Constant`` nodes (paddle2onnx writes every weight so, with no node name a block list could give) that
    only kept nodes read, made float16 by the converter all the same: their float32 values put back, by the
    name of the tensor each makes."""
    def value(node: Any) -> Any:
        return constant_tensor(node) if node.output else None

    original = {n.output[0]: v for n in model.graph.node if (v := value(n)) is not None and v.data_type == 1}
    restored = []
    for n in converted.graph.node:
        v = value(n)
        if v is not None and v.data_type != 1 and n.output[0] in original and kept_only(n.output[0]):
            v.CopyFrom(original[n.output[0]])
            restored.append(n.output[0])
    return restored


def _float_outputs(model: "onnx.ModelProto", converted: "onnx.ModelProto") -> list[str]:
    """Model outputs that were float32 and came out float16 behind a Cast: cast to float instead."""
    was_float = {o.name for o in model.graph.output if o.type.tensor_type.elem_type == 1}
    makers = {o: n for n in converted.graph.node for o in n.output}
    fixed = []
    for out in converted.graph.output:
        maker = makers.get(out.name)
        if out.name in was_float and out.type.tensor_type.elem_type == 10 and maker is not None and maker.op_type == "Cast":
            for a in maker.attribute:
                if a.name == "to":
                    a.i = 1
            out.type.tensor_type.elem_type = 1
            fixed.append(out.name)
    return fixed


def outputs_declared_once(model: "onnx.ModelProto") -> list[str]:
    """Drop the ``value_info`` entries that repeat a model output's declaration (some tools write
    them); returns their names. onnxconverter-common retypes such an entry float16 while the output
    stays float, and removes the cast that makes a kept node's output: ONNX Runtime refuses the file,
    or the converter fails.

    Example:
        >>> import onnx.helper as h
        >>> vi = h.make_tensor_value_info("y", 1, [2])
        >>> m = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [vi], [vi], value_info=[vi]))
        >>> outputs_declared_once(m), len(m.graph.value_info)
        (['y'], 0)
    """
    outputs = {o.name for o in model.graph.output}
    repeated = [v for v in model.graph.value_info if v.name in outputs]
    for v in repeated:
        model.graph.value_info.remove(v)
    return [v.name for v in repeated]


def retype_float16(converted: "onnx.ModelProto", nodes: Sequence[str], op_block_list: Any = None) -> list[str]:
    """Make the types onnxconverter-common writes agree with the nodes that make and read them, so
    ONNX Runtime loads the file; returns the model outputs re-wired and the nodes retyped.

    With ``keep_io_types`` it renames the maker's output of each float32 model output and writes the
    output itself with a ``Cast`` to float, but the other nodes reading that tensor (a tap: an
    intermediate tensor that is also a model output) still read it by its name, now the float32 copy,
    while it declares their outputs float16. Each reader it made float16 (a node outside ``nodes`` and
    ``op_block_list``) reads the float16 tensor instead (made by a ``Cast`` where a kept node makes the
    output). And it declares float16 the outputs of nodes whose type an attribute fixes without
    changing the attribute (:func:`_float16_attributes`).

    Example:
        >>> import onnx, onnx.helper as h
        >>> from onnxconverter_common import float16
        >>> vi = lambda n: h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2])
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["tap"], name="r"), h.make_node("Neg", ["tap"], ["y"], name="n")],
        ...                  "g", [vi("x")], [vi("y"), vi("tap")])
        >>> m = float16.convert_float_to_float16(h.make_model(g), keep_io_types=True)
        >>> retype_float16(m, []), [n.input[0] for n in m.graph.node if n.name == "n"]
        (['tap'], ['r_cast_to_tap'])
    """
    from onnxconverter_common import float16

    graph = converted.graph
    blocked = set(float16.DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
    kept = set(nodes)
    declared = {v.name: v.type.tensor_type.elem_type for v in graph.value_info}
    half_readers: dict[str, list[Any]] = {}  # a Cast reads either type; blocked and kept nodes read float
    for n in graph.node:
        if n.op_type != "Cast" and n.op_type not in blocked and n.name not in kept:
            for name in dict.fromkeys(n.input):
                half_readers.setdefault(name, []).append(n)
    fixed = []
    for out in graph.output:
        readers = half_readers.get(out.name, [])
        if out.type.tensor_type.elem_type != 1 or not readers:
            continue
        half = _float16_copy(graph, out, declared)
        for n in readers:
            for i, name in enumerate(n.input):
                if name == out.name:
                    n.input[i] = half
        fixed.append(out.name)
    made_half = [n for n in graph.node if n.output and declared.get(n.output[0]) == 10 and n.name not in kept
                 and n.op_type not in blocked]
    return fixed + [n.name for n in made_half if _float16_attributes(n)] + _cast_types(graph)


def _cast_types(graph: Any) -> list[str]:
    """Declare each ``Cast``'s output in the type its ``to`` makes, where ``value_info`` says another (the
    converter's cast after a node it keeps in float32, a ``Resize``, takes over the node's output name and
    leaves its float declaration, which another tool wrote: onnxslim declares every tensor); returns the
    casts whose outputs were retyped."""
    declared = {v.name: v for v in graph.value_info}
    fixed = []
    for n in graph.node:
        info = declared.get(n.output[0]) if n.op_type == "Cast" and n.output else None
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        if info is not None and to is not None and info.type.tensor_type.elem_type not in (0, to):
            info.type.tensor_type.elem_type = to
            fixed.append(n.name)
    return fixed


def _float16_attributes(node: Any) -> bool:
    """Make float16 a node whose float output type an attribute fixes, or its default: ``Cast``'s
    ``to``, ``ConstantOfShape`` without ``value`` (a float 0), ``Constant``'s ``value_float(s)``;
    whether it changed."""
    from onnx import helper, numpy_helper

    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Cast" and attrs["to"].i == 1:
        attrs["to"].i = 10
    elif node.op_type == "ConstantOfShape" and "value" not in attrs:
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float16))))
    elif node.op_type == "Constant" and ("value_float" in attrs or "value_floats" in attrs):
        old = attrs.get("value_float") or attrs["value_floats"]
        values = np.array(old.f if old.name == "value_float" else list(old.floats), np.float16)
        node.attribute.remove(old)
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(values)))
    else:
        return False
    return True


def _float16_copy(graph: Any, out: Any, declared: dict[str, int]) -> str:
    """The float16 tensor holding model output ``out``'s values: what the converter's ``Cast`` to float
    reads, else a new ``Cast`` to float16 of ``out`` (its maker was kept in float32)."""
    from onnx import helper

    at = next((i for i, n in enumerate(graph.node) if out.name in n.output), -1)
    maker = graph.node[at] if at >= 0 else None
    if maker is not None and maker.op_type == "Cast" and declared.get(maker.input[0]) == 10:
        return maker.input[0]
    taken = {v.name for v in graph.value_info} | {o for n in graph.node for o in n.output}
    half = next(f"{out.name}_float16{k or ''}" for k in range(len(taken) + 1) if f"{out.name}_float16{k or ''}" not in taken)
    graph.node.insert(at + 1, helper.make_node("Cast", [out.name], [half], name=half, to=10))
    info = graph.value_info.add()
    info.CopyFrom(out)
    info.name = half
    info.type.tensor_type.elem_type = 10
    declared[half] = 10
    return half


def _copy(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """The converters edit the model they are given; the caller's stays as read."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


# the steps around the converter, copied into --config-out's convert.py (configs.convert_script)
SCRIPT_HELPERS = (outputs_declared_once, unshare_weights, restore_float32, constant_tensor, _float_constants, _float_outputs,
                  retype_float16, _float16_copy, _float16_attributes, _cast_types)


@contextlib.contextmanager
def _quiet():
    """The converters' warnings and log lines (one per node kept) would flood the terminal."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
