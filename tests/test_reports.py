"""HTML reports (``--report``), Model Explorer node data (``--node-data``), ``_repr_html_``.

Browser checks live in test_reports_browser.py; these check content, formats and the CLI.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import run_cli

TINY = Path(__file__).parent / "_tiny.py"
SPEC = f"{TINY}:small_cnn"
INPUT = "2x3x16x16"


@pytest.fixture(scope="module")
def cnn_files(torch_mod, tmp_path_factory):
    """The tiny CNN's dynamo export and a copy with block.0's weights scaled (diverges there)."""
    import onnx
    from onnx import numpy_helper

    sys.path.insert(0, str(TINY.parent))
    from _tiny import small_cnn

    d = tmp_path_factory.mktemp("reports")
    good = d / "cnn.onnx"
    torch_mod.onnx.export(small_cnn(), (torch_mod.zeros(2, 3, 16, 16),), str(good), dynamo=True, input_names=["x"])
    proto = onnx.load(str(good))
    init = next(i for i in proto.graph.initializer if i.name == "block.0.weight")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    bad = d / "cnn_bad.onnx"
    onnx.save(proto, str(bad))
    return good, bad


def external_refs(html: str) -> list[str]:
    """Everything in a page that could make a browser fetch something."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", html)
    bad = [r for r in refs if not r.startswith(("data:", "#"))]
    bad += re.findall(r"@import|<link\b|url\((?!data:)", html)
    bad += re.findall(r"https?://(?!www\.w3\.org/2000/svg)", html)
    return bad


# -- building blocks -------------------------------------------------------------------
def test_png_encoder_round_trips_through_pillow():
    from PIL import Image

    from layertap.files.png import PALETTE, encode_png

    img = np.random.default_rng(0).integers(0, 256, size=(7, 13, 3), dtype=np.uint8)
    back = np.asarray(Image.open(io.BytesIO(encode_png(img))).convert("RGB"))
    np.testing.assert_array_equal(back, img)
    idx = np.random.default_rng(1).integers(0, len(PALETTE), size=(5, 9), dtype=np.uint8)  # palette image
    back = np.asarray(Image.open(io.BytesIO(encode_png(idx))).convert("RGB"))
    np.testing.assert_array_equal(back, PALETTE[idx])


def test_thumbnails_by_rank_with_caps_and_bad_values():
    from layertap.files.png import NAN_INDEX
    from layertap.reports.tensors import MAX_CHANNELS, thumbnail

    x = np.random.default_rng(0).normal(size=(2, 40, 8, 8))
    x[0, 0, 0, 0] = np.nan
    img, caption = thumbnail(x)
    assert caption.startswith(f"first {MAX_CHANNELS} of 40 channels of sample 0")
    assert img[0, 0] == NAN_INDEX  # the NaN pixel of channel 0 stands out
    _, caption = thumbnail(np.zeros((1, 300, 1000), dtype=np.float32))
    assert "token x hidden" in caption and "first 128 of 300 rows" in caption and "first 384 of 1000 columns" in caption
    _, caption = thumbnail(np.zeros((1, 512, 1, 1)))  # pooled features: a strip, not 512 one-pixel tiles
    assert caption.startswith("samples x features")
    assert thumbnail(np.array(["a"]))[0] is None


def test_tensor_cards_count_non_finite_values_and_say_the_cap():
    from layertap.reports.tensors import tensor_card, tensors_fragment

    a = np.array([[1.0, np.nan, np.inf, -np.inf, -np.inf, np.nan, np.nan, 0.0]])
    card = tensor_card("t", a)
    assert "NaN 3, +Inf 1, -Inf 2" in card and 'class="bad"' in card and "min -0, max 1" not in card
    many = tensors_fragment({f"t{i}": np.ones((1, 2, 3, 3)) for i in range(5)}, max_tensors=3)
    assert many.count('class="tensor"') == 3
    assert "first 3 of 5 tensors" in many and "t4" in many


