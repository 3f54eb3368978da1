"""A tiny ONNX file to try the ONNX-side functions on (the docstring examples use it).

Two nodes named the way the TorchScript exporter names them, so the module
scopes ``act`` and ``neg`` resolve: ``y = -relu(x)`` for ``x`` of shape 1x4.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_tiny_model(folder: str | os.PathLike, name: str = "m.onnx") -> Path:
    """Write the tiny model into ``folder``; return its path.

    Example:
        >>> import tempfile
        >>> write_tiny_model(tempfile.mkdtemp()).name
        'm.onnx'
    """
    import onnx
    import onnx.helper as h

    def vi(n: str) -> onnx.ValueInfoProto:
        return h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 4])

    nodes = [
        h.make_node("Relu", ["x"], ["/act/Relu_output_0"], name="/act/Relu"),
        h.make_node("Neg", ["/act/Relu_output_0"], ["y"], name="/neg/Neg"),
    ]
    model = h.make_model(h.make_graph(nodes, "tiny", [vi("x")], [vi("y")]), opset_imports=[h.make_opsetid("", 17)])
    path = Path(folder) / name
    onnx.save(model, str(path))
    return path
