"""``layertap repro``: a minimal package that reproduces one module call's mismatch.

Real files from both exporters, a float16 conversion (onnxconverter-common) and a QDQ
quantisation (onnxruntime.quantization); each package's ``repro.py`` is run in a fresh
interpreter the way a bug report's reader runs it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import layertap as lt  # noqa: E402
from conftest import run_cli  # noqa: E402
from layertap.errors import LayertapError  # noqa: E402

EXPORTERS = ["dynamo", "torchscript"]


def _conv_net(torch_mod):
    """Conv-BN-ReLU, then a second Conv through the same ReLU (``act`` runs twice)."""
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.act = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
            self.conv2, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 4)

        def forward(self, x):
            x = self.act(self.bn(self.conv(x)))
            return self.fc(self.act(self.conv2(x)).mean((2, 3)))

    torch_mod.manual_seed(0)
    return Net().eval()


@pytest.fixture(scope="module")
def files(torch_mod, tmp_path_factory):
    """Per exporter: the overflowing Linear model's float32 and float16 files; the conv net's float and QDQ files."""
    from onnxconverter_common import float16
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    d = tmp_path_factory.mktemp("repro")
    torch_mod.manual_seed(0)
    lin = torch_mod.nn.Sequential(torch_mod.nn.Linear(32, 32), torch_mod.nn.LayerNorm(32)).eval()
    with torch_mod.no_grad():
        lin[0].weight.mul_(3e5)  # its output leaves float16's range
    xl = torch_mod.randn(2, 32)
    net, xc = _conv_net(torch_mod), torch_mod.randn(1, 3, 8, 8)
    rng = np.random.default_rng(0)
    calib = [xc.numpy()] + [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(3)]
    reader = type("Reader", (CalibrationDataReader,), {"get_next": lambda self: next(self.it, None)})
    out = {}
    for exporter in EXPORTERS:
        f32, f16 = d / f"{exporter}-lin.onnx", d / f"{exporter}-lin16.onnx"
        torch_mod.onnx.export(lin, (xl,), str(f32), dynamo=exporter == "dynamo", input_names=["x"])
        onnx.save(float16.convert_float_to_float16(onnx.load(str(f32)), keep_io_types=True), str(f16))
        fc, q = d / f"{exporter}-net.onnx", d / f"{exporter}-net-int8.onnx"
        torch_mod.onnx.export(net, (xc,), str(fc), dynamo=exporter == "dynamo", input_names=["x"])
        data = reader()
        data.it = iter([{"x": a} for a in calib])
        quantize_static(str(fc), str(q), data, quant_format=QuantFormat.QDQ)
        out[exporter] = dict(f32=f32, f16=f16, net=fc, q=q)
    return out, lin, xl, net, xc.numpy()


def _fresh_run(folder: Path) -> subprocess.CompletedProcess:
    """``python repro.py`` in a fresh interpreter, the package its only folder."""
    return subprocess.run([sys.executable, "-I", "repro.py"], cwd=folder, capture_output=True, text=True, timeout=300)


def _cli_no_torch(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess that reports whether torch was imported."""
    code = ("import sys; from layertap.cli.main import main; rc = main(sys.argv[1:]); "
            "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules)); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def _imports(script: Path) -> set[str]:
    tree = ast.parse(script.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_repro_pytorch_vs_float16_reproduces_the_overflow(files, exporter, torch_mod, tmp_path):
    f, lin, x, _, _ = files
    report = lt.repro(lin, x, f[exporter]["f16"], out=tmp_path / "pkg")
    pkg = tmp_path / "pkg"
    assert report.module == "0" and report.reproduced and report.error > 1, report
    assert set(report.files) == {"README.md", "cand.onnx", "cand.onnx.data", "expected.npz", "inputs.npz", "repro.py"}
    with np.load(pkg / "inputs.npz") as inputs, np.load(pkg / "expected.npz") as expected:
        (fed,), (want,) = inputs.values(), expected.values()
        np.testing.assert_array_equal(fed, x.numpy())  # the reference's input, in its own type
        with torch_mod.no_grad():
            np.testing.assert_allclose(want, lin[0](x).numpy(), rtol=1e-6)
    part = onnx.load(str(pkg / "cand.onnx"), load_external_data=False)
    assert {n.op_type for n in part.graph.node} & {"Gemm", "MatMul"} and "LayerNormalization" not in {
        n.op_type for n in part.graph.node}
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in part.graph.initializer if t.name.endswith("weight"))
    run = _fresh_run(pkg)
    assert run.returncode == 1 and "mismatch: worst rel error inf" in run.stdout, run.stdout + run.stderr
    assert _imports(pkg / "repro.py") == {"sys", "numpy", "onnx", "onnxruntime"}
    readme = (pkg / "README.md").read_text()
    assert "lt.repro(" in readme and "onnxruntime " in readme and "torch " in readme and "mismatch:" in readme
    assert json.loads((pkg / "repro.json").read_text())["reproduced"] is True
    files_only = lt.repro(f[exporter]["f32"], {"x": x.numpy()}, f[exporter]["f16"], out=tmp_path / "pkg")
    assert files_only.module == "0" and files_only.reproduced and files_only.ref_error < 1e-6, files_only
    assert "ref.onnx" in files_only.files and "Sequential" not in (pkg / "README.md").read_text()  # replaced


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_repro_file_vs_qdq_packages_both_parts(files, exporter, tmp_path):
    """A second call (``act#1``): the QDQ part and the float part, fed the same values; the float
    part gives expected.npz; the first divergence is the BatchNorm the Conv was folded into."""
    import onnxruntime as ort

    f, _, _, _, x = files
    before = [p.read_bytes() for p in (f[exporter]["net"], f[exporter]["q"])]
    # a fixed tolerance (rtol 1e-3): int8's own rounding exceeds it, which this package reproduces
    report = lt.repro(f[exporter]["net"], {"x": x}, f[exporter]["q"], out=tmp_path / "pkg", module="act#1", rtol=1e-3)
    assert [p.read_bytes() for p in (f[exporter]["net"], f[exporter]["q"])] == before  # inputs never modified
    pkg = tmp_path / "pkg"
    assert report.module == "act#1" and report.reproduced and report.ref_error < 1e-6, report
    assert {"cand.onnx", "ref.onnx", "inputs.npz", "expected.npz"} <= set(report.files)
    ops = {n.op_type for n in onnx.load(str(pkg / "cand.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops  # the float value enters the candidate's quantizer
    with np.load(pkg / "inputs.npz") as inputs, np.load(pkg / "expected.npz") as expected:
        feed, want = dict(inputs), dict(expected)
    sess = ort.InferenceSession(str(pkg / "ref.onnx"))
    got = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0]
    np.testing.assert_allclose(got, next(iter(want.values())), rtol=1e-6, atol=1e-6)
    run = _fresh_run(pkg)
    assert run.returncode == 1 and "MISMATCH" in run.stdout, run.stdout + run.stderr
    first = lt.repro(f[exporter]["net"], {"x": x}, f[exporter]["q"], out=tmp_path / "pkg", rtol=1e-3)
    assert first.module == "bn" and first.reproduced, first


def test_repro_cli_bad_module_exits_2(files, tmp_path):
    f = files[0]["torchscript"]
    for module, words in (("actt", "unknown module 'actt'; did you mean: act"),
                          ("conv", "absorbed into bn"), ("act#5", "ran 2 time(s)"),
                          ("act#x", "is not PATH or PATH#CALL")):
        r = run_cli("repro", str(f["net"]), str(f["q"]), "-o", str(tmp_path / "pkg"), "--module", module)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, (module, r.stderr)
    assert not (tmp_path / "pkg").exists()


def test_repro_cli_replaces_only_a_previous_package(files, tmp_path):
    f = files[0]["torchscript"]
    pkg = tmp_path / "pkg"
    args = ["repro", str(f["net"]), str(f["q"]), "-o", str(pkg), "--rtol", "1e-3"]  # int8 exceeds a fixed tolerance
    first = _cli_no_torch(*args)  # an ONNX reference: torch is never imported
    assert first.returncode == 0 and "wrote" in first.stdout and "bn alone" in first.stdout, first.stdout + first.stderr
    assert "TORCH=False" in first.stderr
    again = run_cli(*args, "--module", "fc")
    assert again.returncode == 0 and json.loads((pkg / "repro.json").read_text())["module"] == "fc"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    refused = run_cli("repro", str(f["net"]), str(f["q"]), "-o", str(mine))
    assert refused.returncode == 2 and "not a repro package" in refused.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_repro_that_does_not_reproduce_is_kept_and_marked(files, tmp_path):
    """A ReLU's own QDQ error is within a loose tolerance: exit 1, the package kept and marked."""
    f = files[0]["dynamo"]
    pkg = tmp_path / "pkg"
    r = run_cli("repro", str(f["net"]), str(f["q"]), "-o", "pkg", "--module", "act#1", "--rtol", "0.5", cwd=str(tmp_path))
    assert r.returncode == 1 and "does not reproduce" in r.stdout, r.stdout + r.stderr
    assert "package kept in pkg," in r.stdout and max(map(len, r.stdout.splitlines())) <= 80, r.stdout
    assert "Does not reproduce" in (pkg / "README.md").read_text()
    assert json.loads((pkg / "repro.json").read_text())["reproduced"] is False
    assert _fresh_run(pkg).returncode == 0


def test_repro_unknown_module_of_a_file_path_fails_before_any_run(files, tmp_path):
    """Files passed as paths: their module scopes are read first, so nothing runs for a typo."""
    f, _, _, _, x = files
    steps = []
    recorder = type("Recorder", (), {"__getattr__": lambda self, name: lambda *a, **k: steps.append(name)})()
    with pytest.raises(LayertapError, match=r"unknown module 'actt'; did you mean: act"), lt.reporting(recorder):
        lt.repro(str(f["dynamo"]["net"]), {"x": x}, str(f["dynamo"]["q"]), out=tmp_path / "pkg", module="actt")
    assert steps == [] and not (tmp_path / "pkg").exists()


def test_repro_of_several_samples_packages_the_worst_one(files, tmp_path):
    """Of three samples the second saturates the int8 quantiser: it is the one packaged, and named."""
    f, _, _, _, x = files
    rng = np.random.default_rng(1)
    samples = np.stack([x, 30 * rng.standard_normal(x.shape, dtype=np.float32), rng.standard_normal(x.shape, dtype=np.float32)])
    np.savez(tmp_path / "xs.npz", x=samples)
    pkg = tmp_path / "pkg"
    r = run_cli("repro", str(f["torchscript"]["net"]), str(f["torchscript"]["q"]), "-o", str(pkg), "--inputs",
                str(tmp_path / "xs.npz"), "--module", "act#1")
    assert r.returncode == 0 and "sample 1 packaged" in r.stdout, r.stdout + r.stderr
    record = json.loads((pkg / "repro.json").read_text())
    assert (record["sample"], record["samples"]) == (1, 3) and record["error"] > 0.5, record
    assert "Sample 1 of the 3 given" in (pkg / "README.md").read_text()
    one = lt.repro(f["torchscript"]["net"], {"x": samples[0]}, f["torchscript"]["q"], out=tmp_path / "one",
                   module="act#1")
    assert one.sample is None and one.error < record["error"] / 10, one


def test_fix_and_repro_help_read_whole_at_80_columns(monkeypatch):
    """No help line past 80 columns, no word broken at a hyphen, each command one or two lines in the list."""
    from layertap.cli.main import build_parser

    monkeypatch.setenv("COLUMNS", "80")
    parser, _ = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    listing = parser.format_help()
    for name in ("fix", "repro"):
        text = sub.choices[name].format_help()
        assert all(len(line) <= 80 and not line.endswith("-") for line in text.splitlines()), text
        assert "Exit 0" in text and "2: bad input" in text
        lines = listing.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(f"    {name} "))
        more = next(k for k, line in enumerate(lines[at + 1:]) if not line.startswith("      "))
        assert more <= 1, listing  # at most one continuation line
    repro_help = sub.choices["repro"].format_help()
    assert "max|cand-ref|" in repro_help and "onnx-torch" not in repro_help