def test_tree_nests_calls_listed_as_they_start_or_as_they_finish():
    from layertap.reports.tree import Node, nest

    def shape(top):
        return [(n.label, shape(n.children)) for n in top]

    paths = ["", "a", "a.x", "a.y", "b", "b.x"]
    pre = shape(nest([Node(p, p or "root") for p in paths]))
    post = shape(nest([Node(p, p or "root") for p in ["a.x", "a.y", "a", "b.x", "b", ""]]))
    assert pre == post == [("root", [("a", [("a.x", []), ("a.y", [])]), ("b", [("b.x", [])])])]


def test_compare_fragment_reads_rows_of_either_compare_form():
    """Rows with the extended fields (local_rel, cosine, worst_sample) and a report with
    first_divergence_counts render: local markers beside accumulated ones, words for both."""
    from layertap.reports.compare_page import compare_fragment

    def row(name, rel, local, ok):
        return SimpleNamespace(name=name, path=name, call=0, type="Conv", shape=[1, 4], max_abs=rel, rel_err=rel,
                               local_rel=local, cosine=0.99, sqnr_db=30.0, worst_sample=1,
                               status="pass" if ok else "FAIL", ok=ok, onnx=[name], note=None)

    report = SimpleNamespace(rows=[row("a", 1e-7, 1e-7, True), row("b", 0.02, 0.019, False), row("c", 0.05, 1e-6, False)],
                             rtol=1e-3, atol=1e-5, notes=[], first_divergence_counts={"b": 3, "c": 1})
    html = compare_fragment(report)
    # each chart is drawn wide and, for phones, tall
    assert html.count('class="pt-local"') == 3 * 2 and html.count('class="pt-fail"') == 2 * 2
    assert "first divergence: b" in html and 'class="first-divergence"' in html
    assert "this module itself makes most of the error" in html
    assert "Over 4 samples it was the first to diverge in 3" in html and "cosine similarity 0.990000" in html
    cos = SimpleNamespace(rows=report.rows, rtol=1e-3, atol=1e-5, notes=[], samples=4,
                          criterion=SimpleNamespace(metric="cosine", min_cosine=0.999, describe=lambda: "cosine >= 0.999"))
    html = compare_fragment(cos)
    assert "cosine similarity (log of 1 - cos)" in html and "cosine 0.990000, below the cosine threshold 0.999" in html
    assert "relative error: accumulated and local" in html and html.count('class="errchart"') == 2
    plain = SimpleNamespace(rows=[SimpleNamespace(name="a", path="a", rel_err=1e-7, ok=True, status="pass")], rtol=1e-3)
    assert "All 1 compared module calls agree" in compare_fragment(plain)


# -- report objects in notebooks -------------------------------------------------------------
def test_repr_html_of_layers_export_and_compare_reports(torch_mod, cnn_files, tmp_path):
    import layertap as lt

    sys.path.insert(0, str(TINY.parent))
    from _tiny import small_cnn

    model, x = small_cnn(), torch_mod.randn(2, 3, 16, 16)
    htmls = {
        "layers": lt.layers(model, x)._repr_html_(),
        "static": lt.layers(model)._repr_html_(),
        "onnx": lt.onnx_layers(cnn_files[0])._repr_html_(),
        "export": lt.export(model, (x,), tmp_path / "e.onnx", taps=["block"])._repr_html_(),
        "compare": lt.compare(model, (x,), cnn_files[1])._repr_html_(),
        "extract": lt.extract(model, x, taps=["stem", "fc:input"])._repr_html_(),
    }
    for kind, html in htmls.items():
        assert html.startswith('<div class="lt"><style>') and html.endswith("</div>"), kind
        assert not external_refs(html), kind
    assert "BatchNorm2d" in htmls["layers"] and "2x8x16x16" in htmls["layers"] and "<details" in htmls["layers"]
    assert "not run" in htmls["static"]
    assert "node_Conv" not in htmls["onnx"] and "block.1" in htmls["onnx"] and "Relu" in htmls["onnx"]
    assert "block" in htmls["export"] and "pass" in htmls["export"]
    assert 'class="errchart"' in htmls["compare"] and "first divergence: block" in htmls["compare"]
    assert htmls["extract"].count("data:image/png;base64,") == 3 and "samples x features" in htmls["extract"]


