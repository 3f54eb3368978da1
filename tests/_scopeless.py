"""ONNX files without PyTorch module scopes, as other tools write them (paddle2onnx, TensorFlow
converters): a torch export whose every node and tensor is renamed and whose metadata is dropped.

``strip_scopes(model)`` renames in place, the paddle2onnx way: tensors ``conv2d_3.tmp_0`` (op in
lower case, a counter per op, ``tmp_k`` per output), weights ``conv2d_3.w_0``, nodes ``p2o.Conv.3``;
graph inputs keep their names. No node name is a ``/a/b/Op`` scope and no ``metadata_props`` is left.
"""

from __future__ import annotations

import re
from typing import Any

_PADDLE_OPS = {"Conv": "conv2d", "Gemm": "linear", "MatMul": "matmul_v2", "BatchNormalization": "batch_norm",
               "Relu": "relu", "MaxPool": "pool2d", "Sigmoid": "sigmoid", "Reshape": "reshape2",
               "Transpose": "transpose2", "Pad": "pad3d", "Add": "elementwise_add", "Mul": "elementwise_mul"}


def strip_scopes(model: Any) -> Any:
    """Rename every node, tensor and weight of ``model`` (an ``onnx.ModelProto``) paddle-like and drop
    its metadata; returns the model."""
    graph = model.graph
    keep = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    new: dict[str, str] = {n: n for n in keep}
    counts: dict[str, int] = {}
    for node in graph.node:
        op = _PADDLE_OPS.get(node.op_type, re.sub(r"(?<!^)(?=[A-Z])", "_", node.op_type).lower())
        k = counts[op] = counts.get(op, -1) + 1
        node.name = f"p2o.{node.op_type}.{k}"
        for j, t in enumerate(node.output):
            if t:
                new[t] = f"{op}_{k}.tmp_{j}"
        w = 0
        for t in node.input:
            if t and t not in new:
                new[t] = f"{op}_{k}.w_{w}"
                w += 1
        del node.metadata_props[:]
        node.doc_string = ""
    for node in graph.node:
        node.input[:] = [new.get(t, t) for t in node.input]
        node.output[:] = [new.get(t, t) for t in node.output]
    for coll in (graph.input, graph.output, graph.value_info, graph.initializer):
        for v in coll:
            v.name = new.get(v.name, v.name)
    del model.metadata_props[:]
    del graph.metadata_props[:]
    model.producer_name, model.producer_version = "PaddlePaddle", "2.6"
    return model


def export_scopeless(model: Any, sample: Any, path: Any) -> Any:
    """``model`` (an ``nn.Module``) exported by the TorchScript exporter on ``sample`` (one tensor, batch
    axis dynamic), then :func:`strip_scopes`, saved at ``path``; returns ``path``."""
    import onnx
    import torch

    torch.onnx.export(model, (sample,), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    onnx.save(strip_scopes(onnx.load(str(path))), str(path))
    return path
