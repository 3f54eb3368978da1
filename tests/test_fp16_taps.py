"""Float16 conversions of files whose model outputs other nodes read too (taps, and a tap on the
model's output): what onnxconverter-common writes alone ONNX Runtime refuses; what ``fix --to fp16``
and ``compare --fp16-block-list`` convert loads, runs at any batch size and matches float32. Real
exporters, the real converter, real ONNX Runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
float16 = pytest.importorskip("onnxconverter_common.float16")
sys.path.insert(0, str(Path(__file__).parent))

TAPS = ["relu1", "pool1", "relu2", "pool2", "pool3", "fc"]


def _export(torch_mod, folder: Path, exporter: str, overflow: float) -> Path:
    import layertap as lt
    from _tiny import pool_cnn

    path = folder / f"cnn_{exporter}.onnx"
    report = lt.export(pool_cnn(overflow), torch_mod.randn(1, 3, 16, 16), path, taps=TAPS, exporter=exporter)
    assert report.ok, str(report)
    return path


@pytest.fixture(scope="module", params=["dynamo", "torchscript"])
def tapped(request, torch_mod, tmp_path_factory):
    """A CNN whose second conv leaves float16's range, exported by layertap with its ReLUs, MaxPools
    and output tapped (dynamic batch)."""
    return _export(torch_mod, tmp_path_factory.mktemp("tapped"), request.param, 3e5)


@pytest.fixture(scope="module")
def in_range(torch_mod, tmp_path_factory):
    """The same CNN and taps with every value in float16's range (TorchScript export)."""
    return _export(torch_mod, tmp_path_factory.mktemp("in_range"), "torchscript", 1.0)


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _refusal(path) -> str:
    try:
        _session(path)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        return str(e)
    return ""


def _converter_alone(src: Path, out: Path, **options) -> Path:
    onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), **{"keep_io_types": True, **options}), str(out))
    return out


def _assert_close(fp32, fp16, min_cosine=0.999):
    """FP16 loads and, at batch 1 and 3, gives every output in float32, of float32's shape, with a
    cosine to float32's of at least ``min_cosine``."""
    ref, got = _session(fp32), _session(fp16)
    names = [o.name for o in ref.get_outputs()]
    assert [o.name for o in got.get_outputs()] == names
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        feed = {ref.get_inputs()[0].name: rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)}
        for name, r, g in zip(names, ref.run(None, feed), got.run(None, feed)):
            assert g.dtype == np.float32 and g.shape == r.shape, name
            r64, g64 = r.astype(np.float64).ravel(), g.astype(np.float64).ravel()
            cosine = r64 @ g64 / (np.linalg.norm(r64) * np.linalg.norm(g64))
            assert cosine >= min_cosine, (name, batch, cosine)


def _main(*args):
    from layertap.cli.main import main

    return main([str(a) for a in args])


