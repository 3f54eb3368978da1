"""Tensor types and sizes: ONNX shape inference, the type text engines name inputs by, and a
fallback typer for the tensors shape inference leaves open.

Files with ops ONNX does not know (``com.microsoft`` fusions, a converter's custom domain) leave
tensors untyped after shape inference; a runtime can type them (ONNX Runtime infers the types
of untyped graph outputs when it builds a session). Nothing here runs a model: the fallback is
a :data:`TensorTyper` the caller hands in (:func:`layertap.runtimes.ort.ort_typer`). Never
imports torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx

# the type text of an engine's inputs (ONNX Runtime's ``tensor(float)``; the runtime protocol's
# InputInfo.type) -> numpy dtypes
ORT_NUMPY: dict[str, Any] = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}

# the element type inside that text (``float`` of ``tensor(float)``) -> ONNX TensorProto element types
ORT_ELEM = {
    "float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "string": 8,
    "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13, "bfloat16": 16,
}

#: types tensors of a model (in memory; its external data in the folder): ``(model, folder, names)``
#: -> typed value infos by name, leaving out what it cannot type
TensorTyper = Callable[["onnx.ModelProto", Path, Sequence[str]], "dict[str, onnx.ValueInfoProto]"]


def tensor_types(
    model: "onnx.ModelProto", folder: Path, tensors: Sequence[str] | None = None, *, typer: TensorTyper | None = None
) -> dict[str, "onnx.ValueInfoProto"]:
    """Typed value infos: ONNX shape inference first, ``typer`` for what it leaves untyped.

    ``tensors``: the names that must be typed (default: every node output). Tensors neither can
    type are left out; so are those shape inference leaves open when no ``typer`` is given.

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
    if missing and typer is not None:
        known.update(typer(model, folder, missing))
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
    except Exception:  # noqa: BLE001 - shape inference fails on some valid files; a typer types the rest
        inferred = model
    return declared_types(inferred.graph)


def declared_types(g: "onnx.GraphProto") -> dict[str, "onnx.ValueInfoProto"]:
    """Typed value infos by tensor name as the graph declares them (value infos, inputs, outputs), plus its
    initializers: what :func:`inferred_types` reads once inference has added its own.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 0, None)])
        >>> sorted(declared_types(g))
        ['x']
    """
    import onnx

    out: dict[str, onnx.ValueInfoProto] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if is_typed(vi):
            out[vi.name] = vi
    for init in g.initializer:
        if init.name not in out:
            out[init.name] = onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
    return out


def is_typed(vi: Any) -> bool:
    """True when ``vi`` has a type (a tensor: with its element type).

    Example:
        >>> import onnx.helper as h
        >>> is_typed(h.make_tensor_value_info("x", 1, [2])), is_typed(h.make_empty_tensor_value_info("y"))
        (True, False)
    """
    which = vi.type.WhichOneof("value")
    if which != "tensor_type":
        return which is not None
    return vi.type.tensor_type.elem_type != 0


def tensor_nbytes(t: "onnx.TensorProto") -> int:
    """The size of a tensor's values from its shape and type (``ByteSize`` walks the whole proto: 7 ms
    for resnet50's inline weights); a type of unknown size counts a byte per element.

    Example:
        >>> import onnx.helper as h
        >>> tensor_nbytes(h.make_tensor("w", 10, [4, 8], [0.0] * 32))  # float16
        64
    """
    import onnx

    try:
        size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        size = 1
    return math.prod(t.dims) * size


def constant_tensor(node: "onnx.NodeProto") -> "onnx.TensorProto | None":
    """The tensor a ``Constant`` node makes from its ``value`` attribute (the message itself: an edit of it
    edits the node), else ``None`` (another op, or a constant given another way).

    Example:
        >>> import onnx.helper as h
        >>> constant_tensor(h.make_node("Constant", [], ["c"], value=h.make_tensor("c", 1, [1], [2.0]))).float_data
        [2.0]
        >>> constant_tensor(h.make_node("Relu", ["x"], ["y"])) is None
        True
    """
    if node.op_type != "Constant":
        return None
    return next((a.t for a in node.attribute if a.name == "value"), None)


def element_type(value: np.ndarray) -> int:
    """The ONNX element type of a numpy array (``TensorProto.FLOAT`` for float32).

    Example:
        >>> element_type(np.zeros(2, np.float32)), element_type(np.zeros(2, np.int64))
        (1, 7)
    """
    import onnx

    return int(onnx.helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype))
