"""ExecuTorch programs (.pte): export with taps, run, compare module by module, judged at int8, fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("executorch", reason="ExecuTorch is not installed: pip install 'layertap[executorch]'")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import layertap as lt  # noqa: E402
from layertap.cli.main import main  # noqa: E402
from layertap.options import ExportOptions  # noqa: E402

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
