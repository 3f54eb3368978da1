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


# -- one model, two tools ---------------------------------------------------------------------------
def _build(torch_mod, d, scale: float):
    """The same small CNN (same weights) exported by torch.onnx and built with spox, where the
    BatchNorm is a Mul and an Add (torch.onnx folds it into the Conv); ``scale`` multiplies conv2's
    weights (1e4 takes its output beyond float16's range)."""
    import spox.opset.ai.onnx.v17 as op
    from spox import Tensor, argument, build

    nn = torch_mod.nn
    torch_mod.manual_seed(0)
    net = nn.Sequential()
    net.conv1, net.bn1, net.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
    net.conv2, net.relu2 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
    net.pool, net.flat, net.fc = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
    with torch_mod.no_grad():
        net.bn1.running_mean.uniform_(-1, 1)
        net.bn1.running_var.uniform_(0.5, 2)
        net.conv2.weight.mul_(scale)
    net.eval()
    torch_mod.onnx.export(net, (torch_mod.randn(1, 3, 16, 16),), str(d / "torch.onnx"), dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    w = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    scale_bn = w["bn1.weight"] / np.sqrt(w["bn1.running_var"] + net.bn1.eps)
    shift_bn = w["bn1.bias"] - w["bn1.running_mean"] * scale_bn
    x = argument(Tensor(np.float32, ("N", 3, "H", "W")))
    h = op.conv(x, op.const(w["conv1.weight"]), op.const(w["conv1.bias"]), pads=[1, 1, 1, 1])
    h = op.relu(op.add(op.mul(h, op.const(scale_bn.reshape(1, 8, 1, 1))), op.const(shift_bn.reshape(1, 8, 1, 1))))
    h = op.relu(op.conv(h, op.const(w["conv2.weight"]), op.const(w["conv2.bias"]), pads=[1, 1, 1, 1]))
    h = op.flatten(op.global_average_pool(h), axis=1)
    y = op.gemm(h, op.const(w["fc.weight"]), op.const(w["fc.bias"]), transB=1)
    onnx.save(build(inputs={"x": x}, outputs={"out": y}), str(d / "spox.onnx"))
    return d / "spox.onnx", d / "torch.onnx", _fp16(d / "torch.onnx", d / "torch_fp16.onnx")


@pytest.fixture(scope="module")
def two_tools(torch_mod, tmp_path_factory):
    return _build(torch_mod, tmp_path_factory.mktemp("two_tools"), 1.0)


@pytest.fixture(scope="module")
def sample():
    return {"x": np.random.default_rng(3).normal(size=(2, 3, 16, 16)).astype(np.float32)}


def test_spox_and_torch_files_pair_by_structure_and_value(two_tools, sample):
    spox_file, torch_file, _ = two_tools
    report = lt.compare(spox_file, sample, torch_file)
    assert report.ok, report
    by_name = {r.name: r for r in report.rows}
    # spox's Mul + Add is the BatchNorm torch.onnx folded into conv1's Conv: the Add pairs with that Conv
    assert by_name["Conv_0_Y"].status == "no counterpart" and by_name["Mul_0_C"].status == "no counterpart"
    assert by_name["Add_0_C"].onnx == ["/conv1/Conv_output_0"] and by_name["Add_0_C"].status == "pass"
    assert by_name["Relu_1_Y"].onnx == ["/relu2/Relu_output_0"]
    assert by_name["output"].onnx == ["y"] and by_name["output"].status == "pass"  # other output names: by position
    assert sum(r.status == "pass" for r in report.rows if r.path) == 7
    assert any("7 of 9 rows paired by graph order, shape, op type and the first sample's values" in n for n in report.notes)
    # the other way round: the torch file's module calls, answered by spox tensors
    back = lt.compare(torch_file, sample, spox_file)
    assert back.ok and {r.name: r.onnx for r in back.rows if r.status == "pass"} == {
        "bn1": ["Add_0_C"], "relu1": ["Relu_0_Y"], "conv2": ["Conv_1_Y"], "relu2": ["Relu_1_Y"],
        "pool": ["GlobalAveragePool_0_Y"], "flat": ["Flatten_0_output"], "fc": ["Gemm_0_Y"], "output": ["out"]}


def test_spox_against_a_float16_conversion_of_the_torch_file(two_tools, sample, capsys):
    spox_file, _, fp16 = two_tools
    report = lt.compare(spox_file, sample, fp16, metric="cosine")
    compared = [r for r in report.rows if r.status in ("pass", "FAIL")]
    assert report.ok and len(compared) == 8
    assert all(0 < r.rel_err < 1e-2 and r.cosine > 0.9999 for r in compared)  # float16 rounding, nothing more
    rc, stdout, err = _cli(capsys, "compare", str(spox_file), str(fp16), "--input", "x=2x3x16x16", "--json")
    assert rc == 0, err
    data = json.loads(stdout)
    assert data["ok"] is True and any("share no tensor names" in n for n in data["notes"])


def test_a_float16_overflow_fails_at_the_paired_row(torch_mod, tmp_path, sample, capsys):
    """conv2's output beyond 65504: its float16 value is inf; the row pairs by op type and shape and fails there."""
    spox_file, torch_file, fp16 = _build(torch_mod, tmp_path, 1e4)
    big = {"x": sample["x"] * 10}
    assert lt.compare(spox_file, big, torch_file).ok
    report = lt.compare(spox_file, big, fp16, criterion=lt.Criterion(check_finite=True))
    assert not report.ok and report.first_divergence == "Conv_1_Y"
    assert {r.name: r.status for r in report.rows}["Add_0_C"] == "pass"
    assert any("only by op type and shape" in n for n in report.notes)
    rc, stdout, _ = _cli(capsys, "compare", str(spox_file), str(fp16), "--input", "x=2x3x16x16")
    assert rc in (0, 1) and "Conv_1_Y" in stdout