def test_fix_fp16_of_a_tapped_export_loads_runs_and_matches_float32(tapped, tmp_path):
    import layertap as lt

    assert "Type Error" in _refusal(_converter_alone(tapped, tmp_path / "alone.onnx"))
    cfg, out = tmp_path / "cfg", tmp_path / "fixed.onnx"
    report = lt.fix(tapped, to="fp16", out=out, samples=2, config_out=cfg)
    assert report.ok and {"conv2", "pool2", "norm"} <= set(report.kept) and "pool1" not in report.kept, str(report)
    _assert_close(tapped, out)
    assert any("ONNX Runtime refuses, repaired" in n and "relu1" in n for n in report.notes), report.notes
    assert any("convert.py makes FIXED.onnx again (checked)" in n for n in report.notes), report.notes
    # the written options alone make a file ONNX Runtime refuses; convert.py repairs it as fix did
    options = json.loads((cfg / "onnxconverter_common.json").read_text())
    assert "Type Error" in _refusal(_converter_alone(tapped, tmp_path / "options.onnx", **options))
    again = tmp_path / "again.onnx"
    run = subprocess.run([sys.executable, "-I", "convert.py", str(tapped), str(again)], cwd=cfg, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "types repaired: output, relu1" in run.stdout, run.stdout + run.stderr
    assert again.read_bytes() == out.read_bytes()


def test_compare_fp16_block_list_of_a_tapped_export(tapped, tmp_path, capsys):
    from layertap.fixing.convert import Converter

    plain = Converter("fp16", tmp_path).convert(onnx.load(str(tapped)), [], tmp_path / "plain.onnx")
    block = tmp_path / "block.json"
    assert _main("compare", tapped, plain, "--metric", "cosine", "--fp16-block-list", block) == 1  # conv2 overflows
    err = capsys.readouterr().err
    assert "a float16 conversion with it meets cosine:0.999" in err and "ONNX Runtime refuses, repaired" in err, err
    names = json.loads(block.read_text())
    assert names and "Type Error" in _refusal(_converter_alone(tapped, tmp_path / "alone.onnx", node_block_list=names))
    fixed = Converter("fp16", tmp_path).convert(onnx.load(str(tapped)), names, tmp_path / "fixed.onnx")
    _assert_close(tapped, fixed)


@pytest.mark.parametrize("kept", ["makers", "readers", "both"])
def test_kept_nodes_that_make_or_read_a_tap(in_range, tmp_path, kept):
    """A tap made by a node kept in float32 and read by float16 nodes is read through a Cast to
    float16; one made in float16 and read by kept nodes, in float32."""
    from layertap.fixing.convert import Converter

    model = onnx.load(str(in_range))
    outs = {o.name for o in model.graph.output}
    nodes = [n.name for n in model.graph.node if kept in ("makers", "both") and set(n.output) & outs
             or kept in ("readers", "both") and set(n.input) & outs]
    assert len(nodes) >= 4
    path = Converter("fp16", tmp_path).convert(model, nodes, tmp_path / "k.onnx")
    _assert_close(in_range, path)
    made = {n.output[0] for n in onnx.load(str(path)).graph.node if n.op_type == "Cast"}
    assert ("pool1_float16" in made) == (kept == "makers")  # pool1's reader conv2 is kept in "both"


def test_nodes_whose_type_an_attribute_fixes_make_the_float16_the_converter_declares(tmp_path):
    """onnxconverter-common declares float16 the outputs of a Cast to float (as in TorchScript exports
    of timm's ViT), a ConstantOfShape without value (as in dynamo exports of MaxUnpool2d) and a
    Constant's value_floats, and leaves them making float: fix converts the model and it runs."""
    import onnx.helper as h
    from onnx import TensorProto

    import layertap as lt

    def vi(name):
        return h.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    nodes = [h.make_node("Mul", ["x", "x"], ["m"], name="/a/Mul"), h.make_node("Cast", ["m"], ["c"], to=1, name="/a/Cast"),
             h.make_node("Shape", ["x"], ["s"], name="/b/Shape"), h.make_node("ConstantOfShape", ["s"], ["z"], name="/b/Zeros"),
             h.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0, 3.0, 4.0], name="/b/Constant"),
             h.make_node("Add", ["c", "z"], ["cz"], name="/c/Add"), h.make_node("Add", ["cz", "k"], ["y"], name="/c/Add_1")]
    src = tmp_path / "typed.onnx"
    onnx.save(h.make_model(h.make_graph(nodes, "g", [vi("x")], [vi("y")], value_info=[vi(n) for n in "mczk"]),
                           opset_imports=[h.make_opsetid("", 17)]), str(src))
    assert "Type Error" in _refusal(_converter_alone(src, tmp_path / "alone.onnx"))
    report = lt.fix(src, to="fp16", out=tmp_path / "out.onnx", samples=2)
    assert report.ok and report.best.metric > 0.9999, str(report)
    assert any(all(name in n for name in ("/a/Cast", "/b/Zeros", "/b/Constant")) for n in report.notes), report.notes
    x = np.linspace(-2, 2, 4, dtype=np.float32)[None]
    got = _session(tmp_path / "out.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x * x + np.arange(1, 5), rtol=1e-3)


@pytest.mark.parametrize("kept", [[], ["/r/Relu"], ["/n/Neg"], ["/r/Relu", "/n/Neg"]])
def test_model_outputs_declared_again_in_value_info(tmp_path, kept):
    """A file that declares its outputs in value_info too: the converter alone retypes them float16
    (ONNX Runtime refuses it) or drops the cast a kept node's output needs (the converter fails)."""
    import onnx.helper as h
    from onnx import TensorProto

    from layertap.fixing.convert import Converter

    def vi(name):
        return h.make_tensor_value_info(name, TensorProto.FLOAT, ["n", 4])

    nodes = [h.make_node("Relu", ["x"], ["tap"], name="/r/Relu"), h.make_node("Neg", ["tap"], ["y"], name="/n/Neg")]
    src = tmp_path / "declared.onnx"
    onnx.save(h.make_model(h.make_graph(nodes, "g", [vi("x")], [vi("y"), vi("tap")], value_info=[vi("tap"), vi("y")]),
                           opset_imports=[h.make_opsetid("", 17)]), str(src))
    with pytest.raises(Exception, match="Type Error|InitializeStateFromModelFileGraphProto|second cast node"):
        _session(_converter_alone(src, tmp_path / "alone.onnx", node_block_list=kept))
    path = Converter("fp16", tmp_path).convert(onnx.load(str(src)), kept, tmp_path / "h.onnx")
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    y, tap = _session(path).run(None, {"x": x})
    np.testing.assert_allclose(tap, np.maximum(x, 0), rtol=1e-3)
    np.testing.assert_allclose(y, -np.maximum(x, 0), rtol=1e-3)
