"""The one reader of the shapes an ONNX file declares (its inputs, outputs and value infos).

A fixed size reads as an int, a symbolic one as its name (``""`` when unnamed).
A negative size is symbolic too: paddle2onnx writes a dynamic size as
``dim_value: -1`` (``x: -1x3x?x?``), and ONNX Runtime and OpenVINO run any size
there, so every check and every generated input treats it as they treat ``?``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import onnx

Dims = tuple[int | str, ...]


def declared_dims(value: "onnx.ValueInfoProto") -> Dims | None:
    """A value's declared dims (``None`` when it declares no shape, or is not a tensor).

    Args:
        value: a graph input, output or value info.

    Returns:
        An int per fixed size, the symbol's name per symbolic size (``""`` when unnamed or
        negative).

    Example:
        >>> import onnx.helper as h
        >>> declared_dims(h.make_tensor_value_info("x", 1, [-1, 3, "h", None]))
        ('', 3, 'h', '')
        >>> declared_dims(h.make_tensor_value_info("y", 1, None)) is None
        True
    """
    if value.type.WhichOneof("value") != "tensor_type" or not value.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else d.dim_param
                 for d in value.type.tensor_type.shape.dim)


def static_dims(value: "onnx.ValueInfoProto") -> tuple[int, ...] | None:
    """A value's declared dims when every one is a fixed size (``None`` otherwise, or when it declares none).

    Example:
        >>> import onnx.helper as h
        >>> static_dims(h.make_tensor_value_info("x", 1, [2, 3])), static_dims(h.make_tensor_value_info("y", 1, ["n", 3]))
        ((2, 3), None)
    """
    dims = declared_dims(value)
    return tuple(int(d) for d in dims) if dims is not None and all(isinstance(d, int) for d in dims) else None


def input_dims(graph: "onnx.GraphProto") -> dict[str, Dims | None]:
    """The declared dims of the graph's real inputs (initializers listed as inputs left out), in order.

    Args:
        graph: the main graph of a model.

    Returns:
        Input name -> :func:`declared_dims`.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([], "g", [h.make_tensor_value_info("x", 1, [-1, 3, 48, 192])], [])
        >>> input_dims(g)
        {'x': ('', 3, 48, 192)}
    """
    inits = {i.name for i in graph.initializer}
    return {i.name: declared_dims(i) for i in graph.input if i.name not in inits}
