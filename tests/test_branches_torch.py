"""PyTorch models with data-dependent control flow, exported with their branches as If subgraphs:
run, layers and compare reach the modules inside the branches (TorchScript exporter: a scripted
``if``, node names carry module scopes), and tensors by name (torch.export exporter: torch.cond,
whose branch nodes carry no module scopes)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import layertap as lt
from layertap.errors import LayertapError


class Branchy(torch.nn.Module):
    """conv, then ``a`` (conv + relu) when the input's mean is positive, else ``b`` (conv + sigmoid), then fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.a = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU())
        self.b = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.Sigmoid())
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if bool(x.mean() > 0):
            h = self.a(h)
        else:
            h = self.b(h)
        return self.fc(h.mean((2, 3)))


class CondBranchy(Branchy):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        h = torch.cond(x.mean() > 0, lambda t: self.a(t), lambda t: self.b(t), (h,))
        return self.fc(h.mean((2, 3)))


def _inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, 8, 8, generator=g).abs()
    return {"a": x, "b": -x}  # the branch each one takes


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    torch.manual_seed(0)
    model = Branchy().eval()
    path = tmp_path_factory.mktemp("branchy") / "branchy.onnx"
    with warnings.catch_warnings():  # torch.jit.script and the TorchScript exporter are deprecated upstream
        warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning))
        torch.onnx.export(torch.jit.script(model), (_inputs()["a"],), str(path), dynamo=False, input_names=["x"])
    assert any(n.op_type == "If" for n in onnx.load(str(path)).graph.node)
    return model, path


@pytest.mark.parametrize("branch", ["a", "b"])
def test_run_module_taps_inside_branches_equal_hooks(scripted, branch):
    model, path = scripted
    x = _inputs()[branch]
    other = "b" if branch == "a" else "a"
    want = lt.extract(model, x, taps=[f"{branch}.0", branch, "conv"])
    got = lt.run(path, [x.numpy()], taps=[f"{branch}.0", branch, "conv", f"{other}.0"])
    for name in (f"{branch}.0", branch, "conv"):
        np.testing.assert_allclose(got[name], want[name].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["output"], want["output"].numpy(), rtol=1e-5, atol=1e-6)
    assert got[f"{other}.0"].size == 0  # the branch not taken


def test_layers_and_add_outputs_name_branch_modules(scripted, tmp_path):
    model, path = scripted
    rows = {r.name: r for r in lt.onnx_layers(path).rows}
    assert (rows["/a/0/Conv_output_0"].module, rows["/a/0/Conv_output_0"].graph) == ("a.0", "then_branch of If '/If'")
    assert rows["/b/1/Sigmoid_output_0"].module == "b.1"
    out = tmp_path / "tapped.onnx"
    assert lt.add_outputs(path, out, modules=["a.1", "b"]) == ["a.1", "b"]
    import onnxruntime as ort

    x = _inputs()["b"]
    got = dict(zip(["output", "a.1", "b"], ort.InferenceSession(str(out)).run(None, {"x": x.numpy()})))
    want = lt.extract(model, x, taps=["b"])
    np.testing.assert_allclose(got["b"], want["b"].numpy(), rtol=1e-5, atol=1e-6)
    assert got["a.1"].size == 0


def test_compare_rows_reach_branch_modules_and_name_the_first_divergence(scripted, tmp_path):
    model, path = scripted
    x = _inputs()["a"]
    report = lt.compare(model, (x,), path)
    assert report.ok
    names = [r.name for r in report.rows]
    assert names.index("conv") < names.index("a.0") < names.index("a.1") < names.index("a") < names.index("fc")
    assert "b.0" not in names  # PyTorch did not run b
    # a weight of the then branch changed by hand: the first divergence is that module
    m = onnx.load(str(path))
    w = next(i for i in m.graph.initializer if i.name == "a.0.weight")
    arr = numpy_helper.to_array(w).copy()
    arr[0] *= 1.5
    w.CopyFrom(numpy_helper.from_array(arr, w.name))
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    report = lt.compare(model, (x,), bad)
    assert not report.ok and report.first_divergence == "a.0"
    assert next(r for r in report.rows if r.name == "conv").status == "pass"
    # the other branch: that weight is not used
    assert lt.compare(model, (_inputs()["b"],), bad).ok


@pytest.mark.slow
def test_torch_cond_dynamo_branch_tensors_by_name(tmp_path):
    torch.manual_seed(0)
    model = CondBranchy().eval()
    path = tmp_path / "cond.onnx"
    torch.onnx.export(model, (_inputs()["a"],), str(path), dynamo=True, input_names=["x"])
    rows = {r.name: r for r in lt.onnx_layers(path).rows}
    then_conv = next(n for n, r in rows.items() if r.op == "Conv" and (r.graph or "").startswith("then_branch"))
    else_conv = next(n for n, r in rows.items() if r.op == "Conv" and (r.graph or "").startswith("else_branch"))
    for branch, x in _inputs().items():
        got = lt.run(path, [x.numpy()], taps=[then_conv, else_conv])
        with torch.no_grad():
            want = getattr(model, branch)[0](model.conv(x)).numpy()
        ran, skipped = (then_conv, else_conv) if branch == "a" else (else_conv, then_conv)
        np.testing.assert_allclose(got[ran], want, rtol=1e-5, atol=1e-6)
        assert got[skipped].size == 0
    # ONNX vs ONNX: rows are module calls, and torch.cond's branch nodes carry no module path
    # (their name scopes hold the FX node name alone), so the branches add no rows and break nothing
    report = lt.compare(path, [_inputs()["a"].numpy()], path, runtime_options=lt.RuntimeOptions(ort_optimizations=False, ref_ort_optimizations=True))
    assert report.ok and [r.name for r in report.rows] == ["conv", "fc", "output"]
    # PyTorch refuses hooks inside torch.cond in eager mode: one line saying so, not "bad inputs"
    with pytest.raises(LayertapError, match="calls modules inside torch.cond .* refuses the forward hooks"):
        lt.compare(model, (_inputs()["a"],), path)
