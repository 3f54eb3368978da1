"""Faults injected into exported files (ONNX files, LiteRT programs) and into the toolchains that make them (a
torch.compile backend, litert-torch's conversion); the model itself stays as it was."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

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


def _node(model, output: str):
    return next(n for n in model.graph.node if output in n.output)


def replace_op(src, dst, output: str, op: str = "Identity") -> None:
    """Write ``dst``: ``src`` with the node making ``output`` turned into ``op`` (a wrong op: a ReLU made an
    Identity keeps its first input only)."""
    import onnx

    model = onnx.load(str(src))
    node = _node(model, output)
    node.op_type = op
    if op == "Identity":
        del node.input[1:]
        del node.attribute[:]
    onnx.save(model, str(dst))


def scale_weight(src, dst, output: str, factor: float) -> str:
    """Write ``dst``: ``src`` with the weight of the node making ``output`` multiplied by ``factor`` (read
    through a ``Cast`` or a ``DequantizeLinear``: a quantised weight's scale is multiplied); returns the
    initializer changed."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}
    w = _node(model, output).input[1]
    while w not in inits:  # through the Cast / DequantizeLinear that reads the stored weight
        reader = made[w]
        w = reader.input[1] if reader.op_type == "DequantizeLinear" else reader.input[0]
    t = inits[w]
    a = numpy_helper.to_array(t)
    t.CopyFrom(numpy_helper.from_array((a.astype(np.float32) * factor).astype(a.dtype), t.name))
    onnx.save(model, str(dst))
    return w


def shrink_scale(src, dst, tensor: str, factor: float = 0.1) -> None:
    """Write ``dst``: ``src`` with the ``QuantizeLinear -> DequantizeLinear`` pair reading ``tensor`` given a
    scale of its own, ``factor`` times the calibrated one (a range that clips)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    scale = numpy_helper.to_array(inits[q.input[1]])
    name = q.input[1] + "_shrunk"
    model.graph.initializer.append(numpy_helper.from_array((scale * factor).astype(scale.dtype), name))
    q.input[1] = name
    for dq in model.graph.node:
        if dq.op_type == "DequantizeLinear" and dq.input[0] == q.output[0]:
            dq.input[1] = name
    onnx.save(model, str(dst))


def faulty_backend(path: str, factor: float = 1.05):
    """A torch.compile backend that scales the output of the op made in module ``path`` (the first FX node whose
    innermost module is ``path``) and runs the graph as Python: a compiler that breaks one op."""
    import operator

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            stack = list(node.meta.get("nn_module_stack", {}).values())
            if node.op == "call_function" and stack and str(stack[-1][0]).endswith(path):
                with gm.graph.inserting_after(node):
                    bad = gm.graph.call_function(operator.mul, (node, factor))
                node.replace_all_uses_with(bad, delete_user_cb=lambda user, bad=bad: user is not bad)
                break
        gm.recompile()
        return gm  # a GraphModule: what torch's accuracy minifier runs a backend's result as

    return backend


@contextlib.contextmanager
def faulty_conversion(module: str, factor: float) -> Iterator[None]:
    """litert-torch converts the model with ``module``'s output scaled by ``factor`` (the eager model untouched), as a
    faulty toolchain would: for every LiteRT program layertap converts inside the block (``lt.export``, and
    ``compare``'s conversion with a tap at every module)."""
    import layertap.exporting.litert as exporting
    import layertap.pytorch.litert as conversion

    real = conversion.convert

    def broken(wrapper: Any, example: Any, names: Any, conv: Any, input_names: Any) -> Any:
        handle = wrapper.model.get_submodule(module).register_forward_hook(lambda m, i, o: o * factor)
        try:
            return real(wrapper, example, names, conv, input_names)
        finally:
            handle.remove()

    conversion.convert, exporting.convert = broken, broken
    try:
        yield
    finally:
        conversion.convert, exporting.convert = real, real


def edit_litert_constant(src, dst, where: str, change: Callable[[np.ndarray], np.ndarray]) -> str:
    """Write ``dst`` (with copies of the files layertap keeps beside ``src``: its record, calibration, recipe):
    the LiteRT program ``src`` with the largest constant tensor whose name holds ``where`` (litert-torch names a
    constant by the modules of the op reading it: ``Linear_fc``, ``Conv2d_conv2``) replaced by ``change`` of its
    stored values (int8 for a quantised weight), found in the file by its exact bytes; returns its name."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(src))  # not allocated: only constant tensors have data
    held = []
    for d in interpreter.get_tensor_details():
        if where in d["name"]:
            with contextlib.suppress(ValueError):
                held.append((d["name"], interpreter.get_tensor(d["index"])))
    name, old = max(held, key=lambda h: h[1].size)
    data = Path(src).read_bytes()
    at = data.find(old.tobytes())
    assert at > 0 and data.find(old.tobytes(), at + 1) == -1, f"{name}'s bytes are not in {src} once"
    new = np.asarray(change(old.copy())).astype(old.dtype)
    Path(dst).write_bytes(data[:at] + new.tobytes() + data[at + old.nbytes:])
    for side in Path(src).parent.glob(Path(src).name + ".*"):
        shutil.copy(side, Path(dst).parent / (Path(dst).name + side.name[len(Path(src).name):]))
    return name
