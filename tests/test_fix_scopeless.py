"""``layertap fix`` and ``layertap repro`` on ONNX files without PyTorch module scopes (paddle2onnx-like
names, no metadata): the units are the file's ONNX nodes. Trained models (tests/_trained.py) made
scope-less by tests/_scopeless.py; the real converters (onnxconverter-common, onnxruntime.quantization)
and ONNX Runtime run every set, and FIXED.onnx is checked again in plain ONNX Runtime."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxconverter_common")
sys.path.insert(0, str(Path(__file__).parent))

from _scopeless import export_scopeless  # noqa: E402


def _main(*args):
    from layertap.cli.main import main

    return main([str(a) for a in args])


def _cosine(ref_path, cand_path, xs):
    """The worst output cosine over ``xs`` of two files in plain ONNX Runtime."""
    a = ort.InferenceSession(str(ref_path), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(cand_path), providers=["CPUExecutionProvider"])
    worst = 1.0
    for x in xs:
        for r, c in zip(a.run(None, {"x": x}), b.run(None, {"x": x})):
            r, c = r.ravel().astype(np.float64), c.ravel().astype(np.float64)
            worst = min(worst, float(r @ c / (np.linalg.norm(r) * np.linalg.norm(c))))
    return worst


@pytest.fixture(scope="module")
def crepe(torch_mod, tmp_path_factory):
    """Trained full CREPE without module scopes (a BatchNorm's running variance beyond float16's range)
    and 4 tone frames as one .npz."""
    import _trained

    model = _trained.crepe("full")
    d = tmp_path_factory.mktemp("crepe")
    frames = _trained.tone_frames(4)[:, None]  # one frame per sample: (1, 1024) each
    path = export_scopeless(model, torch_mod.from_numpy(frames[0]), d / "crepe.onnx")
    np.savez(d / "tones.npz", x=frames)
    return path, d / "tones.npz", list(frames)


@pytest.fixture(scope="module")
def onet(torch_mod, tmp_path_factory):
    """Trained MTCNN ONet without module scopes and 16 face-like crops."""
    import _trained

    d = tmp_path_factory.mktemp("onet")
    crops = _trained.face_crops(16)[:, None]
    path = export_scopeless(_trained.onet(), torch_mod.from_numpy(crops[0]), d / "onet.onnx")
    np.savez(d / "faces.npz", x=crops)
    return path, d / "faces.npz", list(crops)


def test_fp16_keeps_onnx_nodes_of_a_file_without_module_scopes(crepe, tmp_path, capsys):
    src, tones, frames = crepe
    out, cfg, page = tmp_path / "fixed.onnx", tmp_path / "cfg", tmp_path / "fix.html"
    rc = _main("fix", src, "--to", "fp16", "-o", out, "--inputs", tones, "--config-out", cfg, "--report", page, "--json")
    got = json.loads(capsys.readouterr().out)
    assert rc == 0, got
    summary, steps = got, got["rows"]
    names = {n.name for n in onnx.load(str(src), load_external_data=False).graph.node}
    assert summary["unit"] == "node" and summary["kept"] and set(summary["kept"]) <= names
    assert summary["nodes"] == summary["kept"]
    assert steps[0]["action"] == "plain" and steps[0]["metric"] < 0.999  # the plain conversion misses the target
    assert any("units kept in float32 are its ONNX nodes" in n for n in summary["notes"])
    assert any("makes FIXED.onnx again (checked)" in n for n in summary["notes"])
    assert _cosine(src, out, frames) >= 0.999  # FIXED.onnx itself, in plain ONNX Runtime
    assert json.loads((cfg / "nodes.json").read_text())["nodes"] == summary["kept"]
    assert not (cfg / "modules.json").exists()
    assert json.loads((cfg / "onnxconverter_common.json").read_text())["node_block_list"] == summary["nodes"]
    assert json.loads((cfg / "ort_quantization.json").read_text())["nodes_to_exclude"] == summary["nodes"]
    assert "ONNX nodes kept in float32" in page.read_text()


def test_int8_keeps_onnx_nodes_and_quantize_static_leaves_them_float(onet, tmp_path, capsys):
    src, faces, crops = onet
    out, cfg = tmp_path / "fixed.onnx", tmp_path / "cfg"
    rc = _main("fix", src, "--to", "int8", "-o", out, "--inputs", faces, "--config-out", cfg, "--json")
    got = json.loads(capsys.readouterr().out)
    assert rc == 0, got
    summary = got
    assert summary["unit"] == "node" and summary["kept"] and got["rows"][0]["metric"] < 0.999
    assert _cosine(src, out, crops) >= 0.999
    fixed = onnx.load(str(out)).graph
    made = {t: n.op_type for n in fixed.node for t in n.output}
    kept = [n for n in fixed.node if n.name in set(summary["kept"])]
    assert len(kept) == len(summary["kept"])  # quantize_static took nodes_to_exclude: the nodes stay, unquantised
    assert all(made.get(t) != "DequantizeLinear" for n in kept for t in n.input[:1])
    assert any(op == "QuantizeLinear" for op in made.values())
    assert json.loads((cfg / "ort_quantization.json").read_text())["nodes_to_exclude"] == summary["nodes"]


def test_keep_takes_a_node_or_tensor_name_and_an_unknown_one_names_close_ones(onet, tmp_path, capsys):
    src, faces, _ = onet
    rc = _main("fix", src, "--to", "fp16", "-o", tmp_path / "f.onnx", "--inputs", faces, "--keep", "conv2d_1.tmp_0",
               "--keep", "p2o.Conv.3", "--target", "cosine:0.9", "--json")
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and got["rows"][0]["action"] == "keep"
    assert got["kept"] == ["p2o.Conv.1", "p2o.Conv.3"]
    rc = _main("fix", src, "--to", "fp16", "-o", tmp_path / "g.onnx", "--inputs", faces, "--keep", "conv2d_1.tmp_9")
    err = capsys.readouterr().err
    assert rc == 2 and "unknown node 'conv2d_1.tmp_9'" in err and "conv2d_1.tmp_0" in err
    assert not (tmp_path / "g.onnx").exists()


@pytest.fixture(scope="module")
def onet_int8(onet):
    """The scope-less ONet quantised as QDQ by onnxruntime.quantization (calibrated on its crops)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    src, _, crops = onet

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": c} for c in crops)

        def get_next(self):
            return next(self.it, None)

    q = src.with_name("onet_q.onnx")
    quantize_static(str(src), str(q), Reader(), quant_format=QuantFormat.QDQ)
    return q


