"""Property tests: random ONNX graphs through ``add_outputs``.

After exposing random intermediate tensors (and sometimes a graph input or an
initializer), the original outputs are bit-identical in ONNX Runtime and
every exposed tensor equals what ``onnx.reference.ReferenceEvaluator``
computes for it.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import layertap as lt

UNARY = ["Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Identity", "Exp"]
BINARY = ["Add", "Mul", "Sub", "Max"]


@st.composite
def graphs(draw):
    """A random DAG over [2, 3] float tensors; returns (model, intermediate names)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    names = ["X"]
    nodes = []
    inits = [numpy_helper.from_array(rng.standard_normal((3, 3)).astype(np.float32) * 0.5, "W")]
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "matmul"]))
        out = f"t{i}"
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            a = draw(st.sampled_from(names))
            if op == "Exp":
                tanh = f"t{i}_pre"
                nodes.append(helper.make_node("Tanh", [a], [tanh], name=f"n{i}_pre"))
                a = tanh
            nodes.append(helper.make_node(op, [a], [out], name=f"n{i}"))
        elif kind == "binary":
            op = draw(st.sampled_from(BINARY))
            nodes.append(helper.make_node(op, [draw(st.sampled_from(names)), draw(st.sampled_from(names))], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node("MatMul", [draw(st.sampled_from(names)), "W"], [out], name=f"n{i}"))
        names.append(out)
    n_out = draw(st.integers(1, 2))
    outs = list(dict.fromkeys(draw(st.lists(st.sampled_from(names[1:]), min_size=n_out, max_size=n_out))))
    graph = helper.make_graph(
        nodes,
        "random",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 3]) for o in outs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    every = [o for n in nodes for o in n.output]
    return model, every


def _ort(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"X": x})))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(g=graphs(), data=st.data())
def test_add_outputs_preserves_and_exposes(g, data, tmp_path):
    model, every = g
    src = tmp_path / "in.onnx"
    dst = tmp_path / "out.onnx"
    onnx.save(model, str(src))
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    pool = every + ["X", "W"]
    wanted = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
    added = lt.add_outputs(str(src), str(dst), tensors=wanted)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before

    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    original = _ort(src, x)
    edited = _ort(dst, x)
    out_names = [o.name for o in model.graph.output]
    # Original outputs come first, unchanged, and bit-identical.
    assert list(edited)[: len(out_names)] == out_names
    for name in out_names:
        assert np.array_equal(original[name], edited[name])

    ref = ReferenceEvaluator(model)
    values = dict(zip(every, ref.run(every, {"X": x})))
    values["X"] = x
    values["W"] = numpy_helper.to_array(model.graph.initializer[0])
    # A tensor that already is an output is not added twice.
    new = [t for t in wanted if t not in out_names]
    assert len(added) == len(new)
    for tensor in wanted:
        if tensor in out_names:
            np.testing.assert_allclose(edited[tensor], values[tensor], rtol=1e-5, atol=1e-6)
    for tensor, name in zip(new, added):
        assert name in edited, f"{name} not an output of the edited model"
        np.testing.assert_allclose(edited[name], values[tensor], rtol=1e-5, atol=1e-6)
    # Every edited output is typed (no untyped ValueInfo).
    for out in onnx.load(str(dst)).graph.output:
        assert out.type.tensor_type.elem_type == TensorProto.FLOAT
