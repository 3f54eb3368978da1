"""The parameters an ONNX file holds, by name, as float32 read through the file's own number format.

What :mod:`layertap.comparing`'s weight check reads. A parameter is

* a floating-point initializer of the main graph, under its own name (float16 and bfloat16
  converters keep the names; the value is widened to float32), or under the name of the
  ``Cast`` that widens it (a weight stored in another type under another name);
* the output of a ``DequantizeLinear`` whose integer input is an initializer (a quantizer's
  weight or bias), under the name the quantizer gave it back: ``fc.bias``, or
  ``fc.weight_DequantizeLinear_Output`` read as ``fc.weight``.

Each comes with its format's rounding: how far from the original float32 value a faithful
conversion may land, per element (half a unit in the last place of float16 / bfloat16,
half a quantisation step ``scale / 2`` for integers). Quantisation scales and zero points,
integer tensors and names exporters make up (``onnx::Conv_193``, ``val_12``) are not parameters.

Weights are read one at a time, from where the compare already holds them (arrays taken out of
the model, :mod:`layertap.onnxfile.held`), else from the proto or its external data file; the
graph is never changed. Never imports torch.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ..errors import OnnxFileError
from ..numformats import CONVERTER_MAX
from .modelfile import external_ref
from .scopemap import BN_FOLD_RULES, plain_weight_name, rules
from .tensor_types import constant_tensor, tensor_nbytes

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: half the relative spacing of each float type's values: the most round-to-nearest moves a value
#: (bfloat16 at twice that: some converters truncate)
_UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-7, "float32": 2.0**-24, "float64": 0.0}
#: onnxconverter-common raises float16 values closer to zero than 1e-7 to 1e-7 (``min_positive_val``)
_FLOOR = {"float16": 1.2e-7}
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# names the exporters make up for tensors that have none: they say nothing about which parameter it is
_ANONYMOUS = re.compile(r"^(?:.*::.*|_?val_\d+|\d+|Constant_\d+.*)$")


@dataclass(frozen=True)
class Allowance:
    """How far from its original float32 value a faithful conversion may move each element of a
    value: ``|value| * rel + floor``.

    Kept as these parts, not as an array the size of the value: the weight check applies it block
    by block (:func:`layertap.comparing.weight_check.within`), so no temporary the size of a weight is made.

    Attributes:
        rel: the part relative to each element's magnitude (half a float format's relative step).
        floor: the part that does not scale with it: one number, or an array that broadcasts to the
            value's shape (a quantiser's half step per channel, a recomputed bias's rounding).
        clamp: the magnitude the converter capped the stored values at (:func:`converter_clamp`): a value
            beyond it is held as that cap, which is no difference.

    Example:
        >>> a = Allowance(rel=0.5, floor=0.25) + Allowance(floor=0.25)
        >>> a.rel, a.floor, a.of(np.array([2.0, -4.0], np.float32)).tolist()
        (0.5, 0.5, [1.5, 2.5])
    """

    rel: float = 0.0
    floor: "np.ndarray | float" = 0.0
    clamp: float | None = None

    def __add__(self, other: "Allowance") -> "Allowance":
        """The allowance of two roundings of one value, one after the other."""
        floor = self.floor + other.floor if np.ndim(self.floor) or np.ndim(other.floor) else float(self.floor) + float(other.floor)
        clamps = [c for c in (self.clamp, other.clamp) if c is not None]
        return Allowance(self.rel + other.rel, floor, min(clamps) if clamps else None)

    def of(self, value: np.ndarray) -> np.ndarray:
        """The allowance of every element of ``value``, as one float32 array: ``|value| * rel + floor``."""
        return self.part(value, slice(None), value.shape)

    def part(self, value: np.ndarray, rows: slice, shape: tuple[int, ...]) -> np.ndarray:
        """:meth:`of` for the rows ``rows`` (first axis) of a value of ``shape``, given those rows' values."""
        if self.rel:
            out = np.abs(value).astype(np.float32, copy=False)
            out *= np.float32(self.rel)  # in place, as every step: one array the size of the rows
        else:
            out = np.zeros(value.shape, np.float32)
        if np.ndim(self.floor):
            out += np.broadcast_to(np.asarray(self.floor, np.float32), shape)[rows]
        elif self.floor:
            out += np.float32(self.floor)
        return out

    def reshaped(self, shape: tuple[int, ...], to: tuple[int, ...]) -> "Allowance":
        """The allowance of a value of ``shape`` reshaped to ``to`` (an array floor follows its elements)."""
        if not np.ndim(self.floor):
            return self
        return Allowance(self.rel, np.reshape(np.broadcast_to(self.floor, shape), to), self.clamp)


