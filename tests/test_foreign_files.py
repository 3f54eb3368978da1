"""Files other tools wrote: sizes declared as ``dim_value: -1`` (paddle2onnx), and two exports of one
model by different tools (spox, torch.onnx) that share no tensor names. Every file is built here:
the -1 file with onnx.helper as paddle2onnx lays it out, the spox file with spox, the other with
torch.onnx, the float16 ones with onnxconverter-common."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import layertap as lt


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from layertap.cli.main import main

    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _fp16(src, dst):
    from onnxconverter_common import float16

    onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))
    return dst


# -- sizes declared as -1 ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minus_one(tmp_path_factory):
    """A paddle2onnx-style file: ``x: -1x3x?x?``, ``-1`` batch on the output and the value infos,
    weights as Constant nodes, names ``conv2d_0.tmp_0``."""
    rng = np.random.default_rng(0)
    const = lambda name, a: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a.astype(np.float32), name))  # noqa: E731
    nodes = [
        const("conv2d_0.w_0", rng.normal(size=(8, 3, 3, 3)) * 0.3), const("conv2d_0.b_0", rng.normal(size=8)),
        helper.make_node("Conv", ["x", "conv2d_0.w_0", "conv2d_0.b_0"], ["conv2d_0.tmp_0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv2d_0.tmp_0"], ["relu_0.tmp_0"]),
        helper.make_node("GlobalAveragePool", ["relu_0.tmp_0"], ["pool2d_0.tmp_0"]),
        helper.make_node("Flatten", ["pool2d_0.tmp_0"], ["flatten_0.tmp_0"], axis=1),
        const("linear_0.w_0", rng.normal(size=(8, 4))), const("linear_0.b_0", rng.normal(size=4)),
        helper.make_node("MatMul", ["flatten_0.tmp_0", "linear_0.w_0"], ["linear_0.tmp_0"]),
        helper.make_node("Add", ["linear_0.tmp_0", "linear_0.b_0"], ["linear_0.tmp_1"]),
    ]
    vi = lambda n, dims: helper.make_tensor_value_info(n, TensorProto.FLOAT, dims)  # noqa: E731
    graph = helper.make_graph(nodes, "p2o", [vi("x", [-1, 3, None, None])], [vi("linear_0.tmp_1", [-1, 4])],
                              value_info=[vi("conv2d_0.tmp_0", [-1, 8, -1, -1]), vi("flatten_0.tmp_0", [-1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="PaddlePaddle")
    onnx.checker.check_model(model)
    d = tmp_path_factory.mktemp("minus_one")
    onnx.save(model, str(d / "p2o.onnx"))
    return d / "p2o.onnx", _fp16(d / "p2o.onnx", d / "p2o_fp16.onnx")


def test_a_negative_size_reads_as_symbolic(minus_one):
    from layertap.onnxfile.shapes import input_dims

    path, _ = minus_one
    assert input_dims(onnx.load(str(path)).graph) == {"x": ("", 3, "", "")}
    layers = lt.onnx_layers(path)
    assert [r.shape for r in layers.rows if r.name == "x"] == [["?", 3, "?", "?"]]


def test_run_feeds_any_size_where_minus_one_is_declared(minus_one, capsys):
    path, _ = minus_one
    out = lt.run(path, {"x": np.ones((1, 3, 48, 192), np.float32)}, taps=["conv2d_0.tmp_0"])
    assert out["conv2d_0.tmp_0"].shape == (1, 8, 48, 192) and out["output"].shape == (1, 4)
    notes: list[str] = []
    out = lt.run(path, notify=notes.append)  # generated as for a symbolic size: batch 1, an image 224x224
    assert out["output"].shape == (1, 4) and "x=1x3x224x224 float32" in " ".join(notes)
    rc, stdout, err = _cli(capsys, "run", str(path), "--input", "x=2x3x48x192")
    assert rc == 0, err
    assert "2x4" in stdout


def test_compare_and_fix_take_inputs_where_minus_one_is_declared(minus_one, capsys, tmp_path):
    path, fp16 = minus_one
    report = lt.compare(path, {"x": np.ones((1, 3, 48, 192), np.float32)}, fp16)
    assert report.ok and all(r.status == "pass" for r in report.rows)
    assert lt.compare(path, None, fp16, samples=2).ok  # random samples sized as for symbolic sizes
    rc, stdout, err = _cli(capsys, "compare", str(path), str(fp16), "--input", "x=1x3x48x192", "--json")
    assert rc == 0 and "expects" not in err, err
    assert json.loads(stdout)["ok"] is True
    fixed = tmp_path / "fixed.onnx"
    rc, _, err = _cli(capsys, "fix", str(path), "--to", "fp16", "-o", str(fixed), "--input", "x=1x3x48x192")
    assert rc == 0 and fixed.is_file(), err
    report = lt.fix(path, {"x": np.ones((1, 3, 48, 192), np.float32)}, to="fp16", out=tmp_path / "f2.onnx")
    assert report.ok