def test_repro_module_takes_a_tensor_name_of_a_file_without_module_scopes(onet, onet_int8, tmp_path, capsys):
    src, faces, _ = onet
    pkg = tmp_path / "pkg"
    rc = _main("repro", src, onet_int8, "-o", pkg, "--module", "conv2d_3.tmp_0", "--inputs", faces, "--rtol", "1e-3")
    said = capsys.readouterr()
    assert rc == 0 and f"wrote {pkg}: conv2d_3.tmp_0 alone" in said.out, said
    record = json.loads((pkg / "repro.json").read_text())
    assert record["module"] == "conv2d_3.tmp_0" and record["reproduced"]
    assert {"cand.onnx", "ref.onnx", "inputs.npz", "expected.npz", "repro.py"} <= set(record["files"])
    assert record["ref_error"] is not None and record["ref_error"] < 1e-5  # the reference's part: its node alone
    part = onnx.load(str(pkg / "ref.onnx")).graph
    assert [n.name for n in part.node if n.op_type == "Conv"] == ["p2o.Conv.3"]
    # the candidate's part is the node itself with its Q/DQ, not only the rounding of its output
    cand = onnx.load(str(pkg / "cand.onnx")).graph
    assert "Conv" in {n.op_type for n in cand.node}, [n.op_type for n in cand.node]


def test_repro_module_takes_a_node_name_and_an_unknown_tensor_is_exit_2(onet, onet_int8, tmp_path, capsys):
    src, faces, _ = onet
    rc = _main("repro", src, onet_int8, "-o", tmp_path / "pkg", "--module", "p2o.Conv.3", "--inputs", faces,
               "--rtol", "1e-3")
    said = capsys.readouterr()
    assert rc == 0, said
    assert json.loads((tmp_path / "pkg" / "repro.json").read_text())["module"] == "conv2d_3.tmp_0"
    rc = _main("repro", src, onet_int8, "-o", tmp_path / "pkg2", "--module", "conv2d_3.tmp_9")
    err = capsys.readouterr().err
    assert rc == 2 and "unknown tensor 'conv2d_3.tmp_9'" in err and "conv2d_3.tmp_0" in err
    assert not (tmp_path / "pkg2").exists()
