"""Faults injected into exported ONNX files (the model itself stays as exported)."""

from __future__ import annotations

import numpy as np


def scale_module_output(src, dst, module: str, scale: np.ndarray) -> str:
    """Write ``dst``: ``src`` with ``module``'s output tensor multiplied by ``scale`` (last axis)
    by a Mul in that module's scope; returns the tensor's name."""
    import onnx
    from onnx import helper, numpy_helper

    from layertap.onnxfile.metadata import NAME_SCOPES_KEY
    from layertap.onnxfile.scopemap import ScopeMap

    model = onnx.load(str(src))
    cp = next(c for c in ScopeMap.from_model(model).counterparts() if c.path == module)
    tensor = (cp.tensors or cp.unverified)[0]
    nodes = model.graph.node
    k = next(i for i, n in enumerate(nodes) if tensor in n.output)
    producer = nodes[k]
    producer.output[list(producer.output).index(tensor)] = tensor + "_before_fault"
    const = helper.make_node("Constant", [], [tensor + "_fault"],
                             value=numpy_helper.from_array(scale.astype(np.float32), tensor + "_fault_value"))
    scope = "/" + "/".join(producer.name.split("/")[1:-1]) if producer.name.startswith("/") else None
    mul = helper.make_node("Mul", [tensor + "_before_fault", tensor + "_fault"], [tensor],
                           name=f"{scope}/Mul_9999" if scope else producer.name + "_fault")
    for p in producer.metadata_props:
        if p.key == NAME_SCOPES_KEY:
            mul.metadata_props.add(key=p.key, value=p.value)
    nodes.insert(k + 1, mul)
    nodes.insert(k + 1, const)
    onnx.save(model, str(dst))
    return tensor
