"""ExecuTorch programs (.pte): export with taps, run, compare module by module, judged at int8, fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("executorch", reason="ExecuTorch is not installed: pip install 'layertap[executorch]'")

import torch
from torch import nn

import layertap as lt
from layertap.cli.main import main
from layertap.options import ExportOptions

sys.path.insert(0, str(Path(__file__).parent))


class SmallNet(nn.Module):
    """Conv-BN-ReLU twice (the second ReLU called twice), pooled, a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.fc(self.pool(x).flatten(1))


def small_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = SmallNet()
    with torch.no_grad():  # non-trivial batch statistics, as a trained net has
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


@pytest.fixture(scope="module")
def net_program(tmp_path_factory):
    """SmallNet exported once to a float32 XNNPACK program with taps."""
    path = tmp_path_factory.mktemp("pte") / "net.pte"
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    report = lt.export(model, x, path, taps=["conv1", "relu", "fc:input"])
    return model, x, path, report


def test_export_taps_equal_forward_hooks_in_executorch(net_program):
    model, x, path, report = net_program
    assert report.ok and [r.name for r in report.rows] == ["output", "conv1", "relu#0", "relu#1", "fc:input"]
    side = json.loads(Path(str(path) + ".json").read_text())
    assert side["recipe"]["backend"] == "xnnpack" and side["inputs"][0]["shape"] == [1, 3, 16, 16]
    values = lt.run(path, [x.numpy()])
    with lt.tap(model, ["conv1", "relu", "fc:input"]) as taps:
        want = model(x)
    assert list(values) == ["output", "conv1", "relu#0", "relu#1", "fc:input"]
    np.testing.assert_allclose(values["output"], want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for name, t in taps.outputs.items():
        np.testing.assert_allclose(values[name], t.numpy(), rtol=1e-4, atol=1e-5)
    assert list(lt.run(path, [x.numpy()], taps=["relu#1"])) == ["output", "relu#1"]


def test_cli_export_and_run_pte(tmp_path, capsys):
    out = tmp_path / "r18.pte"
    code = main(["export", "torchvision:resnet18", "--input", "1x3x32x32", "-o", str(out), "--tap", "layer1",
                 "--tap", "layer2.0.conv1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["name"] for r in report["rows"]] == ["output", "layer1", "layer2.0.conv1"]
    npz = tmp_path / "acts.npz"
    assert main(["run", str(out), "--tap", "layer1", "-o", str(npz)]) == 0
    assert sorted(np.load(npz).files) == ["layer1", "output"]
    assert main(["run", str(out), "--tap", "layer9"]) == 2
    assert "unknown tap 'layer9'" in capsys.readouterr().err


def test_program_from_elsewhere_names_outputs_by_position(tmp_path):
    from executorch.exir import to_edge_transform_and_lower

    m = nn.Sequential(nn.Linear(4, 3)).eval()
    ep = torch.export.export(m, (torch.randn(2, 4),))
    path = tmp_path / "other.pte"
    path.write_bytes(to_edge_transform_and_lower(ep).to_executorch().buffer)
    values = lt.run(path)
    assert list(values) == ["output"] and values["output"].shape == (2, 3)


def test_export_options_are_checked(tmp_path, capsys):
    assert main(["export", "torchvision:resnet18", "--input", "1x3x32x32", "-o", str(tmp_path / "m.onnx"),
                 "--quantize", "int8"]) == 2
    assert "applies to ExecuTorch programs" in capsys.readouterr().err
    with pytest.raises(lt.LayertapError, match="unknown backend 'coreml'"):
        lt.export(small_net(), torch.randn(1, 3, 8, 8), tmp_path / "m.pte", export_options=ExportOptions(backend="coreml"))
    assert not (tmp_path / "m.pte").exists()


def test_compare_faithful_program_passes_with_every_module_row(net_program):
    model, x, path, _ = net_program
    report = lt.compare(model, x, path, samples=2)
    assert report.ok and report.first_divergence is None
    assert [r.name for r in report.rows] == ["conv1", "bn1", "relu#0", "conv2", "bn2", "relu#1", "pool", "fc",
                                               "output"]
    assert all(r.status == "pass" for r in report.rows)
    assert any("tapped program's outputs" in n or "tapping changed nothing" in n for n in report.notes)


@pytest.fixture
def faulty_lowering(monkeypatch):
    """A lowering that breaks conv2 (its output scaled by 1.05 in the program), as a faulty toolchain would."""
    import layertap.exporting.program as exporting
    import layertap.pytorch.lowering as lowering

    real = lowering.lower

    def broken(module, example, recipe):
        handle = module.model.conv2.register_forward_hook(lambda m, i, o: o * 1.05)
        try:
            return real(module, example, recipe)
        finally:
            handle.remove()

    monkeypatch.setattr(lowering, "lower", broken)
    monkeypatch.setattr(exporting, "lower", broken)


def test_fault_in_one_module_is_found_at_that_module(tmp_path, faulty_lowering):
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    path = tmp_path / "bad.pte"
    assert not lt.export(model, x, path).ok  # the check sees it at the output
    report = lt.compare(model, x, path)
    assert not report.ok and report.first_divergence == "conv2"
    assert [r.status for r in report.rows[:3]] == ["pass", "pass", "pass"]


def test_program_from_elsewhere_compares_its_outputs_only(tmp_path):
    from executorch.exir import to_edge_transform_and_lower

    model, x = small_net(), torch.randn(1, 3, 16, 16)
    path = tmp_path / "plain.pte"
    path.write_bytes(to_edge_transform_and_lower(torch.export.export(model, (x,))).to_executorch().buffer)
    report = lt.compare(model, x, path)
    assert report.ok and [r.status for r in report.rows if r.status == "pass"] == ["pass"]
    assert any("only its outputs are compared" in n for n in report.notes)


def test_cli_compare_pte(net_program, capsys):
    _, _, path, _ = net_program
    code = main(["compare", f"{Path(__file__)}:small_net", str(path), "--input", "1x3x16x16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] and len(out["rows"]) == 9
    samples = path.parent / "samples.npz"
    np.savez(samples, x=np.random.default_rng(0).standard_normal((3, 1, 3, 16, 16)).astype(np.float32))
    code = main(["compare", f"{Path(__file__)}:small_net", str(path), "--inputs", str(samples), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] and out["samples"] == 3


@pytest.fixture(scope="module")
def int8_program(tmp_path_factory):
    path = tmp_path_factory.mktemp("pte8") / "net-int8.pte"
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    report = lt.export(model, x, path, export_options=ExportOptions(quantize="int8", calibration=8))
    return model, x, path, report


def test_int8_program_is_judged_healthy_at_int8(int8_program):
    model, x, path, export_report = int8_program
    assert export_report.ok and Path(str(path) + ".calib.npz").exists()
    report = lt.compare(model, x, path, samples=2)
    assert report.ok and report.precision == "int8" and report.first_divergence is None
    assert all(r.format_rel is not None for r in report.rows if r.status == "pass")
    # at float32's fixed tolerance the same rows fail: the format, not the program
    assert not lt.compare(model, x, path, rtol=1e-3).ok


@pytest.fixture
def broken_backend(monkeypatch):
    """A toolchain that writes conv2's weight scales 30% too large into the program, while the quantised model
    in PyTorch stays right."""
    import executorch.exir as exir

    real = exir.to_edge_transform_and_lower

    def broken(program, **kwargs):
        sig = program.graph_signature
        lifted = {**sig.inputs_to_lifted_tensor_constants, **sig.inputs_to_buffers, **sig.inputs_to_parameters}
        for node in program.graph_module.graph.nodes:
            stack = node.meta.get("nn_module_stack") or {}
            weight = node.args[1] if node.target == torch.ops.aten.conv2d.default else None
            if weight is not None and "dequantize_per_channel" in str(weight.target) and \
                    any(p == "model.conv2" for p, _ in stack.values()):
                name = lifted[weight.args[1].name]  # the weight's per-channel scales
                table = program.constants if name in program.constants else program.state_dict
                table[name] = table[name] * 1.3  # a new tensor: the quantised model keeps its own
        return real(program, **kwargs)

    monkeypatch.setattr(exir, "to_edge_transform_and_lower", broken)


def test_int8_fault_is_named_at_its_module(tmp_path, broken_backend):
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    path = tmp_path / "bad-int8.pte"
    lt.export(model, x, path, verify=False, export_options=ExportOptions(quantize="int8", calibration=8))
    report = lt.compare(model, x, path)
    # pt2e folds conv2 into bn2: the fault is named at the module holding conv2's value, conv2 absorbed there
    assert not report.ok and report.first_divergence == "bn2"
    assert next(r for r in report.rows if r.name == "conv2").status == "absorbed"
    row = next(r for r in report.rows if r.name == "bn2")
    assert row.impl_rel > 4 * row.format_rel


def outlier_net() -> nn.Module:
    """SmallNet with one conv2 channel 60x the others: per-tensor int8 loses the rest of that tensor."""
    m = small_net()
    with torch.no_grad():
        m.conv2.weight[0] *= 60
    return m


@pytest.mark.slow
def test_fix_meets_its_target_in_executorch(tmp_path, capsys):
    out, cfg = tmp_path / "fixed.pte", tmp_path / "cfg"
    code = main(["fix", f"{Path(__file__)}:outlier_net", "--input", "1x3x16x16", "--to", "int8", "--runtime",
                 "executorch", "-o", str(out), "--target", "sqnr:30", "--samples", "4", "--config-out", str(cfg),
                 "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["metric"] >= 30 and 0 < len(report["kept"]) <= 3
    assert report["rows"][0]["metric"] < 30  # the plain int8 program misses it
    assert json.loads((cfg / "modules.json").read_text()) == report["kept"]
    side = json.loads(Path(str(out) + ".json").read_text())
    assert side["recipe"]["keep_float"] == report["kept"] and side["recipe"]["quantize"] == "int8"
    # the kept set, run again in ExecuTorch: the target holds there
    model, x = outlier_net(), torch.randn(1, 3, 16, 16)
    got = lt.run(out, [x.numpy()])["output"]
    want = model(x).detach().numpy()
    assert 10 * np.log10((want ** 2).sum() / ((want - got) ** 2).sum()) >= 30


def test_trained_crepe_program_passes_and_onet_lowering_failure_names_its_module(tmp_path):
    import _trained

    crepe, frames = _trained.crepe_tiny(), torch.from_numpy(_trained.tone_frames(2))
    path = tmp_path / "crepe.pte"
    assert lt.export(crepe, frames, path).ok
    report = lt.compare(crepe, frames, path)
    assert report.ok and sum(r.ok is not None for r in report.rows) >= 10
    onet, faces = _trained.onet(), torch.from_numpy(_trained.face_crops(1))
    # XNNPACK cannot lower ONet's PReLU after its Linear: one line naming the module and what to try
    with pytest.raises(lt.LayertapError, match=r"at module prelu5 \(PReLU\).*--backend portable"):
        lt.export(onet, faces, tmp_path / "onet.pte")
    assert not (tmp_path / "onet.pte").exists()
    portable = tmp_path / "onet-portable.pte"
    assert lt.export(onet, faces, portable, export_options=ExportOptions(backend="portable")).ok
    assert lt.compare(onet, faces, portable).ok


def test_timm_model_program_compares_every_module(tmp_path):
    timm = pytest.importorskip("timm")
    model, x = timm.create_model("resnet10t").eval(), torch.randn(1, 3, 32, 32)
    path = tmp_path / "r10t.pte"
    assert lt.export(model, x, path, taps=["layer2"]).ok
    report = lt.compare(model, x, path)
    assert report.ok and sum(r.ok is not None for r in report.rows) > 30


def test_pte_without_executorch_names_the_extra(monkeypatch, tmp_path, capsys):
    for name in ("executorch.runtime", "executorch.exir"):
        monkeypatch.setitem(sys.modules, name, None)  # as if ExecuTorch were not installed
    path = tmp_path / "m.pte"
    path.write_bytes(b"\0" * 16)
    assert main(["run", str(path)]) == 2
    assert "pip install 'layertap[executorch]'" in capsys.readouterr().err
    with pytest.raises(lt.LayertapError, match=r"layertap\[executorch\]"):
        lt.export(small_net(), torch.randn(1, 3, 8, 8), tmp_path / "n.pte")


def test_compare_without_inputs_draws_at_the_programs_shapes(net_program):
    """No args, no --input: the samples are drawn at the shapes the program was lowered for (a program's
    shapes are static), not refused or drawn at a zoo's default size."""
    model, _, path, _ = net_program
    report = lt.compare(model, None, path, samples=2)
    assert report.ok and report.samples == 2 and len(report.rows) == 9, report


def test_layers_of_a_program_lists_what_it_hands_out_by_module_path(net_program, tmp_path, capsys):
    model, x, path, _ = net_program
    assert main(["layers", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["name"], r["op"], r["module"], r["call"]) for r in rows] == [
        ("x", "input", None, None), ("output", "output", None, None), ("conv1", "tap", "conv1", 0),
        ("relu#0", "tap", "relu", 0), ("relu#1", "tap", "relu", 1), ("fc:input", "tap", "fc", 0)]
    assert rows[2]["shape"] == [1, 8, 16, 16] and rows[1]["shape"] == [1, 10]
    # a program from elsewhere: its outputs by position, and what gives module rows
    bare = tmp_path / "bare.pte"
    bare.write_bytes(path.read_bytes())
    assert main(["layers", str(bare), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in table["rows"]][:2] == ["input_0", "output_0"] and "layertap export" in table["notes"][0]


class Halves(nn.Module):
    """A module returning a tuple of two tensors of one shape."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.chunk(2, dim=1)
        return a.relu(), b.sigmoid()


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.halves, self.out = nn.Linear(4, 8), Halves(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.halves(self.fc(x))
        return self.out(a * b)


def test_a_module_returning_a_tuple_has_a_row_and_a_wrong_element_is_named(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, x = TupleNet().eval(), torch.randn(2, 4)
    path = tmp_path / "t.pte"
    assert lt.export(model, x, path).ok
    rows = {r.path: r for r in lt.compare(model, x, path, samples=2).rows}
    assert rows["halves"].status == "pass" and len(rows["halves"].onnx) == 2
    # the second element wrong in the program (a faulty lowering of the sigmoid): named at the tuple's module
    import layertap.pytorch.lowering as lowering

    real = lowering.lower

    def broken(module, example, recipe):
        handle = module.model.halves.register_forward_hook(lambda m, i, o: (o[0], o[1] * 1.1))
        try:
            return real(module, example, recipe)
        finally:
            handle.remove()

    monkeypatch.setattr(lowering, "lower", broken)
    report = lt.compare(model, x, path, samples=2)
    assert not report.ok and report.first_divergence == "halves"


def test_a_program_lowered_from_other_weights_is_named_by_the_weight_check(net_program):
    model, x, path, _ = net_program
    assert lt.compare(model, x, path).summary()["weights"]["matched"] == 10
    changed = small_net()
    with torch.no_grad():
        changed.fc.weight[0] *= 3
    report = lt.compare(changed, x, path)
    assert any("1 of 10 matched parameters differ" in n and "fc.weight (rel >= " in n for n in report.notes)
    assert "fc.weight differs" in next(r for r in report.rows if r.path == "fc").weights
    with pytest.raises(lt.LayertapError, match="the program's weights are not the model's: .* 6 of 10 matched"):
        lt.compare(small_net(seed=1), x, path)
    anyway = lt.compare(small_net(seed=1), x, path, criterion=lt.Criterion(allow_different_weights=True))
    assert not anyway.ok and any(n.startswith("compared anyway") for n in anyway.notes)


def test_extract_over_a_dataset_runs_the_program_in_executorch(net_program, tmp_path):
    model, x, path, _ = net_program
    data = tmp_path / "data"
    data.mkdir()
    xs = np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32)
    for i, sample in enumerate(xs):
        np.save(data / f"s{i:02d}.npy", sample)
    assert main(["extract", str(path), "--tap", "conv1", "--tap", "fc:input", "--data", str(data), "-o",
                 str(tmp_path / "feats"), "--batch-size", "2"]) == 0
    feats = lt.load_features(tmp_path / "feats")
    with lt.tap(model, ["conv1", "fc:input"]) as taps:
        model(torch.from_numpy(xs))
    for name in ("conv1", "fc:input"):
        np.testing.assert_allclose(np.asarray(feats[name]), taps[name].numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(lt.LayertapError, match="unknown tap 'layer1'.*layertap layers net.pte"):
        lt.extract_dataset(path, data, taps=["layer1"], out=tmp_path / "bad")


def test_export_reads_its_calibration_samples_from_a_path_as_the_cli_does(tmp_path):
    model, x = small_net(), torch.randn(1, 3, 16, 16)
    samples = np.random.default_rng(0).standard_normal((3, 1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", input_0=samples)
    path = tmp_path / "q.pte"
    report = lt.export(model, x, path, export_options=ExportOptions(quantize="int8", calibration=tmp_path / "calib.npz"))
    assert report.ok
    kept = np.load(str(path) + ".calib.npz")
    assert sorted(kept.files) == ["s0_0", "s1_0", "s2_0"]  # the file's 3 samples, not 16 random ones
    np.testing.assert_array_equal(kept["s1_0"], samples[1])
