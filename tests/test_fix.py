"""``layertap fix``: float16 and int8 conversions repaired by keeping the fewest modules in float32,
every set made by the real converters (onnxconverter-common, onnxruntime.quantization) and run in
ONNX Runtime; the toolchain files taken by the tools themselves; compare --fp16-block-list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxconverter_common")


def _overflow_net(torch_mod):
    """A Linear whose float32 output leaves float16's range (weights x3e5), then LayerNorm."""
    nn = torch_mod.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.norm = nn.LayerNorm(32)

        def forward(self, x):
            return self.norm(self.fc(x))

    torch_mod.manual_seed(0)
    net = Net().eval()
    with torch_mod.no_grad():
        net.fc.weight.mul_(3e5)
    return net


@pytest.fixture(scope="module")
def overflow(torch_mod, tmp_path_factory):
    """The overflow model exported by the dynamo exporter, and its plain float16 conversion."""
    from onnxconverter_common import float16

    d = tmp_path_factory.mktemp("overflow")
    fp32 = d / "ov.onnx"
    torch_mod.onnx.export(_overflow_net(torch_mod), (torch_mod.randn(1, 32),), str(fp32), input_names=["x"],
                          output_names=["y"], dynamo=True)
    fp16 = d / "ov16.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
    return fp32, fp16


