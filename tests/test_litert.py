"""LiteRT programs (.tflite): export with taps, run, compare module by module, judged at int8, fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("litert_torch", reason="LiteRT is not installed: pip install 'layertap[litert]'")
pytest.importorskip("ai_edge_quantizer", reason="LiteRT is not installed: pip install 'layertap[litert]'")

import torch
from torch import nn

import layertap as lt
from layertap.cli.main import main
from layertap.options import ExportOptions

sys.path.insert(0, str(Path(__file__).parent))

from _faults import edit_litert_constant, faulty_conversion
from test_executorch import outlier_net, small_net  # the same small nets as the ExecuTorch tests

TAPS = ["conv1", "relu", "fc:input"]


@pytest.fixture(scope="module")
def net_program(tmp_path_factory):
    """SmallNet exported once to a float32 LiteRT program with taps."""
    path = tmp_path_factory.mktemp("tflite") / "net.tflite"
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    report = lt.export(model, x, path, taps=TAPS)
    return model, x, path, report


def test_export_taps_equal_forward_hooks_in_litert(net_program):
    model, x, path, report = net_program
    assert report.ok and [r.name for r in report.rows] == ["output", "conv1", "relu#0", "relu#1", "fc:input"]
    side = json.loads(Path(str(path) + ".json").read_text())
    assert side["recipe"]["converter"] == "litert-torch" and side["inputs"][0]["shape"] == [1, 3, 16, 16]
    values = lt.run(path, [x.numpy()])
    with lt.tap(model, TAPS) as taps:
        want = model(x)
    assert list(values) == ["output", "conv1", "relu#0", "relu#1", "fc:input"]
    np.testing.assert_allclose(values["output"], want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for name, t in taps.outputs.items():  # NCHW as PyTorch has them
        np.testing.assert_allclose(values[name], t.numpy(), rtol=1e-4, atol=1e-5)
    assert list(lt.run(path, [x.numpy()], taps=["relu#1"])) == ["output", "relu#1"]
    # the program's own signature names its outputs by layertap's names (readable without the sidecar)
    from ai_edge_litert.interpreter import Interpreter

    outputs = Interpreter(model_path=str(path)).get_signature_list()["serving_default"]["outputs"]
    assert sorted(outputs) == sorted(["output", "conv1", "relu#0", "relu#1", "fc:input"])


def test_compare_faithful_program_passes_with_every_module_row(net_program):
    model, x, path, _ = net_program
    report = lt.compare(model, x, path, samples=2)
    assert report.ok and report.first_divergence is None
    assert [r.name for r in report.rows] == ["conv1", "bn1", "relu#0", "conv2", "bn2", "relu#1", "pool", "fc",
                                               "output"]
    assert all(r.status == "pass" for r in report.rows)
    assert any("LiteRT" in n for n in report.notes)
    # the weights inside the program are the model's (conv weights with their BatchNorm folded in)
    assert report.summary()["weights"] == {"matched": 10, "compared_anyway": False, "differing": {}}


def test_layers_and_cli_run_of_a_program(net_program, tmp_path, capsys):
    _, x, path, _ = net_program
    assert main(["layers", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["name"], r["op"], r["module"], r["call"]) for r in rows] == [
        ("x", "input", None, None), ("output", "output", None, None), ("conv1", "tap", "conv1", 0),
        ("relu#0", "tap", "relu", 0), ("relu#1", "tap", "relu", 1), ("fc:input", "tap", "fc", 0)]
    out = tmp_path / "acts.npz"
    assert main(["run", str(path), "--tap", "relu#1", "-o", str(out)]) == 0
    assert sorted(np.load(out).files) == ["output", "relu#1"]
    assert main(["run", str(path), "--tap", "relu#7"]) == 2
    assert "relu#1" in capsys.readouterr().err


def test_a_program_converted_from_other_weights_is_named_at_its_module(net_program):
    model, x, path, _ = net_program
    assert lt.compare(model, x, path).summary()["weights"]["matched"] == 10
    changed = small_net()
    with torch.no_grad():
        changed.fc.weight[0] *= 3
    report = lt.compare(changed, x, path)
    assert "fc.weight differs" in next(r for r in report.rows if r.path == "fc").weights
    with pytest.raises(lt.LayertapError, match="the program's weights are not the model's"):
        lt.compare(small_net(seed=1), x, path)


def test_a_weight_changed_inside_the_program_is_named_at_its_module(net_program, int8_program, tmp_path):
    model, x, path, _ = net_program
    edited = tmp_path / "edited.tflite"
    edit_litert_constant(path, tmp_path / "step.tflite", "Linear_fc", lambda w: w * np.float32(1.5))

    def flip_one(w):
        w.flat[5] = -w.flat[5]
        return w

    edit_litert_constant(tmp_path / "step.tflite", edited, "Conv2d_conv2", flip_one)  # its BatchNorm folded in
    report = lt.compare(model, x, edited)
    rows = {r.path: r for r in report.rows}
    assert rows["fc"].weights == "fc.weight differs (rel 0.5)"
    assert rows["conv2"].weights.startswith("conv2.weight differs (rel ")
    assert set(report.summary()["weights"]["differing"]) == {"conv2.weight", "fc.weight"}
    # the program's own outputs show it (relu#1 is a tap it was exported with); the rows of the model converted
    # again with a tap at every module hold the model's weights
    assert report.first_divergence == "relu#1" and rows["conv2"].status == "pass"
    model8, x8, path8, _ = int8_program
    edit_litert_constant(path8, tmp_path / "edited8.tflite", "Linear_fc", lambda q: -q)  # int8 values
    report = lt.compare(model8, x8, tmp_path / "edited8.tflite")
    assert next(r for r in report.rows if r.path == "fc").weights.startswith("fc.weight differs (rel 2")
    assert not report.ok


@pytest.fixture
def faulty_converter():
    """A conversion that breaks conv2 (its output scaled by 1.05 in the program), as a faulty toolchain would."""
    with faulty_conversion("conv2", 1.05):
        yield


def test_fault_in_one_module_is_found_at_that_module(tmp_path, faulty_converter):
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    path = tmp_path / "bad.tflite"
    assert not lt.export(model, x, path).ok  # the check sees it at the output; the file is still written
    report = lt.compare(model, x, path)
    assert not report.ok and report.first_divergence == "conv2"
    assert [r.status for r in report.rows[:3]] == ["pass", "pass", "pass"]


def _convert(model: nn.Module, x: torch.Tensor, path: Path) -> Path:
    """``model`` converted by litert-torch itself: a program layertap did not write (no m.tflite.json)."""
    import litert_torch

    from layertap.pytorch.litert import quiet_converter

    with quiet_converter():
        litert_torch.convert(model, (x,)).export(str(path))
    return path


@pytest.fixture(scope="module")
def plain_program(tmp_path_factory):
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    return model, x, _convert(model, x, tmp_path_factory.mktemp("plain") / "plain.tflite")


def test_program_from_elsewhere_is_compared_by_module_path(plain_program):
    model, x, path = plain_program
    report = lt.compare(model, x, path, samples=2)
    # each ReLU call is the Conv+BatchNorm+ReLU op its location leads; the Conv and BatchNorm went into it
    assert report.ok and {r.name: (r.status, r.fused_into) for r in report.rows} == {
        "conv1": ("absorbed", "relu#0"), "bn1": ("absorbed", "relu#0"), "relu#0": ("pass", None),
        "conv2": ("absorbed", "relu#1"), "bn2": ("absorbed", "relu#1"), "relu#1": ("pass", None),
        "pool": ("pass", None), "fc": ("pass", None), "output": ("pass", None)}
    relu = next(r for r in report.rows if r.name == "relu#1")
    assert relu.shape == [1, 16, 16, 16] and relu.onnx == ["relu;bn2;conv2;2"]  # NHWC compared as NCHW
    notes = " ".join(report.notes)
    assert "experimental_preserve_all_tensors" in notes and "layertap export MODEL -o m.tflite" in notes
    assert "--tap" in notes


def test_a_program_from_elsewhere_has_its_weights_checked_by_module_path(plain_program):
    """No record beside it: the constants inside the program, found by the module locations in their names, are
    the model's (every weight matched, none differing); a model of other weights is named at its modules."""
    model, x, path = plain_program
    weights = lt.compare(model, x, path).summary()["weights"]
    assert weights["matched"] >= 3 and not weights.get("differing"), weights
    changed = small_net()
    with torch.no_grad():
        changed.fc.weight[0] *= 3
    report = lt.compare(changed, x, path)
    assert "fc.weight differs" in (next(r for r in report.rows if r.path == "fc").weights or ""), report.summary()
    with pytest.raises(lt.LayertapError, match="the program's weights are not the model's"):
        lt.compare(small_net(seed=1), x, path)


