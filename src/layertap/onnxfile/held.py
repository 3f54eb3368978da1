"""Weights held in memory beside a graph: an initializer that refers to an array held by name.

A runtime opens a model many times (compare exposes other tensors per batch, ``--local`` runs
parts of it). Serialising its inline weights with the graph for each session would cost their
size each time, so a model's big inline weights are taken out once into numpy arrays and each
initializer left behind refers to its array (external-data location :data:`IN_MEMORY`); a runtime
hands the arrays over as they are (:mod:`layertap.runtimes.source`). These are plain edits of
protos, run nothing, and say in their names and docstrings what they change:
:func:`without_big_weights` returns a new model and leaves its argument as it was,
:func:`hold_in_memory` edits the one tensor it is given. Never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .shape_inputs import shape_read_tensors
from .tensor_types import tensor_nbytes

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: external-data location of weights that live in memory (handed to a runtime beside the graph)
IN_MEMORY = "*/layertap-in-memory/*"
# the fields that hold an initializer's values (left behind when it is held in memory)
_VALUE_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def is_held(t: Any) -> bool:
    """Whether initializer ``t`` refers to an array held in memory (location :data:`IN_MEMORY`).

    Example:
        >>> import onnx.helper as h
        >>> t = h.make_tensor("w", 1, [2], [1.0, 2.0])
        >>> is_held(t), (hold_in_memory(t, np.ones(2, np.float32)), is_held(t))[1]
        (False, True)
    """
    return any(kv.key == "location" and kv.value == IN_MEMORY for kv in t.external_data)


def hold_in_memory(t: "onnx.TensorProto", array: np.ndarray) -> None:
    """Edit initializer ``t`` in place into a reference to ``array``, held by whoever holds the
    model's arrays under ``t``'s name (its inline values and any data file reference dropped).

    Example:
        >>> import onnx.helper as h
        >>> t = h.make_tensor("w", 1, [2], [1.0, 2.0])
        >>> hold_in_memory(t, np.ones(2, np.float32))
        >>> list(t.float_data), t.external_data[0].value
        ([], '*/layertap-in-memory/*')
    """
    import onnx

    for field in _VALUE_FIELDS:
        t.ClearField(field)
    del t.external_data[:]
    t.data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", IN_MEMORY), ("offset", "0"), ("length", str(array.nbytes))):
        t.external_data.add(key=key, value=value)


def without_big_weights(model: "onnx.ModelProto", threshold: int = 1024) -> tuple["onnx.ModelProto", dict[str, np.ndarray]]:
    """A new model with the main graph's inline weights of ``threshold`` bytes or more taken out into
    arrays (by name), each initializer left as a reference to its array; ``model`` is left as it was.

    The weights' values are copied once, into the arrays; the new proto holds only the graph (drop
    ``model`` to free the memory of its weights). Weights a runtime cannot take as arrays (strings,
    bfloat16, float8) stay inline, and so do those whose data shape inference reads
    (:mod:`.shape_inputs`): ONNX Runtime refuses to load a model whose ``Reshape`` shape it cannot see.

    Example:
        >>> import onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
        >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
        >>> model = h.make_model(g)
        >>> small, held = without_big_weights(model)
        >>> is_held(small.graph.initializer[0]), held["w"].shape, model.graph.initializer[0].HasField("raw_data")
        (True, (512, 512), True)
    """
    import onnx

    held: dict[str, np.ndarray] = {}
    out = onnx.ModelProto()
    _copy_fields(model, out, skip={"graph"})
    _copy_fields(model.graph, out.graph, skip={"initializer"})
    shaping = shape_read_tensors(model)
    for t in model.graph.initializer:
        arr = None if t.name in shaping else _movable(t, threshold)
        if arr is None:
            out.graph.initializer.append(t)
            continue
        ref = out.graph.initializer.add()
        _copy_fields(t, ref, skip={*_VALUE_FIELDS, "external_data"})  # the values go to the array alone
        hold_in_memory(ref, arr)
        held[t.name] = arr
    return out, held


def _movable(t: "onnx.TensorProto", threshold: int) -> np.ndarray | None:
    """``t``'s values as a contiguous array when it is inline, big enough and of a type a runtime takes."""
    import onnx
    from onnx import numpy_helper

    if t.data_location == onnx.TensorProto.EXTERNAL or tensor_nbytes(t) < threshold:
        return None
    arr = np.ascontiguousarray(numpy_helper.to_array(t))
    if arr.dtype == object or arr.dtype.kind == "V":  # strings, ml_dtypes' bfloat16/float8: ORT cannot take them
        return None
    return arr


def _copy_fields(src: Any, dst: Any, skip: set[str]) -> None:
    """Copy every set field of proto ``src`` into ``dst`` but those named in ``skip`` (not read at all:
    ``ListFields`` would hand out an initializer's ``raw_data`` as a new bytes object, a copy of its
    values made only to be thrown away; measured 18 ms of resnet50's float16 file)."""
    for fd in src.DESCRIPTOR.fields:
        if fd.name in skip:
            continue
        if fd.is_repeated:
            value = getattr(src, fd.name)
            if len(value):
                getattr(dst, fd.name).extend(value)
        elif src.HasField(fd.name):
            if fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))
