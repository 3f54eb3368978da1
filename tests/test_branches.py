"""Tensors inside If / Loop subgraphs: run, add-outputs, layers and compare reach them.

Real files: a small CNN whose whole network sits in the then/else branches of an If (built
with onnx.helper, both branches real, one nested If), a Loop whose body is a recurrent step,
and a scripted PyTorch module with an ``if`` exported by the TorchScript exporter. Values of
exposed branch tensors are checked against the same nodes laid out in a main graph of their
own (run by plain ONNX Runtime), or against PyTorch hooks.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import layertap as lt
from layertap.errors import LayertapError

F = TensorProto.FLOAT
OPSET = [helper.make_opsetid("", 17)]


def _w(rng, name, *shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def _cnn_branches(rng):
    """then: conv-relu-conv-relu-pool-fc; else: conv-(nested If: relu | sigmoid)-conv-pool-fc.

    Both branches compute a tensor named ``pooled``; the first conv weight ``w1`` lives in
    the main graph (outer scope), the others in the branches."""
    then_nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["t_conv1"], name="then/conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["t_conv1"], ["t_relu1"], name="then/relu1"),
        helper.make_node("Conv", ["t_relu1", "tw2"], ["t_conv2"], name="then/conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["t_conv2"], ["t_relu2"], name="then/relu2"),
        helper.make_node("GlobalAveragePool", ["t_relu2"], ["t_gap"], name="then/gap"),
        helper.make_node("Flatten", ["t_gap"], ["pooled"], name="then/flatten"),
        helper.make_node("Gemm", ["pooled", "tfc"], ["t_logits"], name="then/fc", transB=1),
    ]
    then = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("t_logits", F, [1, 5])],
                             [_w(rng, "tw2", 6, 4, 3, 3), _w(rng, "tfc", 5, 6)])
    inner_then = helper.make_graph([helper.make_node("Relu", ["e_conv1"], ["e_act"], name="else/relu")], "inner_then", [],
                                   [helper.make_tensor_value_info("e_act", F, None)])
    inner_else = helper.make_graph([helper.make_node("Sigmoid", ["e_conv1"], ["e_sig"], name="else/sigmoid")],
                                   "inner_else", [], [helper.make_tensor_value_info("e_sig", F, None)])
    else_nodes = [
        helper.make_node("Conv", ["x", "w1"], ["e_conv1"], name="else/conv1", pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["e_conv1"], ["e_mean"], name="else/mean", keepdims=0),
        helper.make_node("Greater", ["e_mean", "zero"], ["e_pos"], name="else/pos"),
        helper.make_node("If", ["e_pos"], ["e_mid"], name="else/pick", then_branch=inner_then, else_branch=inner_else),
        helper.make_node("Conv", ["e_mid", "ew2"], ["e_conv2"], name="else/conv2"),
        helper.make_node("GlobalAveragePool", ["e_conv2"], ["e_gap"], name="else/gap"),
        helper.make_node("Flatten", ["e_gap"], ["pooled"], name="else/flatten"),
        helper.make_node("Gemm", ["pooled", "efc"], ["e_logits"], name="else/fc", transB=1),
    ]
    other = helper.make_graph(else_nodes, "else", [], [helper.make_tensor_value_info("e_logits", F, [1, 5])],
                              [_w(rng, "ew2", 6, 4, 1, 1), _w(rng, "efc", 5, 6)])
    return then, other


def cnn_in_if(path, seed=0):
    """The whole network in the branches of ``If(c)``; returns the model (also saved at ``path``)."""
    rng = np.random.default_rng(seed)
    then, other = _cnn_branches(rng)
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["logits"], name="wrapper", then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("logits", F, [1, 5])],
        [_w(rng, "w1", 4, 3, 3, 3), _w(rng, "b1", 4), numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model


def flat_values(model, branch, feeds, names):
    """The branch's nodes laid out in a main graph of their own (outer-scope weights as initializers)."""
    inits = list(model.graph.initializer) + list(branch.initializer)
    inputs = [i for i in model.graph.input if i.name in feeds and i.name != "c"]
    g = helper.make_graph(list(branch.node), "flat", inputs, [helper.make_empty_tensor_value_info(n) for n in names], inits)
    sess = ort.InferenceSession(helper.make_model(g, opset_imports=OPSET, ir_version=8).SerializeToString())
    return dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k != "c"})))


