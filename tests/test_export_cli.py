"""``layertap export`` as users run it: exit codes, one-line errors, no partial files."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import onnxruntime as ort
import pytest

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    def small():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()

    class BakesBatch(nn.Module):
        # the batch size as a Python number: traced as a constant
        def forward(self, x):
            return x * float(x.shape[0])

    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            return y * 2 if y.sum() > 0 else y
    """
)


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    out = tmp_path / "out"
    out.mkdir()
    return path, out


def test_cli_export_ok_json(cli, models):
    src, out = models
    target = out / "m.onnx"
    r = cli("export", f"{src}:small", "-o", str(target), "--tap", "1", "--tap", "h=0:input",
            "--input", "2x4", "--exporter", "torchscript", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is True and data["exporter"] == "torchscript"
    assert [row["name"] for row in data["rows"]] == ["output", "1", "h"]
    assert all(row["ok"] for row in data["rows"])
    assert os.listdir(out) == ["m.onnx"]
    sess = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out_val, relu, h = sess.run(["output", "1", "h"], {"input": x})
    np.testing.assert_array_equal(h, x)
    assert out_val.shape == (5, 3) and relu.shape == (5, 8) and (relu >= 0).all()


def test_cli_export_verification_failure_exits_1(cli, models):
    src, out = models
    r = cli("export", f"{src}:BakesBatch", "-o", str(out / "b.onnx"), "--input", "2x3", "--exporter", "torchscript")
    assert r.returncode == 1, r.stderr
    assert "FAIL" in r.stdout
    assert os.listdir(out) == ["b.onnx"]  # written, for inspection


def test_cli_export_impossible_tolerance_exits_1(cli, models):
    src, out = models
    r = cli("export", f"{src}:small", "-o", str(out / "t.onnx"), "--input", "2x4", "--exporter", "torchscript",
            "--rtol", "0", "--atol", "0", "--tap", "0", "--json")
    data = json.loads(r.stdout)
    # exact equality may hold for some outputs; when any differs the exit is 1
    assert r.returncode == (0 if data["ok"] else 1)
    assert data["rtol"] == 0 and data["atol"] == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tap", "3"], "unknown module '3'"),
        (["--tap", "0#x"], "must be an integer"),
        (["--input", "2xq"], "bad --input"),
        (["--rtol", "-1"], "expected a number >= 0"),
        (["--input", "2x5"], ":small.forward(2x5 float32) failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    ],
)
def test_cli_export_bad_input_exits_2(cli, models, args, needle):
    src, out = models
    base = ["--input", "2x4"] if "--input" not in args else []
    r = cli("export", f"{src}:small", "-o", str(out / "e.onnx"), "--exporter", "torchscript", *base, *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("layertap: error:") and needle in lines[0], r.stderr
    assert os.listdir(out) == []


def test_cli_dynamo_failure_exits_2_then_fallback(cli, models):
    src, out = models
    r = cli("export", f"{src}:DataDependent", "-o", str(out / "d.onnx"), "--input", "2x4")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--exporter torchscript" in lines[0], r.stderr
    assert os.listdir(out) == []  # no partial file, no temp folder
    r = cli("export", f"{src}:DataDependent", "-o", str(out / "d.onnx"), "--input", "2x4", "--fallback", "--json")
    data = json.loads(r.stdout)
    assert data["exporter"] == "torchscript" and any("fell back" in n for n in data["notes"])
    assert os.listdir(out) == ["d.onnx"]


def test_cli_exporter_failure_keeps_stdout_clean(cli, models):
    """The TorchScript exporter dumps its graph on C++ stdout when it fails; --json must stay parseable."""
    src, out = models
    src.write_text(src.read_text() + textwrap.dedent(
        """
        class Diff(nn.Module):
            def forward(self, x):
                return torch.diff(x, dim=1)
        """
    ))
    r = cli("export", f"{src}:Diff", "-o", str(out / "d.onnx"), "--input", "2x4", "--exporter", "torchscript", "--json")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "aten::diff" in lines[0], r.stderr
    assert os.listdir(out) == []


def test_cli_ort_failure_at_other_batch_exits_1(cli, models):
    src, out = models
    src.write_text(src.read_text() + textwrap.dedent(
        """
        class Baked(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(6, 2)

            def forward(self, x):
                return self.lin(x.reshape(int(x.shape[0]), -1))
        """
    ))
    r = cli("export", f"{src}:Baked", "-o", str(out / "b.onnx"), "--input", "2x3x2", "--exporter", "torchscript")
    assert r.returncode == 1, r.stderr
    assert "ONNX Runtime failed at batch 3" in r.stdout and "onnxruntime" not in r.stderr
    assert os.listdir(out) == ["b.onnx"]