# -- command line ----------------------------------------------------------------------
def test_cli_reports_for_layers_extract_and_compare(cnn_files, tmp_path):
    good, bad = cnn_files
    r = run_cli("layers", SPEC, "--input", INPUT, "--report", str(tmp_path / "layers.html"))
    assert r.returncode == 0, r.stderr
    r = run_cli("extract", SPEC, "--input", INPUT, "--tap", "stem", "--tap", "block.2", "--tap", "fc:input",
                "-o", str(tmp_path / "t.npz"), "--report", str(tmp_path / "extract.html"))
    assert r.returncode == 0, r.stderr
    r = run_cli("compare", SPEC, str(bad), "--input", INPUT, "--json", "--report", str(tmp_path / "compare.html"),
                "--node-data", str(tmp_path / "nd.json"))
    assert r.returncode == 1, r.stderr
    first = json.loads(r.stdout)["first_divergence"]
    pages = {name: (tmp_path / f"{name}.html").read_text() for name in ("layers", "extract", "compare")}
    for name, html in pages.items():
        assert html.startswith("<!DOCTYPE html>") and not external_refs(html), name
    assert "layers of " in pages["layers"] and "2x8x16x16" in pages["layers"]
    assert pages["extract"].count("data:image/png;base64,") == 4  # three taps and "output" and "NaN 0, +Inf 0, -Inf 0" in pages["extract"]
    assert f"first divergence: {first}" in pages["compare"] and "The numbers first part at" in pages["compare"]
    assert {p.name for p in tmp_path.glob("nd*.json")} == {"nd.json", "nd.status.json", "nd.module.json"}


def test_node_data_validates_with_model_explorer_and_keys_are_nodes(cnn_files, tmp_path):
    import onnx

    builder = pytest.importorskip("model_explorer.node_data_builder", reason="ai-edge-model-explorer not installed")
    import layertap as lt
    from layertap.reports.nodedata import write_node_data

    sys.path.insert(0, str(TINY.parent))
    import torch

    from _tiny import small_cnn

    good, bad = cnn_files
    report = lt.compare(small_cnn(), (torch.randn(2, 3, 16, 16),), bad)
    paths = write_node_data(report, bad, tmp_path / "nd.json")
    nodes = {n.name for n in onnx.load(str(bad), load_external_data=False).graph.node}
    for p in paths:
        data = json.loads(p.read_text())
        # Model Explorer's own builder: the same document comes back out of its dataclasses.
        gnd = builder.GraphNodeData(**{**data, "results": {k: builder.NodeDataResult(**v) for k, v in data["results"].items()}})
        assert gnd.to_json_string(indent=1) + "\n" == p.read_text(), p.name  # byte for byte
        model = builder.ModelNodeData(graphsData={"main_graph": gnd})
        assert json.loads(model.to_json_string())["main_graph"] == data
        assert data["results"] and set(data["results"]) <= nodes, p.name
    error = json.loads(paths[0].read_text())
    import dacite  # Model Explorer's loader library: typed, strict

    dacite.from_dict(builder.GraphNodeData, error, config=dacite.Config(strict=True))
    values = [v["value"] for v in error["results"].values()]
    assert all(isinstance(v, float) for v in values) and max(values) > report.rtol
    status = json.loads(paths[1].read_text())["results"]
    assert "FAIL (first divergence)" in {v["value"] for v in status.values()}
    module = json.loads(paths[2].read_text())["results"]
    assert {v["value"] for v in module.values()} >= {"block.1", "fc"}