@pytest.fixture
def cnn(tmp_path):
    path = tmp_path / "cnn_if.onnx"
    return path, cnn_in_if(path)


def _x(seed=1):
    return np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_run_taps_then_branch_tensors_and_other_branch_is_empty(cnn):
    path, model = cnn
    then, other = (a.g for a in sorted(model.graph.node[0].attribute, key=lambda a: a.name != "then_branch"))
    feeds = {"x": _x(), "c": np.array(True)}
    want = flat_values(model, then, feeds, ["t_conv1", "t_relu2", "pooled", "t_logits"])
    notes: list[str] = []
    got = lt.run(path, feeds, taps=["t_conv1", "t_relu2", "pooled", "e_conv2"], notify=notes.append)
    for name in ("t_conv1", "t_relu2", "pooled"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["output"], want["t_logits"], rtol=1e-6, atol=1e-6)
    # the else branch did not run: its tensor comes back empty, with a note saying why
    assert got["e_conv2"].size == 0
    assert any("'e_conv2' is inside the else_branch of If node 'wrapper', which did not run" in n for n in notes), notes


def test_run_taps_else_branch_and_nested_if(cnn):
    path, model = cnn
    other = next(a.g for a in model.graph.node[0].attribute if a.name == "else_branch")
    feeds = {"x": _x(), "c": np.array(False)}
    # the nested If: flatten it as well, picking the branch that runs
    e_conv1 = flat_values(model, other, feeds, ["e_conv1"])["e_conv1"]
    positive = bool(e_conv1.mean() > 0)
    got = lt.run(path, feeds, taps=["e_conv1", "e_act", "e_sig", "e_mid", "pooled", "t_relu1"])
    np.testing.assert_allclose(got["e_conv1"], e_conv1, rtol=1e-6, atol=1e-6)
    ran, skipped = ("e_act", "e_sig") if positive else ("e_sig", "e_act")
    np.testing.assert_allclose(got[ran], np.maximum(e_conv1, 0) if positive else 1 / (1 + np.exp(-e_conv1)), rtol=1e-5, atol=1e-6)
    assert got[skipped].size == 0 and got["t_relu1"].size == 0
    np.testing.assert_allclose(got["e_mid"], got[ran])
    # ``pooled`` exists in both branches: the value of the branch that ran
    want = flat_values(model, other, feeds, ["pooled", "e_logits"])
    np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["output"], want["e_logits"], rtol=1e-5, atol=1e-6)


