"""Quantised files (QDQ ``quantize_static``, ``quantize_dynamic``) answer like float files.

A small resnet-like net (stem, two torchvision BasicBlocks, Linear ``fc``), exported by both
exporters and quantised by onnxruntime.quantization: module taps are the dequantised values,
``run``/``add-outputs``/``compare`` use one module -> tensor mapping, an explicit quantised
tensor comes with a note naming the tensor the graph uses, and ``--local`` on a QDQ file
charges each module only the error it makes itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import layertap as lt  # noqa: E402
from layertap.errors import LayertapWarning  # noqa: E402
from layertap.onnxfile.scopemap import ScopeMap  # noqa: E402

EXPORTERS = ["dynamo", "torchscript"]


def _net(torch_mod):
    import torchvision
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.layer1 = nn.Sequential(torchvision.models.resnet.BasicBlock(8, 8),
                                        torchvision.models.resnet.BasicBlock(8, 8))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = self.layer1(self.relu(self.bn1(self.conv1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    torch_mod.manual_seed(0)
    net = Net().eval()
    with torch_mod.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net


class _Calibration:
    """The comparison sample and seven more, so that no calibrated range clips the sample."""

    def __init__(self, x: np.ndarray):
        rng = np.random.default_rng(0)
        self._it = iter([{"x": x}] + [{"x": rng.standard_normal(x.shape).astype(np.float32)} for _ in range(7)])

    def get_next(self):
        return next(self._it, None)


@pytest.fixture(scope="module")
def qfiles(torch_mod, tmp_path_factory):
    """Per exporter: the float file, its QDQ int8 copy, its dynamically quantised copy; input; PyTorch values."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    net = _net(torch_mod)
    x = torch_mod.randn(1, 3, 16, 16, generator=torch_mod.Generator().manual_seed(1))
    seen: dict[str, np.ndarray] = {}
    hooks = [m.register_forward_hook(lambda m, a, o, n=n: seen.update({n: o.detach().numpy().copy()}))
             for n, m in net.named_modules() if n]  # every module runs once
    with torch_mod.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    d = tmp_path_factory.mktemp("quantized")
    files: dict[tuple[str, str], Path] = {}
    reader = type("Reader", (_Calibration, CalibrationDataReader), {})
    for exporter in EXPORTERS:
        src = d / f"{exporter}.onnx"
        torch_mod.onnx.export(net, (x,), str(src), dynamo=exporter == "dynamo", input_names=["x"], output_names=["y"])
        files[(exporter, "float")] = src
        files[(exporter, "qdq")] = d / f"{exporter}-int8.onnx"
        quantize_static(str(src), str(files[(exporter, "qdq")]), reader(x.numpy()), quant_format=QuantFormat.QDQ)
        files[(exporter, "dynamic")] = d / f"{exporter}-dyn.onnx"
        quantize_dynamic(str(src), str(files[(exporter, "dynamic")]))
    return files, x.numpy(), seen


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_qdq_module_taps_are_the_dequantised_values(qfiles, exporter, tmp_path):
    files, x, seen = qfiles
    q = files[(exporter, "qdq")]
    taps = ["layer1.1", "layer1.0", "layer1.0.bn1", "bn1", "fc"]
    got = lt.run(q, {"x": x}, taps=taps)
    smap = ScopeMap.from_model(onnx.load(str(q), load_external_data=False))
    for block in ("layer1.0", "layer1.1"):
        (_, tensor), = smap.resolve(block)
        assert tensor.endswith("DequantizeLinear_Output"), (block, tensor)  # after its ReLU, folded into Q
        assert got[block].min() >= 0 and _rel(got[block], seen[block]) < 0.05, block
    for path in taps:  # each tap is its own module's value, never the one after it
        assert _rel(got[path], seen[path]) < 0.05, (path, _rel(got[path], seen[path]))
    assert got["bn1"].min() < 0  # the BatchNorm's value, before the ReLU the quantizer folded away
    out = tmp_path / "tapped.onnx"
    assert lt.add_outputs(q, out, modules=["layer1.1"]) == ["layer1.1"]
    again = lt.run(out, {"x": x}, taps=["layer1.1"])
    np.testing.assert_array_equal(again["layer1.1"], got["layer1.1"])


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_compare_rows_use_the_candidates_own_module_tensors(qfiles, exporter):
    """One mapping: every row compare pairs by module is the tensor run/add-outputs answer for it."""
    files, x, _ = qfiles
    q = files[(exporter, "qdq")]
    smap = ScopeMap.from_model(onnx.load(str(q), load_external_data=False))
    report = lt.compare(files[(exporter, "float")], {"x": x}, q, metric="sqnr", criterion=lt.Criterion(min_sqnr_db=10))
    checked = 0
    for row in report.rows:
        if not row.onnx or not row.name or row.name == "output" or smap.calls(row.name.split("#")[0]) == 0:
            continue
        (_, tensor), = smap.resolve(row.name)
        assert list(row.onnx) == [tensor], (row.name, row.onnx, tensor)
        checked += 1
    assert checked >= 10 and report.ok, str(report)
    assert next(r for r in report.rows if r.name == "layer1.0.bn1").ok  # no longer refused as another's value