Reading = tuple[np.ndarray, Allowance]


@dataclass(frozen=True)
class FileParam:
    """One parameter of a file: its name, shape, stored format and how to read it.

    Attributes:
        name: the parameter's name (see the module doc).
        shape: its shape.
        fmt: how it is stored: ``float32``, ``float16``, ``bfloat16``, ``int8 QDQ`` ...
        folded: the op of the node a BatchNorm was folded into by the exporter (``Conv``), when the
            file says so (the value is then the Conv's weight or bias with the BatchNorm applied), else ``None``.
    """

    name: str
    shape: tuple[int, ...]
    fmt: str
    folded: str | None
    _read: Callable[[], Reading]

    def read(self) -> Reading:
        """``(value, allowance)``: the float32 value and how far (per element, or one number for all)
        a faithful conversion to this format may move it."""
        return self._read()


def format_allowance(fmt: str) -> Allowance:
    """How far rounding to the float type named ``fmt`` may move each element of a float32 value.

    Example:
        >>> round(float(format_allowance("float16").of(np.array([2048.0], np.float32))[0]), 6)  # half of float16's step 2 there
        1.0
        >>> format_allowance("int64")
        Allowance(rel=0.0, floor=0.0, clamp=None)
    """
    unit = _UNIT.get(fmt, 0.0)
    if not unit:
        return Allowance()
    return Allowance(unit, _FLOOR.get(fmt, 0.0))


def file_params(model: "onnx.ModelProto", folder: Path, held: Mapping[str, np.ndarray] | None = None, *,
                widen: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, FileParam]:
    """The parameters of ``model`` by name (see the module doc); its weights read where they are:
    ``held`` (arrays taken out of it, by name), inline, or in the data files in ``folder``.
    ``widen``: float16 values to float32 (default numpy's cast; a runtime's is faster on big weights).

    Example:
        >>> import onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.full((2, 2), 0.1, np.float16), "fc.weight")
        >>> g = h.make_graph([h.make_node("MatMul", ["x", "fc.weight"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 10, [1, 2])], [h.make_tensor_value_info("y", 10, [1, 2])], [w])
        >>> p = file_params(h.make_model(g), Path("."))["fc.weight"]
        >>> value, allowance = p.read()
        >>> p.fmt, value.dtype, float(allowance.of(value).max()) < 1e-4
        ('float16', dtype('float32'), True)
    """
    graph = model.graph
    held = held or {}
    inits = {t.name: t for t in graph.initializer}
    folded = _folded(graph)

    def array(name: str) -> np.ndarray:
        return initializer_array(inits[name], held, folder)

    @functools.cache
    def clamp() -> float | None:  # read once, on the first float16 parameter read
        return converter_clamp(model, folder, held)

    out: dict[str, FileParam] = {}
    quant_args = {t for n in graph.node if n.op_type in _QDQ_OPS for t in n.input[1:3]}
    for t in graph.initializer:
        dtype = _np_type(t.data_type)
        if dtype is None or t.name in quant_args or _ANONYMOUS.match(t.name):
            continue
        out[t.name] = FileParam(t.name, tuple(t.dims), np.dtype(dtype).name, folded.get(t.name),
                                functools.partial(_read_float, array, t.name, widen or _widen, clamp))
    for node in graph.node:
        param = _dequantized(node, inits, array, folded) or _cast(node, out, folded)
        if param is not None and not _ANONYMOUS.match(param.name):
            out.setdefault(param.name, param)
    return out


