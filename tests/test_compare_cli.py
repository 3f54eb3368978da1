"""``layertap compare`` on the command line: exit codes, --json, --plot."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import run_cli

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class SmallNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.pool(self.block(self.stem(x))).flatten(1))


    def build():
        torch.manual_seed(0)
        return SmallNet()
    """
)
INPUT = "2x3x16x16"


@pytest.fixture(scope="module")
def cli_files(torch_mod, tmp_path_factory):
    """A model file, its dynamo export, and a copy with block.0's weights scaled."""
    import onnx
    from onnx import numpy_helper

    from layertap.pytorch.models import load_model

    d = tmp_path_factory.mktemp("cmp_cli")
    model_py = d / "smallnet.py"
    model_py.write_text(MODEL_FILE)
    spec = f"{model_py}:build"
    model, _ = load_model(spec)
    good = d / "small.onnx"
    torch_mod.onnx.export(model, (torch_mod.zeros(2, 3, 16, 16),), str(good), dynamo=True, input_names=["x"])
    proto = onnx.load(str(good))
    init = next(i for i in proto.graph.initializer if i.name == "block.0.weight")
    w = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(w * 1.5, init.name))
    bad = d / "small_bad.onnx"
    onnx.save(proto, str(bad))
    return spec, good, bad


def test_cli_clean_exit0_json_and_plot(cli_files, tmp_path):
    spec, good, _ = cli_files
    plot = tmp_path / "err.png"
    before = good.read_bytes()
    r = run_cli("compare", spec, str(good), "--input", INPUT, "--json", "--plot", str(plot))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is True and data["first_divergence"] is None
    assert [row["name"] for row in data["rows"]][-1] == "output"
    assert {row["status"] for row in data["rows"]} >= {"pass", "absorbed"}
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert good.read_bytes() == before  # the input file is never modified


def test_cli_divergence_exit1_names_module(cli_files, tmp_path):
    spec, _, bad = cli_files
    r = run_cli("compare", spec, str(bad), "--input", INPUT, "--json", "--plot", str(tmp_path / "bad.png"))
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["first_divergence"] == "block.1"
    assert (tmp_path / "bad.png").stat().st_size > 0
    # table form (no --json) names it too
    r = run_cli("compare", spec, str(bad), "--input", INPUT, "--rtol", "1e-3", "--no-ort-opt")
    assert r.returncode == 1
    assert "first divergence: block.1" in r.stdout


def test_cli_bad_input_exit2(cli_files, tmp_path):
    spec, good, _ = cli_files
    r = run_cli("compare", spec, str(tmp_path / "nope.onnx"), "--input", INPUT)
    assert r.returncode == 2 and r.stderr.startswith("layertap: error:") and "nope.onnx" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("compare", spec, str(good), "--input", INPUT, "--plot", str(tmp_path / "no-such-dir" / "p.png"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("compare", spec, str(good), "--input", INPUT, "--module", "blok")
    assert r.returncode == 2 and "did you mean: block" in r.stderr


def test_cli_providers_with_a_pytorch_reference_points_at_cand_providers(cli_files):
    spec, good, _ = cli_files
    r = run_cli("compare", spec, str(good), "--input", INPUT, "--providers", "CUDA")  # CUDA missing or not
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (
        "layertap: error: --providers (providers=) picks the execution providers of an ONNX reference, and REF here "
        "is a PyTorch model; give the candidate's providers with --cand-providers (cand_providers=)")
    r = run_cli("compare", spec, str(good), "--input", INPUT, "--cand-providers", "cpu")
    assert r.returncode == 0, r.stderr