def test_program_from_elsewhere_layers_and_taps_by_module_path(plain_program, capsys):
    model, x, path = plain_program
    assert main(["layers", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    held = {(r["module"], r["call"]): (r["name"], r["shape"], r["node"]) for r in rows if r["module"]}
    assert held == {("relu", 0): ("relu;bn1;conv1;2", [1, 8, 16, 16], "1"),
                    ("relu", 1): ("relu;bn2;conv2;2", [1, 16, 16, 16], "2"), ("pool", 0): ("pool;1", [1, 16], "3")}
    with lt.tap(model, ["relu", "pool"]) as taps:
        model(x)
    values = lt.run(path, [x.numpy()], taps=["relu", "pool", "relu;bn2;conv2;2"])
    assert list(values) == ["output_0", "relu#0", "relu#1", "pool", "relu;bn2;conv2;2"]
    for name in ("relu#0", "relu#1"):  # in PyTorch's layout
        np.testing.assert_allclose(values[name], taps[name].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(values["relu;bn2;conv2;2"], values["relu#1"])
    np.testing.assert_allclose(values["pool"], taps["pool"].numpy().reshape(1, 16), rtol=1e-4, atol=1e-5)
    assert main(["run", str(path), "--tap", "conv1"]) == 2
    assert "fused it into relu's op" in capsys.readouterr().err
    assert main(["run", str(path), "--tap", "relu#5"]) == 2 and main(["run", str(path), "--tap", "fc2"]) == 2


def test_fault_in_a_program_from_elsewhere_is_found_at_its_first_tensor(tmp_path):
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    handle = model.conv2.register_forward_hook(lambda m, i, o: o * 1.05)  # a faulty toolchain breaks conv2
    try:
        path = _convert(model, x, tmp_path / "bad.tflite")
    finally:
        handle.remove()
    report = lt.compare(model, x, path)
    # conv2 and bn2 went into the second ReLU's op: the first tensor after the fault names it
    assert not report.ok and report.first_divergence == "relu#1"
    assert [r.status for r in report.rows[:3]] == ["absorbed", "absorbed", "pass"]


class Stack(nn.Module):
    """Two transformer blocks in an nn.ModuleList: the list is never called, so litert-torch's locations skip it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_transformer_program_from_elsewhere_resolves_module_list_paths(tmp_path):
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(1, 7, 32)
    path = _convert(model, x, tmp_path / "stack.tflite")
    rows = {r.name: r for r in lt.compare(model, x, path).rows}
    for block in ("layers.0", "layers.1"):
        assert all(rows[f"{block}.{m}"].status == "pass" for m in ("norm1", "norm2", "mlp.0", "mlp.1", "mlp.2"))
    assert rows["layers.1"].status == rows["output"].status == "pass"
    assert rows["layers.0.attn"].status == "no counterpart"  # nn.MultiheadAttention returns (value, None)
    with lt.tap(model, ["layers.1.mlp.0"]) as taps:
        model(x)
    got = lt.run(path, [x.numpy()], taps=["layers.1.mlp.0"])["layers.1.mlp.0"]  # by the model's own path
    np.testing.assert_allclose(got.reshape(1, 7, 128), taps["layers.1.mlp.0"].numpy(), rtol=1e-4, atol=1e-5)


def test_torchvision_program_from_elsewhere_and_its_model_explorer_overlay(tmp_path, capsys):
    adapter = pytest.importorskip("ai_edge_model_explorer_adapter", reason="ai-edge-model-explorer not installed")
    import torchvision

    torch.manual_seed(0)
    model, x = torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32)
    path = _convert(model, x, tmp_path / "r18.tflite")
    torch.save(model.state_dict(), tmp_path / "r18.pt")
    nd = tmp_path / "nd.json"
    assert main(["compare", "torchvision:resnet18", str(path), "--weights", str(tmp_path / "r18.pt"), "--input",
                 "1x3x32x32", "--node-data", str(nd), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    statuses = [r["status"] for r in report["rows"]]
    assert statuses.count("pass") == 47 and statuses.count("absorbed") == 29 and "FAIL" not in statuses
    # Model Explorer's own TFLite adapter reads the program: every key is one of its op nodes, every op has one
    graph = json.loads(adapter.ConvertFlatbufferDirectlyToJson(adapter.VisualizeConfig(), str(path)))[0]
    nodes = {n["id"]: n for n in graph["subgraphs"][0]["nodes"]}
    module = json.loads(nd.with_name("nd.module.json").read_text())["results"]
    status = json.loads(nd.with_name("nd.status.json").read_text())["results"]
    ops = {k for k, n in nodes.items() if n["label"] not in ("GraphInputs", "GraphOutputs", "pseudo_const")}
    assert set(module) == ops and set(status) <= ops
    by_label = {(nodes[k]["label"], module[k]["value"]) for k in module}
    assert {("conv_2d", "relu"), ("max_pool_2d", "maxpool"), ("add", "layer4.1.relu#1"), ("sum", "avgpool"),
            ("fully_connected", "fc")} <= by_label
    assert {status[k]["value"] for k in status} == {"pass", "absorbed"}  # the stem's transpose and pad: conv1's


@pytest.fixture(scope="module")
def int8_program(tmp_path_factory):
    path = tmp_path_factory.mktemp("tflite8") / "net-int8.tflite"
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    report = lt.export(model, x, path, export_options=ExportOptions(quantize="int8", calibration=8))
    return model, x, path, report


def test_static_int8_program_is_judged_healthy_at_int8(int8_program):
    model, x, path, export_report = int8_program
    assert export_report.ok and Path(str(path) + ".calib.npz").exists()
    recipe = json.loads(Path(str(path) + ".aeq.json").read_text())  # AI Edge Quantizer's own recipe
    assert recipe[0]["algorithm_key"] == "min_max_uniform_quantize"
    from ai_edge_litert.interpreter import Interpreter

    assert Interpreter(model_path=str(path)).get_input_details()[0]["dtype"] == np.int8  # int8 in, int8 out
    got, want = lt.run(path, [x.numpy()])["output"], model(x).detach().numpy()  # quantised in, dequantised out
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999
    report = lt.compare(model, x, path, samples=2)
    assert report.ok and report.precision == "int8" and report.first_divergence is None
    assert all(r.format_rel is not None for r in report.rows if r.status == "pass")
    assert report.summary()["weights"]["differing"] == {}  # int8 weights within half a step of their channel's scale
    # at float32's fixed tolerance the same rows fail: the format, not the program
    assert not lt.compare(model, x, path, rtol=1e-3).ok


def test_int8_program_from_elsewhere_is_judged_at_int8(int8_program, tmp_path):
    model, x, path, _ = int8_program
    plain = tmp_path / "plain-int8.tflite"  # the same program without layertap's record beside it
    plain.write_bytes(path.read_bytes())
    report = lt.compare(model, x, plain)
    # its int8 tensors are read dequantised and judged at int8's rounding: the quantisation alone fails nothing
    assert report.ok and report.precision == "int8"
    assert {r.status for r in report.rows} == {"pass", "absorbed"} and report.rows[-1].status == "pass"
    assert any("fixed rule at int8" in n for n in report.notes)
    assert not lt.compare(model, x, plain, rtol=1e-4).ok  # at float32's tolerance the int8 rows fail


def test_cli_dynamic_int8_program_passes_and_options_are_checked(tmp_path, capsys):
    out = tmp_path / "dyn.tflite"
    spec = f"{Path(__file__).parent / 'test_executorch.py'}:small_net"
    assert main(["export", spec, "--input", "1x3x16x16", "-o", str(out), "--quantize", "dynamic", "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", spec, str(out), "--input", "1x3x16x16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["precision"] == "int8" and len(report["rows"]) == 9
    assert main(["export", spec, "-o", str(tmp_path / "b.tflite"), "--backend", "portable"]) == 2
    assert main(["export", spec, "-o", str(tmp_path / "b.pte"), "--quantize", "dynamic"]) == 2
    assert "--quantize dynamic makes a LiteRT program" in capsys.readouterr().err


def test_corrupt_program_and_missing_extra_are_one_line(net_program, tmp_path, monkeypatch, capsys):
    _, _, path, _ = net_program
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(path.read_bytes()[:4000])
    assert main(["run", str(cut)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("layertap: error: LiteRT cannot load") and err.count("\n") == 1
    (tmp_path / "text.tflite").write_text("not a program")
    assert main(["layers", str(tmp_path / "text.tflite")]) == 2
    assert "TFL3" in capsys.readouterr().err
    for name in ("ai_edge_litert.interpreter", "litert_torch"):
        monkeypatch.setitem(sys.modules, name, None)  # as if the extra were not installed
    assert main(["run", str(path)]) == 2
    assert "pip install 'layertap[litert]'" in capsys.readouterr().err
    with pytest.raises(lt.LayertapError, match=r"layertap\[litert\]"):
        lt.export(small_net(), torch.randn(1, 3, 8, 8), tmp_path / "n.tflite")
    assert not (tmp_path / "n.tflite").exists()


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, self-attention, LayerNorm, MLP."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def test_transformer_block_taps_and_module_rows(tmp_path):
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 7, 32)
    path = tmp_path / "block.tflite"
    report = lt.export(model, x, path, taps=["norm1", "mlp.1", "attn[0]"])
    assert report.ok, report
    with lt.tap(model, ["norm1", "mlp.1", "attn[0]"]) as taps:
        model(x)
    values = lt.run(path, [x.numpy()])
    for name, t in taps.outputs.items():
        np.testing.assert_allclose(values[name], t.numpy(), rtol=1e-4, atol=1e-5)
    rows = lt.compare(model, x, path).rows
    assert {"norm1", "norm2", "mlp.0", "mlp.1", "mlp.2", "output"} <= {r.name for r in rows if r.status == "pass"}
    assert all(r.status != "FAIL" for r in rows)


@pytest.mark.slow
def test_torchvision_model_program_compares_every_module(tmp_path, capsys):
    out = tmp_path / "r18.tflite"
    assert main(["export", "torchvision:resnet18", "--input", "1x3x64x64", "-o", str(out), "--tap", "layer1",
                 "--tap", "layer2.0.relu", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["rows"]] == [
        "output", "layer1", "layer2.0.relu#0", "layer2.0.relu#1"]
    assert main(["compare", "torchvision:resnet18", str(out), "--input", "1x3x64x64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and sum(r["status"] == "pass" for r in report["rows"]) > 60


@pytest.mark.slow
def test_fix_meets_its_target_in_litert(tmp_path, capsys):
    out, cfg = tmp_path / "fixed.tflite", tmp_path / "cfg"
    code = main(["fix", f"{Path(__file__).parent / 'test_executorch.py'}:outlier_net", "--input", "1x3x16x16", "--to",
                 "int8", "--runtime", "litert", "-o", str(out), "--target", "sqnr:30", "--samples", "4",
                 "--config-out", str(cfg), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["metric"] >= 30 and 0 < len(report["kept"]) <= 3
    assert report["rows"][0]["metric"] < 30  # the plain int8 program misses it
    recipe = json.loads((cfg / "ai_edge_quantizer_recipe.json").read_text())
    assert [e["algorithm_key"] for e in recipe[1:]] == ["no_quantize"] * len(report["kept"])
    assert json.loads(Path(str(out) + ".aeq.json").read_text()) == recipe
    # the kept set, run again in LiteRT: the target holds there
    model, x = outlier_net(), torch.randn(1, 3, 16, 16)
    got = lt.run(out, [x.numpy()])["output"]
    want = model(x).detach().numpy()
    assert 10 * np.log10((want ** 2).sum() / ((want - got) ** 2).sum()) >= 30


def _taps_equal_forward_hooks(model, x, path, taps):
    """The program's taps, run in LiteRT's interpreter, against forward hooks on the model (within float32's
    rounding of sums as long as a 512-tap convolution's, relative to each tensor's largest value)."""
    values = lt.run(path, [x.numpy()])
    with lt.tap(model, taps) as hooked, torch.no_grad():
        want = model(x)
    assert list(hooked.outputs) == list(values)[1:]
    for name, t in {"output": want, **hooked.outputs}.items():
        np.testing.assert_allclose(values[name], t.numpy(), rtol=1e-4, atol=1e-5 * float(t.abs().max()), err_msg=name)


def test_timm_model_taps_and_module_rows_in_litert(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", pretrained=False).eval()
    with torch.no_grad():  # BatchNorms as trained ones are: timm zeroes each block's last, and the converter would drop the branch
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.1, 0.1), bn.running_var.uniform_(0.5, 1.5)
            bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-0.1, 0.1)
    x, path, taps = torch.randn(1, 3, 64, 64), tmp_path / "r10t.tflite", ["layer1", "layer2.0.act1", "fc:input"]
    assert lt.export(model, x, path, taps=taps).ok
    _taps_equal_forward_hooks(model, x, path, taps)
    report = lt.compare(model, x, path)
    assert report.ok and sum(r.status == "pass" for r in report.rows) > 60
    # every weight inside the program is the model's; those with a BatchNorm folded in, through the fold
    assert report.summary()["weights"] == {"matched": 44, "compared_anyway": False, "differing": {}}


def test_trained_crepe_taps_module_rows_and_static_int8_in_litert(tmp_path):
    import _trained

    model = _trained.crepe_tiny()  # skipped without the trained weights (make install)
    frames, taps = torch.from_numpy(_trained.tone_frames(1)), ["conv1", "conv3_BN", "classifier"]
    path = tmp_path / "crepe.tflite"
    assert lt.export(model, frames, path, taps=taps).ok
    _taps_equal_forward_hooks(model, frames, path, taps)
    report = lt.compare(model, frames, path)
    assert report.ok and [r.name for r in report.rows][:3] == ["conv1", "conv1_BN", "conv2"]
    assert report.summary()["weights"]["differing"] == {}
    calibration = [(torch.from_numpy(_trained.tone_frames(1, seed=100 + i)),) for i in range(4)]
    int8 = tmp_path / "crepe-int8.tflite"
    assert lt.export(model, frames, int8, export_options=ExportOptions(quantize="int8", calibration=calibration)).ok
    report = lt.compare(model, frames, int8)
    assert report.ok and report.precision == "int8" and report.first_divergence is None
    assert all(r.format_rel is not None for r in report.rows if r.status == "pass")
    # int8 weights (a standalone BatchNorm's weight and bias among them) within half a step of their scales
    assert report.summary()["weights"] == {"matched": 26, "compared_anyway": False, "differing": {}}


def test_extract_over_a_dataset_runs_the_program_in_litert(net_program, tmp_path):
    model, x, path, _ = net_program
    data = tmp_path / "data"
    data.mkdir()
    xs = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    for i, sample in enumerate(xs):
        np.save(data / f"s{i:02d}.npy", sample)
    assert main(["extract", str(path), "--tap", "conv1", "--tap", "fc:input", "--data", str(data), "-o",
                 str(tmp_path / "feats")]) == 0
    feats = lt.load_features(tmp_path / "feats")
    with lt.tap(model, ["conv1", "fc:input"]) as taps:
        model(torch.from_numpy(xs))
    for name in ("conv1", "fc:input"):
        np.testing.assert_allclose(np.asarray(feats[name]), taps[name].numpy(), rtol=1e-4, atol=1e-5)