def test_quantised_tensor_names_the_tensor_the_graph_uses(qfiles, tmp_path, cli):
    files, x, _ = qfiles
    q = files[("dynamo", "qdq")]
    smap = ScopeMap.from_model(onnx.load(str(q), load_external_data=False))
    (_, used), = smap.resolve("layer1.1")
    before = used.removesuffix("_DequantizeLinear_Output")
    with pytest.warns(LayertapWarning, match=f"tensor '{before}' is quantised.*'{used}'"):
        got = lt.run(q, {"x": x}, taps=[before, "layer1.1"])
    assert got[before].min() < 0 <= got["layer1.1"].min()  # the asked tensor is kept: before quantisation
    r = cli("add-outputs", str(q), "-o", str(tmp_path / "t.onnx"), "--tensor", before)
    assert r.returncode == 0, r.stderr
    assert f"layertap: warning: tensor '{before}' is quantised" in r.stderr and used in r.stderr
    np.save(tmp_path / "x.npy", x)
    r = cli("run", str(q), "--input", f"x={tmp_path / 'x.npy'}", "--tap", before)
    assert r.returncode == 0 and f"'{used}'" in r.stderr, r.stderr


def test_dynamic_quantised_linear_keeps_its_module(qfiles, tmp_path):
    """quantize_dynamic renames fc's Gemm (/fc/Gemm_MatMul_quant, /fc/Gemm_Add): they are still fc's."""
    files, x, seen = qfiles
    q = files[("torchscript", "dynamic")]
    names = [n.name for n in onnx.load(str(q), load_external_data=False).graph.node]
    assert "/fc/Gemm_MatMul_quant" in names and "/fc/Gemm" not in names
    out = tmp_path / "fc.onnx"
    assert lt.add_outputs(q, out, modules=["fc", "fc:input"]) == ["fc", "fc:input"]
    got = lt.run(out, {"x": x})
    assert _rel(got["fc"], seen["fc"]) < 0.05
    assert _rel(got["fc:input"], seen["avgpool"].reshape(1, -1)) < 0.01  # before fc's own input quantisation