def _cast(node: "onnx.NodeProto", params: Mapping[str, FileParam], folded: Mapping[str, str]) -> FileParam | None:
    """A weight stored under another name (or type) and ``Cast`` to a float type under the parameter's name."""
    if node.op_type != "Cast" or not node.input or not node.output or node.input[0] not in params:
        return None
    to = next((a.i for a in node.attribute if a.name == "to"), 0)
    if _np_type(to) is None:
        return None
    stored = params[node.input[0]]
    target = np.dtype(_np_type(to)).name

    def read() -> Reading:
        value, allowance = stored.read()
        return value, allowance + format_allowance(target)  # a narrowing Cast rounds once more

    return FileParam(node.output[0], stored.shape, stored.fmt, folded.get(node.output[0]), read)


def _np_type(elem: int) -> Any:
    """numpy's type for a floating-point element type (bfloat16 through ml_dtypes), else ``None``."""
    import onnx

    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16):
        return None
    if elem == onnx.TensorProto.BFLOAT16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    return onnx.helper.tensor_dtype_to_np_dtype(elem)


def _read_float(array: Callable[[str], np.ndarray], name: str, widen: Callable[[np.ndarray], np.ndarray],
                clamp: Callable[[], float | None]) -> Reading:
    """A float initializer as float32, with its format's rounding (float16: and the converter's cap)."""
    a = array(name)
    value = a if a.dtype == np.float32 else widen(a) if a.dtype == np.float16 else a.astype(np.float32)
    allowance = format_allowance(a.dtype.name)
    if a.dtype == np.float16:
        allowance = Allowance(allowance.rel, allowance.floor, clamp())
    return value, allowance


def converter_clamp(model: "onnx.ModelProto", folder: Path, held: Mapping[str, np.ndarray] | None = None) -> float | None:
    """The cap a float16 converter put on the magnitude of every weight of ``model``: onnxconverter-common's
    default ``max_finite_val`` (:data:`~layertap.numformats.CONVERTER_MAX`) when the largest float16 weight
    (initializer or ``Constant``) is exactly that, else ``None`` (no cap, or one no weight reached).

    Example:
        >>> import onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.array([1e4, -3.0], np.float16), "bn.running_var")
        >>> g = h.make_graph([], "g", [], [], [w])
        >>> converter_clamp(h.make_model(g), Path(".")), converter_clamp(h.make_model(h.make_graph([], "g", [], [])), Path("."))
        (10000.0, None)
    """
    import onnx
    from onnx import numpy_helper

    top = 0.0
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT16:
            top = max(top, _largest(initializer_array(t, held or {}, folder)))
    for node in model.graph.node:
        tensor = constant_tensor(node)
        if tensor is not None and tensor.data_type == onnx.TensorProto.FLOAT16:
            top = max(top, _largest(numpy_helper.to_array(tensor)))
    return CONVERTER_MAX if top == CONVERTER_MAX else None


def _largest(a: np.ndarray) -> float:
    """The largest finite magnitude in float16 ``a`` (0 when none), read from its bits: a float16's magnitude
    orders as its 15 low bits do, and numpy's float16 arithmetic is ten times slower (resnet50's weights: 115
    against 11 ms); the patterns from 0x7C00 up are infinities and NaNs."""
    if a.size == 0:
        return 0.0
    bits = np.bitwise_and(np.ascontiguousarray(a).view(np.uint16), np.uint16(0x7FFF))
    top = int(bits.max())
    if top >= 0x7C00:
        finite = bits[bits < 0x7C00]
        top = int(finite.max()) if finite.size else 0
    return float(np.array(top, np.uint16).view(np.float16))


