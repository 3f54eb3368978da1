"""The PyTorch commands as users run them: ``python -m layertap layers|extract|demo``."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from conftest import run_cli

torch = pytest.importorskip("torch")

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = nn.Linear(4, 8)
            self.act = nn.ReLU()
            self.b = nn.Linear(8, 2)

        def forward(self, x):
            return self.b(self.act(self.act(self.a(x))))
    """
)


@pytest.fixture(scope="module")
def net_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "net.py"
    path.write_text(MODEL_FILE)
    return path


def assert_user_error(proc, fragment: str) -> None:
    """Exit 2, exactly one line 'layertap: error: ...' on stderr, no traceback."""
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("layertap: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_layers_resnet18_table_and_json():
    proc = run_cli("layers", "torchvision:resnet18", "--input", "1x3x32x32")
    assert proc.returncode == 0, proc.stderr
    assert "layer2.0.relu#1" in proc.stdout and "1x128x4x4" in proc.stdout
    proc = run_cli("layers", "torchvision:resnet18", "--input", "1x3x32x32", "--json")
    rows = {r["name"]: r for r in json.loads(proc.stdout)["rows"]}
    assert rows["layer4.0.conv1"]["shapes"] == [[1, 512, 1, 1]] and rows["layer1.0.relu#1"]["calls"] == 2


def test_layers_user_file_without_inputs_lists_modules(net_file):
    proc = run_cli("layers", f"{net_file}:Net", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [r["name"] for r in data["rows"]] == ["", "a", "act", "b"]
    assert all(r["shapes"] is None for r in data["rows"])
    proc = run_cli("layers", f"{net_file}:Net", "--input", "3x4", "--json")
    assert [r["name"] for r in json.loads(proc.stdout)["rows"]] == ["", "a", "act#0", "act#1", "b"]


def test_extract_npz_matches_a_manual_reference(net_file, tmp_path):
    out = tmp_path / "acts.npz"
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = run_cli("extract", f"{net_file}:Net", "--tap", "a", "--tap", "act#1", "--tap", "h=b:input",
                   "--input", str(tmp_path / "x.npy"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 4 array(s) to {out}" in proc.stderr
    import importlib.util

    spec = importlib.util.spec_from_file_location("net_ref", net_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    net = mod.Net()
    with torch.no_grad():
        a = torch.nn.functional.linear(torch.from_numpy(x), net.a.weight, net.a.bias)
        h = torch.relu(a)
        y = torch.nn.functional.linear(h, net.b.weight, net.b.bias)
    with np.load(out) as saved:
        assert saved.files == ["a", "act#1", "h", "output"]
        np.testing.assert_allclose(saved["a"], a.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(saved["act#1"], h.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(saved["h"], h.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(saved["output"], y.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stop_early", [[], ["--stop-early"]])
def test_extract_root_tap_is_the_model_result_saved_once(net_file, tmp_path, capsys, stop_early):
    from layertap.cli.main import main

    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "acts.npz"
    argv = ["extract", f"{net_file}:Net", "--tap", "", "--tap", "a", "--input", str(tmp_path / "x.npy"), "-o", str(out)]
    assert main(argv + stop_early) == 0
    capsys.readouterr()
    import importlib.util

    spec = importlib.util.spec_from_file_location("net_root", net_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with torch.no_grad():
        y = mod.Net()(torch.from_numpy(x)).numpy()
    with np.load(out) as saved:
        assert saved.files == ["a", "output"]
        np.testing.assert_allclose(saved["output"], y, rtol=1e-5, atol=1e-6)


def test_extract_resnet18_safetensors_stop_early(resnet18, tmp_path):
    from safetensors.numpy import load_file

    from layertap.pytorch.example_inputs import make_inputs
    from layertap.pytorch.models import load_model

    out = tmp_path / "acts.safetensors"
    proc = run_cli("extract", "torchvision:resnet18", "--tap", "layer4.0.conv1", "--tap", "layer2.0.relu#1",
                   "--input", "1x3x64x64", "--seed", "3", "--stop-early", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    saved = load_file(str(out))
    assert sorted(saved) == ["layer2.0.relu#1", "layer4.0.conv1"]  # stopped: no output
    # same model and inputs in-process; layer4.0.conv1 computed by hand from layer4's input
    model, info = load_model("torchvision:resnet18")
    from layertap.inputs import InputSpec

    args, _ = make_inputs(info, [InputSpec.parse("1x3x64x64")], seed=3)
    import layertap as lt

    x4 = lt.extract(model, *args, taps=["layer4:input"])["layer4:input"]
    with torch.no_grad():
        ref = model.layer4[0].conv1(x4)
    np.testing.assert_allclose(saved["layer4.0.conv1"], ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--tap", "layer4.0.conv"], "unknown module 'layer4.0.conv'; did you mean: layer4.0.conv2, layer4.0.conv1"),
        (["--tap", "layer2.0.relu#2"], "module 'layer2.0.relu' ran 2 times"),
        (["--tap", "layer2.0.relu#x"], "bad tap 'layer2.0.relu#x'"),
        (["--tap", "layer1", "--input", "1x3xfoo"], "bad --input '1x3xfoo'"),
        (["--tap", "layer1", "--input", "1x4x32x32"], "torchvision:resnet18 expects an input like 1x3x224x224 float32 "
         "(its default), got 1x4x32x32 float32: forward() failed with RuntimeError: "),
        (["--tap", "layer1", "--input", "1x3x224"], "torchvision:resnet18 expects an input like 1x3x224x224 float32 "
         "(its default), got 1x3x224 float32: forward() failed with RuntimeError: Given groups=1"),
        (["--tap", "layer1", "--input", "1x3x224"], "; pass --input 1x3x224x224, or no --input for the default"),
    ],
)
def test_extract_errors_write_nothing(tmp_path, argv, fragment):
    out = tmp_path / "acts.npz"
    if "--input" not in argv:
        argv += ["--input", "1x3x32x32"]
    proc = run_cli("extract", "torchvision:resnet18", *argv, "-o", str(out))
    assert_user_error(proc, fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "model, extra, fragment",
    [
        ("torchvision:resnt18", [], "unknown torchvision model 'resnt18'; did you mean: resnet18"),
        ("not_a_pkg_qq.mod:Net", [], "cannot import 'not_a_pkg_qq.mod'"),
        ("NET_FILE:Nett", [], "did you mean: Net"),
        ("NET_FILE:Net", ["--weights", "WEIGHTS"], "1 unexpected key: extra"),
        ("NET_FILE:Net", ["--tap", "a", "-o", "/nonexistent-dir/x.npz"], "output folder '/nonexistent-dir' does not exist"),
    ],
)
def test_model_and_output_errors(net_file, tmp_path, model, extra, fragment):
    weights = tmp_path / "w.pt"
    torch.save({"a.weight": torch.zeros(8, 4), "a.bias": torch.zeros(8), "b.weight": torch.zeros(2, 8),
                "b.bias": torch.zeros(2), "extra": torch.zeros(1)}, weights)
    model = model.replace("NET_FILE", str(net_file))
    extra = [str(weights) if e == "WEIGHTS" else e for e in extra]
    argv = ["extract", model, *extra]
    if "--tap" not in extra:
        argv += ["--tap", "a"]
    if "-o" not in extra:
        argv += ["-o", str(tmp_path / "out.npz")]
    proc = run_cli(*argv, "--input", "1x4")
    assert_user_error(proc, fragment)
    assert not (tmp_path / "out.npz").exists()


def test_layers_on_onnx_never_imports_torch(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from layertap.cli.main import main\n"
        f"rc = main(['layers', {str(tmp_path / 'missing.onnx')!r}])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["NO-TORCH", "2"], proc.stdout + proc.stderr
    assert proc.stderr.startswith("layertap: error: ")


def test_demo_runs_end_to_end(tmp_path):
    out_dir = tmp_path / "new" / "demo"  # --out creates the folder
    proc = run_cli("demo", "--out", str(out_dir))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    written = {p.name for p in out_dir.iterdir()}
    assert {"resnet18_taps.npz", "resnet18_taps.onnx", "plain_tapped.onnx", "compare_broken.png"} <= written
    assert "first divergence: layer3.0.bn1" in out and "(exit status 1)" in out
    # the summary says where the broken conv went, and no ORT-optimisation hint for a 100x error
    words = " ".join(out.split())  # the summary line may wrap
    assert "layer3.0.conv1 was fused into layer3.0.bn1 in the ONNX graph" in words and "--no-ort-opt" not in out
    assert "all 5 outputs match PyTorch" in out
    assert "layer2.0.relu#1" in out and "layer4.0.conv1" in out
    assert "equals conv1 applied by hand to layer4's input: True" in out
    assert "medians of 7 interleaved runs after a warm-up" in out
    with np.load(out_dir / "resnet18_taps.npz") as saved:
        assert {"layer1", "layer2.0.relu#1", "layer4.0.conv1", "pooled", "output"} == set(saved.files)
    # What follows a "$ layertap ..." line is what that command prints.
    for argv in (["run", "plain_tapped.onnx"], ["add-outputs", "plain.onnx", "-o", "again.onnx", "--module", "layer3.1"]):
        shown = _shown_after(out, "$ layertap " + " ".join(argv[:2]))
        real = run_cli(*argv, cwd=str(out_dir))
        assert real.returncode == 0, real.stderr
        assert shown == (real.stdout + real.stderr).replace("again.onnx", "plain_tapped.onnx").splitlines()
    rules = [line for line in out.splitlines() if "───" in line and not set(line) & set("┏┡└┃│┌├┐┘")]
    assert len(rules) >= 7 and all(len(line) <= 80 for line in rules)  # piped: no 200-character rules


def _shown_after(out: str, prefix: str) -> list[str]:
    """The demo's lines after the command line starting with ``prefix``, up to the next command/rule."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(prefix)) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(("$ ", ">>> ", "─"))
                or lines[i][:3].strip().rstrip(".").isdigit()), len(lines))
    return lines[start:end]


def test_demo_removes_its_temporary_folder_unless_kept(monkeypatch, capsys, tmp_path):
    from layertap.cli.main import main
    from layertap.cli.tools import demo

    def step(ctx):
        (ctx.workdir / "f.txt").write_text("x")
        ctx.written.append(ctx.workdir / "f.txt")

    monkeypatch.setattr(demo, "STEPS", [step])
    monkeypatch.setattr(demo.tempfile, "tempdir", str(tmp_path))
    assert main(["demo"]) == 0
    assert "removed the temporary folder" in capsys.readouterr().out and not list(tmp_path.iterdir())
    assert main(["demo", "--keep"]) == 0
    assert "files written to" in capsys.readouterr().out
    [kept] = list(tmp_path.iterdir())
    assert (kept / "f.txt").is_file()