def _damage(src: Path, dst: Path, scale: str, factor: float) -> Path:
    """A copy of ``src`` whose weight scale ``scale`` is multiplied by ``factor`` (a badly quantised weight)."""
    from onnx import numpy_helper

    model = onnx.load(str(src))
    init = next(i for i in model.graph.initializer if i.name == scale)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(factor), scale))
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_local_error_on_qdq_is_each_modules_own(qfiles, exporter, tmp_path):
    files, x, _ = qfiles
    ref, q = files[(exporter, "float")], files[(exporter, "qdq")]
    report = lt.compare(ref, {"x": x}, q, local=True)
    relus = [r for r in report.rows if ".relu" in f".{r.name}" and r.local_rel is not None]
    assert len(relus) >= 4, [(r.name, r.local_rel) for r in report.rows]
    for r in relus:  # a ReLU's own error is its output's rounding, far below what it inherits
        assert r.local_rel < 0.02 and r.local_rel < r.rel_err / 2, (r.name, r.local_rel, r.rel_err)
    conv = "layer1.0.conv2.weight_scale" if exporter == "dynamo" else _scale_of(q, "/layer1/layer1.0/conv2/Conv")
    bad = lt.compare(ref, {"x": x}, _damage(q, tmp_path / "bad.onnx", conv, 8.0), local=True)
    rows = {r.name: r for r in bad.rows}
    assert rows["layer1.0.bn2"].local_rel > 0.5, rows["layer1.0.bn2"]
    after = [rows[n] for n in ("layer1.1.relu#0", "layer1.1.bn2", "layer1.1.relu#1")]
    assert all(r.rel_err > 0.1 and r.local_rel < 0.05 for r in after), [(r.name, r.rel_err, r.local_rel) for r in after]


def _scale_of(path: Path, conv_node: str) -> str:
    """The weight scale of a TorchScript Conv node (its weight is anonymous after the BatchNorm fold)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    made = {t: n for n in graph.node for t in n.output}
    conv = next(n for n in graph.node if n.name == conv_node)
    return made[conv.input[1]].input[1]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_qdq_file_run_two_ways_compares_each_tensor_as_itself(qfiles, exporter):
    """Both sides quantise the same tensors: a module's float value is compared with the same float
    value, not with the other side's dequantised (clipped) copy of it."""
    files, x, _ = qfiles
    q = files[(exporter, "qdq")]
    report = lt.compare(q, {"x": x}, q, runtime_options=lt.RuntimeOptions(ort_optimizations=False, ref_ort_optimizations=True))
    assert report.ok, str(report)
    assert {r.status for r in report.rows} <= {"pass", "absorbed"}
    assert all(r.max_abs is None or r.max_abs < 1e-4 for r in report.rows)


def test_int8_sums_are_exact_on_every_cpu(tmp_path):
    """ONNX Runtime's u8 x s8 kernels on x86 CPUs without VNNI sum pairs of products in 16 bits with
    saturation (4 x 127 x 127 gives 510 there, not 64516); layertap's sessions pin ORT's exact int8
    option, so a quantised file gives one answer on every CPU, fused or not."""
    from layertap.runtimes.ort import int8_probe

    model, feed, exact, saturated = int8_probe("MatMul")
    assert (exact, saturated) == (64516.0, 510.0)
    path = tmp_path / "probe.onnx"
    onnx.save(model, str(path))
    assert float(lt.run(path, feed)["output"].item()) == exact
    report = lt.compare(path, feed, path, runtime_options=lt.RuntimeOptions(ort_optimizations=False, ref_ort_optimizations=True))
    assert report.ok and [r.max_abs for r in report.rows if r.name == "output"] == [0.0], str(report)


def test_a_graph_onnx_runtime_cannot_make_exact_still_runs(tmp_path):
    """ORT refuses its exact int8 option where two nodes read one int8 weight (a part graph's pieces,
    tied weights): such a file runs as ORT runs it by default, both products alike."""
    from onnx import helper as h

    from layertap.runtimes.ort import int8_probe

    model, feed, exact, saturated = int8_probe("MatMul")
    model.graph.node.extend([h.make_node("DequantizeLinear", ["w_q", "scale", "zero"], ["w_dq2"]),
                             h.make_node("MatMul", ["x_dq", "w_dq2"], ["y2"])])
    model.graph.output.append(h.make_tensor_value_info("y2", onnx.TensorProto.FLOAT, None))
    path = tmp_path / "shared.onnx"
    onnx.save(model, str(path))
    got = lt.run(path, feed)
    assert float(got["y"].item()) == float(got["y2"].item()) in (exact, saturated), got