@pytest.mark.parametrize("target, message", [
    ("{tmp}/missing/r.html", "does not exist"),
    ("{tmp}", "is a folder"),
    ("{tmp}/r.txt", "must end in one of: .html, .htm"),
    ("/proc/r.html", "cannot write in output folder '/proc'"),  # unwritable even for root
])
def test_bad_report_path_refused_before_any_work(tmp_path, target, message):
    target = target.format(tmp=tmp_path)
    for argv in (["layers", "no_such_module_xyz:Net", "--report", target],
                 ["compare", "no_such_module_xyz:Net", str(TINY), "--report", target],
                 ["extract", "no_such_module_xyz:Net", "--tap", "fc", "-o", str(tmp_path / "o.npz"), "--report", target]):
        r = run_cli(*argv)
        # the model spec is bad too: the report path is checked first, so its message wins
        assert r.returncode == 2 and message in r.stderr, (argv, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.npz"))


def test_failed_run_keeps_the_previous_report(tmp_path):
    report = tmp_path / "r.html"
    report.write_text("previous good report")
    r = run_cli("layers", SPEC, "--input", "2x3x16", "--report", str(report))  # wrong rank: the model fails
    assert r.returncode == 2
    assert report.read_text() == "previous good report"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left behind


def test_layers_report_on_onnx_file_never_imports_torch(cnn_files, tmp_path):
    code = ("import sys; from layertap.cli.main import main; rc = main(sys.argv[1:]); "
            "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules)); sys.exit(rc)")
    out = tmp_path / "onnx.html"
    r = subprocess.run([sys.executable, "-c", code, "layers", str(cnn_files[0]), "--report", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "TORCH=False" in r.stderr, r.stderr
    html = out.read_text()
    assert "tensors by module" in html and "block.1" in html and not external_refs(html)


def test_extract_data_report_over_the_first_samples_without_torch(cnn_files, tmp_path):
    """``extract FILE.onnx --data DIR --report``: pictures of sample 0 and stats over the first
    samples, read back from the shards; an ONNX model never imports torch."""
    data = tmp_path / "samples"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        np.save(data / f"s{i:02d}.npy", rng.standard_normal((3, 16, 16)).astype(np.float32))
    code = ("import sys; from layertap.cli.main import main; rc = main(sys.argv[1:]); "
            "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules)); sys.exit(rc)")
    out, page = tmp_path / "feats", tmp_path / "feats.html"
    r = subprocess.run([sys.executable, "-c", code, "extract", str(cnn_files[0]), "--tap", "block.2", "--tap", "fc",
                        "--data", str(data), "-o", str(out), "--batch-size", "2", "--shard-size", "5", "--report", str(page)],  # the file has batch 2
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "TORCH=False" in r.stderr, r.stderr
    html = page.read_text()
    assert "first 8 of 12 samples" in html and "s00.npy" in html and not external_refs(html)
    assert html.count("data:image/png;base64,") == 2 and "NaN 0, +Inf 0, -Inf 0" in html
    import layertap as lt

    feats = lt.load_features(out)
    assert feats._repr_html_().startswith('<div class="lt">')
    r = run_cli("extract", str(cnn_files[0]), "--tap", "fc", "--data", str(data), "-o", str(tmp_path / "f2"),
                "--report", str(tmp_path / "nowhere" / "r.html"))
    assert r.returncode == 2 and "does not exist" in r.stderr and not (tmp_path / "f2").exists()


def test_onnx_vs_onnx_compare_report_and_node_data_without_torch(cnn_files, tmp_path):
    """The other compare form (two ONNX files, --local): same page, local errors drawn, no torch."""
    good, bad = cnn_files
    code = ("import sys; from layertap.cli.main import main; rc = main(sys.argv[1:]); "
            "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules)); sys.exit(rc)")
    page, nd = tmp_path / "oo.html", tmp_path / "oo.json"
    r = subprocess.run([sys.executable, "-c", code, "compare", str(good), str(bad), "--local", "--report", str(page),
                        "--node-data", str(nd)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "TORCH=False" in r.stderr, r.stderr
    html = page.read_text()
    assert "first divergence: block" in html and 'class="pt-local"' in html and "local error of" in html
    assert not external_refs(html)
    import onnx

    nodes = {n.name for n in onnx.load(str(bad), load_external_data=False).graph.node}
    assert set(json.loads(nd.read_text())["results"]) <= nodes
