"""The number format each tensor of a file is held in (:class:`~layertap.numformats.Format`).

A comparison judged at the candidate's precision (``lt.compare(..., precision="auto")``)
needs to know, per tensor, how the candidate holds the value:

* ``float16`` / ``bfloat16``: the file's own element type (a converter's output, an input a
  ``Cast`` narrows, an initializer stored that way), or the runtime's inference precision
  (OpenVINO at bf16 holds every float tensor so);
* a quantised integer (``int8``, ``uint8``, ...): a ``QuantizeLinear -> DequantizeLinear`` pair
  reads the tensor, with its scale and zero point (per tensor or along an axis); the
  ``DequantizeLinear`` output stands for it;
* ``float32`` otherwise (a node a converter kept, the model's inputs and outputs kept in float32).

:func:`file_formats` reads a whole file into :class:`TensorFormats`. Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ..errors import LayertapError
from ..numformats import FLOAT_LIMITS, PRECISIONS, Format
from .scopemap import plain_weight_name
from .tensor_types import constant_tensor, inferred_types
from .walk import all_tensors, model_graphs, model_nodes
from .weights import converter_clamp, initializer_array

if TYPE_CHECKING:  # pragma: no cover
    import onnx


@dataclass
class TensorFormats:
    """The formats of one file's tensors (see the module doc).

    Attributes:
        tensors: tensor name -> its format, for every tensor held below float32 (a quantised
            tensor under its own name and under its ``DequantizeLinear`` output's).
        weights: parameter name (as :mod:`.weights` names it) -> the format it is stored in
            (``weight_levels``: a quantised weight's integer range used per channel).
        default: the format of every other float tensor (the runtime's inference precision), or ``None``.
        weight_levels: quantised parameter name -> per channel ``max|q - zero_point|`` of its stored integers.
        forced: the user named the precision (``precision="fp16"``): the file's own types are not read.
        dequantized: the ``DequantizeLinear`` outputs among :attr:`tensors` (values held quantised as
            such; a quantised tensor's own name holds its float value, which its readers see quantised).
        weight_clamp: the magnitude the float16 converter capped every weight at
            (:func:`~layertap.onnxfile.weights.converter_clamp`), else ``None``; the formats in
            :attr:`weights` carry it too.

    Example:
        >>> f = TensorFormats({"y": Format("float16")})
        >>> f.of("y").name, f.of("x"), f.precision
        ('float16', None, 'float16')
    """

    tensors: dict[str, Format] = field(default_factory=dict)
    weights: dict[str, Format] = field(default_factory=dict)
    default: Format | None = None
    weight_levels: dict[str, np.ndarray] = field(default_factory=dict)
    forced: bool = False
    dequantized: frozenset[str] = frozenset()
    weight_clamp: float | None = None

    def of(self, name: str) -> Format | None:
        """The format tensor ``name`` is held in; ``None``: float32."""
        return self.tensors.get(name, self.default)

    @property
    def low(self) -> bool:
        """Some tensor is held below float32."""
        return bool(self.tensors) or self.default is not None

    @property
    def precision(self) -> str:
        """The format a comparison is judged at: the lowest one present (``int8`` < ``bfloat16`` <
        ``float16`` < ``float32``)."""
        families = {f.family for f in self.tensors.values()}
        if self.default is not None:
            families.add(self.default.family)
        for name in ("int8", "bfloat16", "float16"):
            if name in families:
                return name
        return "float32"

    def share_low(self, names: list[str]) -> float:
        """The share of ``names`` held below float32."""
        return sum(1 for n in names if self.of(n) is not None) / len(names) if names else 0.0


def _names_a_type(model: "onnx.ModelProto", types: set[int]) -> bool:
    """Whether anything in ``model`` could make a tensor of one of ``types``: a declared graph input, output or
    value, a stored tensor (initializer, ``Constant``, an attribute's tensor), or an ``int``/``ints`` attribute a
    node reads a type from (``Cast``'s ``to``, ``dtype``...). Where nothing does, no tensor of that type can
    exist, and a float32 file skips shape inference.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> _names_a_type(h.make_model(g), {10}), _names_a_type(h.make_model(g), {1})
        (False, True)
    """
    for g in model_graphs(model):
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.tensor_type.elem_type in types:
                return True
    if any(t.data_type in types for t in all_tensors(model)):
        return True
    for node in model_nodes(model):
        for a in node.attribute:
            if a.name in _TYPE_ATTRIBUTES and (a.i in types or any(i in types for i in a.ints)):
                return True
    return False


#: attributes that name an element type a node makes (Cast's ``to``; ``dtype`` of the random and constant ops...)
_TYPE_ATTRIBUTES = {"to", "dtype", "output_dtype"}


def file_formats(model: "onnx.ModelProto", folder: Path, held: Mapping[str, np.ndarray] | None = None, *,
                 runtime_precision: str | None = None, precision: str = "auto") -> TensorFormats:
    """The formats of the tensors of ``model`` (its weights read where they are: ``held``, the arrays
    taken out of it by name, inline, or in the data files in ``folder``).

    Args:
        model, folder, held: the candidate file in memory.
        runtime_precision: the precision its runtime computes float tensors at (``"bfloat16"``, ``"float16"``,
            from :class:`~layertap.runtimes.RuntimeInfo`), or ``None``/``"float32"``.
        precision: ``auto`` (read the file and the runtime), or the user's ``fp32``/``fp16``/``bf16``/``int8``.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Cast", ["x"], ["x16"], to=10), h.make_node("Relu", ["x16"], ["y16"]),
        ...                   h.make_node("Cast", ["y16"], ["y"], to=1)], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> f = file_formats(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."))
        >>> sorted(f.tensors), f.precision
        (['x', 'x16', 'y16'], 'float16')
    """
    if precision not in ("auto", *PRECISIONS):
        raise LayertapError(f"unknown precision {precision!r}; use auto or one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return TensorFormats(forced=True)
    if precision in ("fp16", "bf16"):
        return TensorFormats(default=Format(PRECISIONS[precision]), forced=True)
    reader = _Reader(model, folder, held or {})
    quantised, weights, levels, dequantized = reader.quantised()
    if precision == "int8":
        if not quantised:
            raise LayertapError("precision int8 judges at a quantiser's scales, and the candidate holds no "
                                "QuantizeLinear -> DequantizeLinear pair; give --precision fp16/bf16, or auto")
        return TensorFormats(quantised, weights, None, levels, forced=True, dequantized=dequantized)
    tensors = {**reader.floats(), **quantised}
    floats = reader.float_weights()
    clamp = converter_clamp(model, folder, held) if floats else None
    weights = {**{n: Format(f.name, clamp=clamp) for n, f in floats.items()}, **weights}
    default = Format(runtime_precision) if runtime_precision in FLOAT_LIMITS else None
    return TensorFormats(tensors, weights, default, levels, dequantized=dequantized, weight_clamp=clamp)


class _Reader:
    """One file's graph and held weights, read for their formats."""

    def __init__(self, model: "onnx.ModelProto", folder: Path, held: Mapping[str, np.ndarray]) -> None:
        self.model = model
        self.graph = model.graph
        self.held = held
        self.folder = folder
        self.inits = {t.name: t for t in self.graph.initializer}
        self.consts = {n.output[0]: n for n in self.graph.node if n.op_type == "Constant" and n.output}
        self._array = initializer_array

    def value(self, name: str) -> np.ndarray | None:
        """A small constant's value (scale, zero point), from an initializer or a ``Constant`` node."""
        from onnx import numpy_helper

        if name in self.inits:
            return np.asarray(self._array(self.inits[name], self.held, self.folder))
        tensor = constant_tensor(self.consts[name]) if name in self.consts else None
        return numpy_helper.to_array(tensor) if tensor is not None else None

    def floats(self) -> dict[str, Format]:
        """Tensors of a reduced float type, and float32 tensors a ``Cast`` narrows to one."""
        import onnx

        low: dict[int, str] = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
        out: dict[str, Format] = {}
        if not _names_a_type(self.model, set(low)):  # no tensor can hold one: shape inference would find none
            return out
        formats = {name: Format(name) for name in low.values()}
        for name, vi in inferred_types(self.model).items():
            tt = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
            if tt is not None and tt.elem_type in low:
                out[name] = formats[low[tt.elem_type]]
        for node in self.graph.node:
            if node.op_type == "Cast" and node.input and node.input[0] not in out:
                to = next((a.i for a in node.attribute if a.name == "to"), 0)
                if to in low:
                    out[node.input[0]] = formats[low[to]]
        return out

    def float_weights(self) -> dict[str, Format]:
        """Initializers and ``Constant`` outputs stored in a reduced float type, by name."""
        import onnx

        low: dict[int, str] = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
        out = {t.name: Format(low[t.data_type]) for t in self.graph.initializer if t.data_type in low}
        for name, node in self.consts.items():
            tensor = constant_tensor(node)
            if tensor is not None and tensor.data_type in low:
                out.setdefault(name, Format(low[tensor.data_type]))
        return out

    def quantised(self) -> tuple[dict[str, Format], dict[str, Format], dict[str, np.ndarray], frozenset[str]]:
        """Activations a ``QuantizeLinear -> DequantizeLinear`` pair reads (by their name and the
        ``DequantizeLinear`` output's), quantised weights by parameter name with their levels, and the
        ``DequantizeLinear`` outputs."""
        readers: dict[str, list[Any]] = {}
        for node in self.graph.node:
            for t in node.input:
                readers.setdefault(t, []).append(node)
        tensors: dict[str, Format] = {}
        dequantized: set[str] = set()
        for node in self.graph.node:
            if node.op_type != "QuantizeLinear" or len(node.input) < 2 or not node.output:
                continue
            fmt = self._format(node, self._qtype(node))
            if fmt is None:
                continue
            tensors[node.input[0]] = fmt
            for dq in readers.get(node.output[0], ()):
                if dq.op_type == "DequantizeLinear" and dq.output:
                    tensors[dq.output[0]] = fmt
                    dequantized.add(dq.output[0])
        weights, levels = self._weights()
        return tensors, weights, levels, frozenset(dequantized)

    def _qtype(self, node: "onnx.NodeProto") -> str:
        """The integer type a ``QuantizeLinear`` writes: its zero point's, its ``output_dtype``, else uint8."""
        import onnx

        zp = node.input[2] if len(node.input) > 2 else ""
        elem = self.inits[zp].data_type if zp in self.inits else 0
        if not elem and zp in self.consts:
            tensor = constant_tensor(self.consts[zp])
            elem = tensor.data_type if tensor is not None else 0
        if not elem:
            elem = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name if elem else "uint8"
        except (KeyError, TypeError, ValueError):
            return "uint8"

    def _format(self, node: "onnx.NodeProto", qtype: str) -> Format | None:
        attrs = {a.name: a for a in node.attribute}
        if "block_size" in attrs and attrs["block_size"].i:
            return None  # blocked quantisation: not modelled
        try:
            info = np.iinfo(np.dtype(qtype))
        except ValueError:
            return None
        scale = self.value(node.input[1])
        zp = self.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None or info.bits > 16:
            return None
        axis = attrs["axis"].i if "axis" in attrs else 1
        return Format.quantised(qtype, scale, zp, axis)

    def _weights(self) -> tuple[dict[str, Format], dict[str, np.ndarray]]:
        """``DequantizeLinear`` of an integer initializer: the weight's format and its levels per channel."""
        weights: dict[str, Format] = {}
        levels: dict[str, np.ndarray] = {}
        for node in self.graph.node:
            if node.op_type != "DequantizeLinear" or len(node.input) < 2 or not node.output or node.input[0] not in self.inits:
                continue
            q = self.value(node.input[0])
            scale = self.value(node.input[1])
            zp = self.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            if q is None or scale is None or not np.issubdtype(q.dtype, np.integer) or q.dtype.itemsize > 2:
                continue
            attrs = {a.name: a for a in node.attribute}
            if "block_size" in attrs and attrs["block_size"].i:
                continue
            axis = attrs["axis"].i if "axis" in attrs else 1
            fmt = Format.quantised(q.dtype.name, scale, zp, axis)
            name = plain_weight_name(node.output[0])
            weights[name] = fmt
            levels[name] = _levels(q, fmt)
        return weights, levels


def _levels(q: np.ndarray, fmt: Format) -> np.ndarray:
    """Per channel (along the format's axis, else one number) the largest ``|q - zero_point|`` stored."""
    centred = np.abs(q.astype(np.float32) - fmt._along(q, np.asarray(fmt.zero_point)))
    if fmt.axis is None or q.ndim == 0:
        return np.asarray(max(float(centred.max()) if centred.size else 1.0, 1.0), np.float32)
    axis = fmt.axis % q.ndim
    others = tuple(i for i in range(q.ndim) if i != axis)
    return np.maximum(centred.max(axis=others) if others else centred, 1.0).astype(np.float32)