@pytest.fixture(scope="module")
def cnn(torch_mod, tmp_path_factory):
    """tests/_tiny.py's small CNN (TorchScript export) and a folder of 8 real-shaped samples."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _tiny import small_cnn

    d = tmp_path_factory.mktemp("cnn")
    path = d / "cnn.onnx"
    torch_mod.onnx.export(small_cnn(), (torch_mod.randn(1, 3, 16, 16),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"])
    folder = d / "calib"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(8):
        np.save(folder / f"s{i}.npy", rng.standard_normal((3, 16, 16)).astype(np.float32))
    return path, folder


def _samples(n=4):
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 32)).astype(np.float32)} for _ in range(n)]


def _main(*args):
    from layertap.cli.main import main

    return main([str(a) for a in args])


def _cosine(ref, cand, samples):
    import layertap as lt

    return lt.compare(ref, None, cand, samples=samples, metric="cosine")


def test_fp16_overflow_fixed_and_the_list_verified_by_the_converter(overflow, tmp_path):
    from onnxconverter_common import float16

    import layertap as lt

    fp32, fp16 = overflow
    samples = _samples()
    assert not _cosine(fp32, fp16, samples).ok  # the plain conversion overflows
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    out = tmp_path / "fixed.onnx"
    before = fp32.read_bytes()
    report = lt.fix(fp32, to="fp16", out=out, samples=samples, config_out=cfg)
    assert report.ok and "fc" in report.kept and report.steps[0].metric < 0.5 and report.best.metric > 0.999
    assert fp32.read_bytes() == before
    fixed = _cosine(fp32, out, samples)
    assert fixed.ok, str(fixed)  # every module, not only the output
    assert next(r for r in fixed.rows if r.name == "fc").finite is True
    # the toolchain's own file, from the written options and list, meets the target too
    options = json.loads((cfg / "onnxconverter_common.json").read_text())
    assert options["node_block_list"] == report.nodes and options["keep_io_types"] is True
    own = tmp_path / "own.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), **options), str(own))
    assert _cosine(fp32, own, samples).ok
    assert json.loads((cfg / "modules.json").read_text())["modules"] == report.kept
    assert json.loads((cfg / "ort_quantization.json").read_text())["nodes_to_exclude"] == report.nodes
    assert (cfg / "polygraphy.txt").read_text().count(":float32") == len(report.nodes)
    assert json.loads(report.to_json())["kept"] == report.kept and "<svg" in report._repr_html_()


def test_fp16_prunes_the_readers_of_an_overflowing_value_when_the_target_holds_without_them(torch_mod, tmp_path):
    """amp's values leave float16's range: amp stays in every set; norm (reads them) and head (reads norm,
    whose float16 values are not finite) are kept from the start and dropped only where a real
    conversion still meets the target: norm's drop casts the overflow to float16, head's does not matter."""
    import onnxruntime as ort

    import layertap as lt

    nn = torch_mod.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.amp, self.norm, self.head = nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 8)

        def forward(self, x):
            return self.head(self.norm(self.amp(x)))

    torch_mod.manual_seed(0)
    net = Net().eval()
    with torch_mod.no_grad():
        net.amp.weight.mul_(3e5)
    samples = [s["x"] for s in _samples()]
    out = tmp_path / "fixed.onnx"
    report = lt.fix(net, torch_mod.from_numpy(samples[0]), to="fp16", out=out, samples=samples[1:])
    assert report.ok and report.kept == ["amp", "norm"], report
    dropped = {s.changed[0]: s.ok for s in report.steps if s.action == "drop"}
    assert dropped == {"head": True, "norm": False}, report  # each drop converted and run
    assert any("values beyond float16's range): amp" in n for n in report.notes), report.notes
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for x in samples:
        with torch_mod.no_grad():
            ref = net(torch_mod.from_numpy(x)).numpy().ravel()
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0].ravel()
        assert ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got)) > 0.999


def test_int8_tiny_cnn_calibrated_on_a_folder_and_excluded_nodes_taken_by_quantize_static(cnn, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from layertap.fixing.configs import Target
    from layertap.fixing.search import _run_all
    from layertap.runtimes import open_runtime

    def _session(path):
        return open_runtime("ort").open_file(path, timing=True)

    path, folder = cnn
    cfg = tmp_path / "cfg"  # not there yet: fix makes it
    out, page = tmp_path / "cnn8.onnx", tmp_path / "fix.html"
    target = "cosine:0.99999"  # random weights: plain int8 already gives 0.99998
    rc = _main("fix", path, "--to", "int8", "-o", out, "--calib", folder, "--inputs", folder, "--target", target,
               "--config-out", cfg, "--report", page, "--json")
    assert rc == 0
    excluded = json.loads((cfg / "ort_quantization.json").read_text())["nodes_to_exclude"]
    kept = json.loads((cfg / "modules.json").read_text())["modules"]
    assert excluded and kept and "modules kept in float32" in page.read_text() and "<svg" in page.read_text()
    feeds = [{"x": np.load(f)[None]} for f in sorted(folder.iterdir())]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    own = tmp_path / "own8.onnx"
    quantize_static(str(path), str(own), Reader(), quant_format=QuantFormat.QDQ, nodes_to_exclude=excluded)
    refs = _run_all(_session(path), feeds)
    goal = Target.parse(target)
    assert goal.met(goal.measure(refs, _run_all(_session(own), feeds)))
    assert goal.met(goal.measure(refs, _run_all(_session(out), feeds)))


def test_keep_forces_modules_by_path_and_an_unknown_path_names_close_ones(cnn, tmp_path, capsys):
    import layertap as lt

    path, _ = cnn
    report = lt.fix(path, to="fp16", out=tmp_path / "f.onnx", samples=2, keep=["block.0"])
    assert report.ok and "block.0" in report.kept and any("Conv" in n for n in report.nodes)
    assert report.steps[0].action == "keep"
    rc = _main("fix", path, "--to", "fp16", "-o", tmp_path / "g.onnx", "--keep", "blok.0")
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "unknown module 'blok.0'" in err and "block.0" in err
    assert not (tmp_path / "g.onnx").exists()


def test_unreachable_target_exits_1_with_the_best_set(cnn, tmp_path, capsys):
    path, folder = cnn
    out = tmp_path / "best.onnx"
    rc = _main("fix", path, "--to", "int8", "-o", out, "--inputs", folder, "--target", "sqnr:300", "--max-float", "2")
    captured = capsys.readouterr()
    assert rc == 1 and out.is_file()
    assert "no set within the limit meets target sqnr:300" in captured.out and "best set found" in captured.out
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside the output


def test_calibration_of_the_wrong_shape_is_exit_2_before_any_conversion(cnn, tmp_path, capsys, monkeypatch):
    from layertap.fixing.convert import Converter

    path, _ = cnn
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "s0.npy", np.zeros((3, 8, 8), np.float32))

    def never(*a, **k):
        raise AssertionError("converted before the calibration data was checked")

    monkeypatch.setattr(Converter, "convert", never)
    rc = _main("fix", path, "--to", "int8", "-o", tmp_path / "x.onnx", "--calib", bad)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "--calib sample 0: input 'x' takes 1x3x16x16, got an array of shape 1x3x8x8" in err
    assert not (tmp_path / "x.onnx").exists()


def test_compare_fp16_block_list_now_fixes_the_overflow_model(overflow, tmp_path):
    """Before, the list named the Linear and the LayerNorm and the file converted with it diverged at
    the Linear as the plain one did; now the list comes from converted and verified sets."""
    from onnxconverter_common import float16

    from layertap.fixing.convert import FP16_OPTIONS

    fp32, fp16 = overflow
    folder = tmp_path / "samples"
    folder.mkdir()
    for i, s in enumerate(_samples()):
        np.save(folder / f"s{i}.npy", s["x"])
    out = tmp_path / "block.json"
    code = ("import sys\nfrom layertap.cli.main import main\n"
            f"rc = main(['compare', {str(fp32)!r}, {str(fp16)!r}, '--inputs', {str(folder)!r}, '--metric', 'cosine', "
            f"'--fp16-block-list', {str(out)!r}])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr  # the plain conversion diverges
    assert "a float16 conversion with it meets cosine:0.999" in r.stderr
    names = json.loads(out.read_text())
    assert "node_linear" in names
    fixed = tmp_path / "fixed16.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), node_block_list=names, **FP16_OPTIONS), str(fixed))
    report = _cosine(fp32, fixed, _samples())
    assert report.ok and report.first_divergence is None, str(report)


def test_a_model_the_converter_breaks_is_exit_2_with_its_reason(tmp_path, capsys):
    """onnxconverter-common makes the input of a DynamicQuantizeLinear float16, which takes float
    only: ONNX Runtime refuses the file, and fix says so in one line."""
    import onnx.helper as h
    from onnx import TensorProto

    def vi(name):
        return h.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    nodes = [h.make_node("Mul", ["x", "x"], ["m"], name="/a/Mul"),
             h.make_node("DynamicQuantizeLinear", ["m"], ["q", "s", "z"], name="/b/DynamicQuantizeLinear"),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="/b/DequantizeLinear")]
    src = tmp_path / "dql.onnx"
    onnx.save(h.make_model(h.make_graph(nodes, "g", [vi("x")], [vi("y")]), opset_imports=[h.make_opsetid("", 17)]),
              str(src))
    rc = _main("fix", src, "--to", "fp16", "-o", tmp_path / "out.onnx", "--samples", "1")
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "onnxconverter-common" in err and "ONNX Runtime cannot load" in err and "/b/DynamicQuantizeLinear" in err
    assert not (tmp_path / "out.onnx").exists()


def test_config_out_convert_py_remakes_fixed_onnx_where_the_options_alone_do_not(torch_mod, tmp_path):
    """The kept Linear has weights above 65504 and makes the model's output: the converter with the
    written options alone clamps and casts them; convert.py (run in a fresh interpreter) restores them."""
    from onnxconverter_common import float16

    import layertap as lt

    nn = torch_mod.nn
    torch_mod.manual_seed(0)
    net = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32)).eval()
    with torch_mod.no_grad():
        net[1].weight.mul_(1e6)  # weights up to 1.8e5, outputs near 1e6
    fp32, cfg, out = tmp_path / "big.onnx", tmp_path / "cfg", tmp_path / "fixed.onnx"
    torch_mod.onnx.export(net, (torch_mod.randn(1, 32),), str(fp32), input_names=["x"], output_names=["y"], dynamo=False)
    cfg.mkdir()
    samples = _samples()
    report = lt.fix(fp32, to="fp16", out=out, samples=samples, config_out=cfg)
    assert report.ok and report.kept == ["1"], report
    options = json.loads((cfg / "onnxconverter_common.json").read_text())
    alone = tmp_path / "alone.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), **options), str(alone))
    assert not _cosine(fp32, alone, samples).ok  # the options alone do not make FIXED.onnx
    assert any("convert.py makes FIXED.onnx again (checked)" in n for n in report.notes), report.notes
    again = tmp_path / "again.onnx"
    run = subprocess.run([sys.executable, "-I", "convert.py", str(fp32), str(again)], cwd=cfg, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "float32 restored: y" in run.stdout, run.stdout + run.stderr
    assert again.read_bytes() == out.read_bytes()
    tree = __import__("ast").parse((cfg / "convert.py").read_text())
    imported = {a.name.split(".")[0] for n in tree.body if isinstance(n, __import__("ast").Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in tree.body if isinstance(n, __import__("ast").ImportFrom) and n.module}
    assert imported <= {"__future__", "json", "sys", "pathlib", "onnx", "onnxconverter_common", "numpy"}, imported
    text = report.render(width=80)  # the terminal table and its lines at 80 columns: nothing wraps
    lines = [line for line in report.footer() if "convert.py" not in line]  # that one names the temporary folder
    assert len(lines) == 4 and all(line in text.splitlines() for line in lines), text
    assert "ORT ms" in text and "kept in float32: 1 module (1 nodes): 1" in text, text


def test_config_out_in_a_missing_folder_or_on_a_file_is_exit_2(cnn, tmp_path, capsys):
    path, _ = cnn
    afile = tmp_path / "taken.json"
    afile.write_text("{}")
    for bad, says in ((tmp_path / "no" / "cfg", "does not exist"), (afile, "is a file")):
        assert _main("fix", path, "--to", "fp16", "-o", tmp_path / "f.onnx", "--config-out", bad) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert not (tmp_path / "f.onnx").exists() and afile.read_text() == "{}"