def test_add_outputs_writes_a_file_plain_onnxruntime_runs(cnn, tmp_path):
    path, model = cnn
    before = path.read_bytes()
    out = tmp_path / "tapped.onnx"
    added = lt.add_outputs(path, out, tensors=["t_relu1", "e_mid", "pooled"])
    assert added == ["t_relu1", "e_mid", "pooled"]
    assert path.read_bytes() == before  # the input is never modified
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    assert [o.name for o in written.graph.output] == ["logits", "t_relu1", "e_mid", "pooled"]
    sess = ort.InferenceSession(str(out))
    then = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    feeds = {"x": _x(2), "c": np.array(True)}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    want = flat_values(model, then, feeds, ["t_relu1", "pooled", "t_logits"])
    np.testing.assert_allclose(got["t_relu1"], want["t_relu1"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["logits"], want["t_logits"], rtol=1e-6, atol=1e-6)
    assert got["e_mid"].size == 0
    # the written file, tapped again by lt.run, answers by the same names
    again = lt.run(out, feeds, taps=["t_relu1"])
    np.testing.assert_array_equal(again["t_relu1"], got["t_relu1"])


def test_layers_lists_branch_tensors(cnn):
    path, _ = cnn
    table = lt.onnx_layers(path)
    rows = {r.name: r for r in table.rows}
    assert rows["t_relu1"].op == "Relu" and rows["t_relu1"].graph == "then_branch of If 'wrapper'"
    assert rows["t_relu1"].dtype == "float32" and rows["t_relu1"].shape == [1, 4, 8, 8]
    assert rows["e_sig"].graph == "else_branch of If 'else/pick'"
    assert rows["logits"].graph is None and rows["logits"].op == "If"
    names = [r.name for r in table.rows]
    assert names.index("t_conv1") < names.index("logits") and names.index("e_conv1") < names.index("e_act")
    assert '"graph": "then_branch of If' in table.to_json()


def recurrent_loop(path, step_nodes, h_out, initializers, steps=3):
    """A Loop of ``steps`` iterations over ``h`` (1x4) whose body runs ``step_nodes`` (reading
    ``h_in`` and the iteration number ``i``, making ``h_out``); saved at ``path``."""
    body = helper.make_graph(
        [*step_nodes, helper.make_node("Identity", ["cond_in"], ["cond_out"], name="step/cond")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h_in", F, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info(h_out, F, [1, 4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "h0"], ["h"], name="rnn", body=body)], "g",
        [helper.make_tensor_value_info("h0", F, [1, 4])], [helper.make_tensor_value_info("h", F, [1, 4])],
        [*initializers, numpy_helper.from_array(np.array(steps, np.int64), "n")])
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return {i.name: numpy_helper.to_array(i) for i in graph.initializer}


def loop_model(path, steps=3):
    """h_{i+1} = tanh(h_i @ W + b): a Loop whose body is a recurrent step (tensors pre, act)."""
    rng = np.random.default_rng(3)
    return recurrent_loop(path, [helper.make_node("MatMul", ["h_in", "W"], ["pre0"], name="step/matmul"),
                                 helper.make_node("Add", ["pre0", "bias"], ["pre"], name="step/add"),
                                 helper.make_node("Tanh", ["pre"], ["act"], name="step/tanh")],
                          "act", [_w(rng, "W", 4, 4), _w(rng, "bias", 4)], steps)


def test_loop_body_tensors_are_stacked_over_iterations(tmp_path):
    path = tmp_path / "loop.onnx"
    w = loop_model(path, steps=3)
    h = np.random.default_rng(4).standard_normal((1, 4)).astype(np.float32)
    got = lt.run(path, {"h0": h}, taps=["pre", "act"])
    want_pre, want_act = [], []
    for _ in range(3):
        pre = h @ w["W"] + w["bias"]
        h = np.tanh(pre)
        want_pre.append(pre)
        want_act.append(h)
    assert got["pre"].shape == (3, 1, 4)  # one value per iteration, stacked
    np.testing.assert_allclose(got["pre"], np.stack(want_pre), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["act"], np.stack(want_act), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["output"], want_act[-1], rtol=1e-5, atol=1e-6)
    # ``act`` is already the body's carried output: carried out again as a copy
    out = tmp_path / "o.onnx"
    assert lt.add_outputs(path, out, tensors=["act"]) == ["act"]
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    ran = ort.InferenceSession(str(out)).run(None, {"h0": np.random.default_rng(4).standard_normal((1, 4)).astype(np.float32)})
    np.testing.assert_allclose(ran[1], np.stack(want_act), rtol=1e-5, atol=1e-6)


def test_unknown_branch_name_still_lists_close_matches(cnn):
    path, _ = cnn
    with pytest.raises(LayertapError, match="t_relu1"):
        lt.run(path, {"x": _x(), "c": np.array(True)}, taps=["t_relu"])


def test_cli_run_add_outputs_layers_without_torch(cnn, tmp_path):
    path, _ = cnn
    np.save(tmp_path / "x.npy", _x())
    np.save(tmp_path / "c.npy", np.array(True))
    code = ("import sys; from layertap.cli.main import main; rc = main(sys.argv[1:]); "
            "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules)); sys.exit(rc)")

    def cli(*args):
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)

    r = cli("run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"c={tmp_path / 'c.npy'}",
            "--tap", "t_relu2", "--tap", "e_conv1", "-o", str(tmp_path / "a.npz"))
    assert r.returncode == 0, r.stderr
    assert "TORCH=False" in r.stderr and "did not run" in r.stdout + r.stderr
    saved = np.load(tmp_path / "a.npz")
    assert saved["t_relu2"].shape == (1, 6, 8, 8) and saved["e_conv1"].size == 0
    r = cli("add-outputs", str(path), "-o", str(tmp_path / "o.onnx"), "--tensor", "e_sig")
    assert r.returncode == 0, r.stderr
    assert [o.name for o in onnx.load(str(tmp_path / "o.onnx")).graph.output] == ["logits", "e_sig"]
    r = cli("layers", str(path), "--json")
    assert r.returncode == 0 and '"t_relu1"' in r.stdout and "TORCH=False" in r.stderr, r.stderr


def test_openvino_runs_tensors_both_branches_compute_and_loop_bodies_refuses_one_branch_tensors(cnn, tmp_path):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'layertap[openvino]')")
    path, _ = cnn
    feeds = {"x": _x(), "c": np.array(False)}
    want = lt.run(path, feeds, taps=["pooled"])
    got = lt.run(path, feeds, taps=["pooled"], runtime="openvino", ov_precision="f32")
    np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["output"], want["output"], rtol=1e-4, atol=1e-5)
    with pytest.raises(LayertapError, match=r"^OpenVINO cannot expose 't_relu1': it is computed in one branch of If "
                                            r"node 'wrapper' only.*--runtime ort"):
        lt.run(path, feeds, taps=["t_relu1"], runtime="openvino", ov_precision="f32")
    # compare against ONNX Runtime: the branch tensors OpenVINO cannot hand out are rows saying so
    report = lt.compare(path, feeds, path, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    rows = {r.name: r for r in report.rows}
    assert report.ok and rows["output"].status == "pass"
    assert rows["e_conv1"].status == "no counterpart" and "inside an If branch" in rows["e_conv1"].note
    loop = tmp_path / "loop.onnx"
    loop_model(loop)
    h = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(lt.run(loop, {"h0": h}, taps=["pre"], runtime="openvino", ov_precision="f32")["pre"],
                               lt.run(loop, {"h0": h}, taps=["pre"])["pre"], rtol=1e-5, atol=1e-6)


def test_compare_onnx_files_rows_reach_both_branches(cnn, tmp_path):
    path, model = cnn
    then = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    w = next(i for i in then.initializer if i.name == "tw2")
    changed = numpy_helper.to_array(w).copy()
    changed[0] *= 1.5
    w.CopyFrom(numpy_helper.from_array(changed, "tw2"))
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    report = lt.compare(path, {"x": _x(), "c": np.array(True)}, bad)
    rows = {r.name: r for r in report.rows}
    assert not report.ok and report.first_divergence == "t_conv2"
    assert rows["t_relu1"].status == "pass" and rows["t_logits"].status == "FAIL"
    # the else branch did not run: its rows say so instead of passing on empty values
    assert rows["e_conv1"].status == "no counterpart" and "If branch did not run" in rows["e_conv1"].note
    names = [r.name for r in report.rows]
    assert names.index("t_conv1") < names.index("t_conv2") < names.index("e_conv1") < names.index("e_sig")
    report = lt.compare(path, {"x": _x(), "c": np.array(False)}, bad)
    assert report.ok and {r.name: r for r in report.rows}["e_conv2"].status == "pass"


def test_if_nested_in_a_loop_body_is_carried_through_both_levels(tmp_path):
    """h_{i+1} = relu(h_i @ W) when i < limit, else -h_i: the If sits in the Loop's body."""
    rng = np.random.default_rng(5)
    then = helper.make_graph([helper.make_node("MatMul", ["h_in", "W"], ["mm"], name="then/matmul"),
                              helper.make_node("Relu", ["mm"], ["act"], name="then/relu")], "then", [],
                             [helper.make_tensor_value_info("act", F, [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["h_in"], ["neg"], name="else/neg")], "else", [],
                              [helper.make_tensor_value_info("neg", F, [1, 4])])
    path = tmp_path / "loop_if.onnx"
    w = recurrent_loop(path, [helper.make_node("Less", ["i", "limit"], ["early"], name="step/less"),
                              helper.make_node("If", ["early"], ["h_out"], name="step/pick", then_branch=then,
                                               else_branch=other)],
                       "h_out", [_w(rng, "W", 4, 4), numpy_helper.from_array(np.array(100, np.int64), "limit")])
    rows = {r.name: r for r in lt.onnx_layers(path).rows}
    assert rows["mm"].graph == "then_branch of If 'step/pick'" and rows["early"].graph == "body of Loop 'rnn'"
    h = np.random.default_rng(6).standard_normal((1, 4)).astype(np.float32)
    got = lt.run(path, {"h0": h}, taps=["mm", "early"])
    W = w["W"]
    want = []
    for _ in range(3):
        want.append(h @ W)
        h = np.maximum(want[-1], 0)
    np.testing.assert_allclose(got["mm"], np.stack(want), rtol=1e-5, atol=1e-6)  # one per iteration
    assert got["early"].tolist() == [True, True, True]
    np.testing.assert_allclose(got["output"], h, rtol=1e-5, atol=1e-6)