def _widen(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def _dequantized(node: "onnx.NodeProto", inits: Mapping[str, Any], array: Callable[[str], np.ndarray],
                 folded: Mapping[str, str]) -> FileParam | None:
    """A quantizer's weight or bias: ``DequantizeLinear`` of an integer initializer, under its float name."""
    if node.op_type != "DequantizeLinear" or len(node.input) < 2 or not node.output or node.input[0] not in inits:
        return None
    scale_name, zp_name = node.input[1], (node.input[2] if len(node.input) > 2 else "")
    if scale_name not in inits or (zp_name and zp_name not in inits):
        return None
    attrs = {a.name: a for a in node.attribute}
    if "block_size" in attrs and attrs["block_size"].i:
        return None  # blocked quantisation: not read here
    axis = attrs["axis"].i if "axis" in attrs else 1
    q = inits[node.input[0]]
    out = node.output[0]
    name = plain_weight_name(out)
    qtype = _q_type_name(q.data_type)

    def read() -> Reading:
        x = array(node.input[0])
        scale = array(scale_name).astype(np.float32)
        zp = array(zp_name).astype(np.float32) if zp_name else np.float32(0)
        if scale.size > 1:  # per channel: one scale (and zero point) along ``axis``
            shape = [1] * x.ndim
            shape[axis % x.ndim] = scale.size
            scale = scale.reshape(shape)
            zp = zp.reshape(shape) if np.ndim(zp) else zp
        else:
            scale, zp = scale.reshape(()), np.reshape(zp, ())
        value = (x.astype(np.float32) - zp) * scale
        return value, Allowance(floor=np.abs(scale) * np.float32(0.5))

    return FileParam(name, tuple(q.dims), f"{qtype} QDQ", folded.get(out), read)


def _q_type_name(elem: int) -> str:
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
    except (KeyError, TypeError, ValueError):
        return "integer"


def _folded(graph: "onnx.GraphProto") -> dict[str, str]:
    """Weight or bias -> op of the node it feeds that had a BatchNorm folded in (read through Cast and DequantizeLinear)."""
    through: dict[str, str] = {}  # a Cast / DequantizeLinear output -> its input
    for node in graph.node:
        if node.op_type in ("Cast", "DequantizeLinear") and node.input and node.output:
            through[node.output[0]] = node.input[0]
    out: dict[str, str] = {}
    for node in graph.node:
        if not BN_FOLD_RULES & set(rules(node)) or len(node.input) < 2:
            continue
        for t in node.input[1:3]:  # the weight and the bias: both hold the BatchNorm now
            while t and t not in out:
                # ONNX Runtime's FusedConv (a Conv and the activation after it) holds the Conv's weights as they were
                out[t] = "Conv" if node.op_type in ("FusedConv", "NhwcFusedConv") else node.op_type
                t = through.get(t, "")
    return out


def initializer_array(t: "onnx.TensorProto", held: Mapping[str, np.ndarray], folder: Path) -> np.ndarray:
    """One initializer's values: from the arrays taken out of the model, else inline, else its data file."""
    import onnx
    from onnx import numpy_helper

    if t.name in held:
        return held[t.name]
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(t)
    mapped = _mapped(t, folder)
    if mapped is not None:
        return mapped
    # onnx fills the tensor it loads external data into: load into a copy, so the graph stays weightless
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    return numpy_helper.to_array(copy, base_dir=str(folder))


def _mapped(t: "onnx.TensorProto", folder: Path) -> np.ndarray | None:
    """An external tensor's values mapped read-only from its data file (pages are read as the check
    reaches them, nothing is copied), or ``None`` for what :func:`numpy_helper.to_array` must read
    (packed or ml_dtypes types, a big-endian machine, a file shorter than the tensor: its error is onnx's)."""
    import onnx

    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
        ref = external_ref(t)
    except (KeyError, TypeError, ValueError, OnnxFileError):
        return None
    nbytes = tensor_nbytes(t)
    if dtype.kind not in "fiub" or not np.little_endian or not nbytes or ref.length not in (None, nbytes):
        return None
    path = folder / ref.location  # inside the folder: read_model refused any other place
    try:
        if path.stat().st_size < ref.offset + nbytes:
            return None
        return np.memmap(path, dtype=dtype, mode="r", offset=ref.offset, shape=tuple(t.dims)).view(np.ndarray)
    except (ValueError, OSError):
        return None
