"""OpenVINO as a second runtime: compare (either side), run, extract --data, the report naming
what ran, and bad input. Real files from both exporters, onnxconverter-common and
onnxruntime.quantization; real OpenVINO."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'layertap[openvino]')")


@pytest.fixture(scope="module")
def files(torch_mod, tmp_path_factory) -> dict[str, Path]:
    """small_cnn exported by both exporters, a float16 conversion and QDQ int8 files: ``qdq`` with 7-bit
    weights (``reduce_range``: OpenVINO's int8 kernels sum it exactly on every CPU), ``qdq_full`` with
    full-range weights (saturated by those kernels on CPUs without VNNI)."""
    import onnx
    from onnxconverter_common import float16
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from _tiny import small_cnn

    d = tmp_path_factory.mktemp("ov")
    model, x = small_cnn(), torch_mod.randn(2, 3, 16, 16, generator=torch_mod.Generator().manual_seed(0))
    out = {"model": model, "x": x, "ts": d / "ts.onnx", "dynamo": d / "dy.onnx", "fp16": d / "fp16.onnx", "qdq": d / "qdq.onnx",
           "qdq_full": d / "qdq-full.onnx"}
    torch_mod.onnx.export(model, (x,), str(out["ts"]), dynamo=False, input_names=["x"])
    torch_mod.onnx.export(model, (x,), str(out["dynamo"]), dynamo=True, input_names=["x"])
    onnx.save(float16.convert_float_to_float16(onnx.load(str(out["ts"])), keep_io_types=True), str(out["fp16"]))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": np.random.default_rng(i).standard_normal((2, 3, 16, 16)).astype(np.float32)} for i in range(2)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(out["ts"]), str(out["qdq"]), Reader(), quant_format=QuantFormat.QDQ, reduce_range=True)
    quantize_static(str(out["ts"]), str(out["qdq_full"]), Reader(), quant_format=QuantFormat.QDQ)
    return out


def _cli(*args: str, cwd: Path | None = None, hide_openvino: bool = False) -> subprocess.CompletedProcess:
    head = "import sys; sys.modules['openvino'] = None; " if hide_openvino else "import sys; "
    code = head + "from layertap.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def _bf16_runs() -> bool:
    import openvino as ov

    from layertap.errors import LayertapError
    from layertap.runtimes import open_runtime

    try:
        open_runtime("openvino", ov_precision="bf16")
    except LayertapError:
        return False
    return "CPU" in ov.Core().available_devices


@pytest.mark.parametrize("kind", ["ts", "dynamo", "fp16", "qdq"])
def test_a_file_in_onnx_runtime_vs_itself_in_openvino_at_f32_passes_every_row(files, kind):
    import layertap as lt

    report = lt.compare(files[kind], None, files[kind], samples=2, local=True, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    statuses = {r.name: r.status for r in report.rows}
    assert report.ok and report.first_divergence is None, report.footer()
    assert set(statuses.values()) <= {"pass", "absorbed"}
    assert statuses["output"] == "pass" and statuses["fc"] == "pass"
    assert report.runtimes["candidate"]["runtime"] == "OpenVINO"
    assert report.runtimes["candidate"]["precision"] == "float32"
    assert report.runtimes["reference"]["runtime"] == "ONNX Runtime"
    assert all(r.local_rel is not None and r.local_rel < 1e-3 for r in report.rows if r.status == "pass" and r.path)
    if kind == "qdq":  # the float Conv values OpenVINO folds into its int8 kernels: absorbed, with the reason
        folded = [r for r in report.rows if r.note and "OpenVINO folds" in r.note]
        assert [r.name for r in folded] == ["stem.1", "block.1"]


_SATURATED_RUN = """
import json, sys
import layertap as lt
out = {}
for name in sys.argv[1:]:
    report = lt.compare(name, None, name, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"),
                        samples=2)
    out[name] = dict(ok=report.ok, first=report.first_divergence, note=report.runtimes["candidate"].get("note", ""))
print(json.dumps(out))
"""


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's ISA cap is for x86 CPUs")
def test_openvino_int8_kernels_that_saturate_are_named(files):
    """OpenVINO's int8 kernels on a CPU without VNNI (here: oneDNN capped at AVX2, as such a CPU runs)
    sum pairs of int8 products in 16 bits with saturation: a full-range QDQ file diverges from ONNX
    Runtime's exact int8 sums at its first quantised Conv, and the report says why; 7-bit weights agree."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    full, seven = str(files["qdq_full"]), str(files["qdq"])
    r = subprocess.run([sys.executable, "-c", _SATURATED_RUN, full, seven], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert not got[full]["ok"] and got[full]["first"] == "stem.2", got
    assert "int8 kernels saturate on this CPU" in got[full]["note"] and "gave 510, not 64516" in got[full]["note"], got
    assert got[seven]["ok"] and got[seven]["first"] is None, got
    import layertap as lt
    from layertap.runtimes import open_runtime

    here = open_runtime("openvino", ov_precision="f32")
    report = lt.compare(files["qdq_full"], None, files["qdq_full"], samples=2, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    assert report.ok is not here.int8_saturates()  # this CPU's own kernels: exact, or named as above
    assert ("int8 kernels saturate" in report.runtimes["candidate"].get("note", "")) is here.int8_saturates()


def test_openvino_at_bf16_finds_the_first_divergence_at_the_first_conv(files):
    if not _bf16_runs():
        pytest.skip("this CPU does not run OpenVINO at bf16")
    import layertap as lt

    report = lt.compare(files["ts"], None, files["ts"], rtol=1e-3, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"))
    assert not report.ok
    # conv (with the BatchNorm folded into it) rounds its products to bfloat16: ~3e-3 relative, as bf16's 8 bits
    assert report.first_divergence == "stem.1"
    first = report.first_divergence_row
    assert 1e-4 < first.rel_err < 5e-2 and first.cosine > 0.999
    assert report.runtimes["candidate"]["precision"] == "bfloat16"


def test_pytorch_reference_with_an_openvino_candidate(files):
    import layertap as lt

    report = lt.compare(files["model"], files["x"], files["dynamo"], runtime_options=lt.RuntimeOptions(runtime="openvino", ov_precision="f32"))
    assert report.ok and {r.status for r in report.rows} <= {"pass", "absorbed"}
    assert report.runtimes == {"candidate": report.runtimes["candidate"]}
    assert report.runtimes["candidate"]["runtime"] == "OpenVINO"
    assert any("the candidate ran in OpenVINO" in n for n in report.notes)
    assert report.title == "PyTorch vs OpenVINO, module by module"


def test_compare_cli_names_each_sides_runtime_in_json_notes_and_html(files, tmp_path):
    page = tmp_path / "r.html"
    r = _cli("compare", str(files["ts"]), str(files["ts"]), "--cand-runtime", "openvino", "--ov-precision", "f32",
             "--json", "--report", str(page))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["runtimes"]["candidate"]["runtime"] == "OpenVINO"
    assert out["runtimes"]["candidate"]["device"] == "CPU"
    assert out["runtimes"]["candidate"]["version"][:4].isdigit()
    assert out["runtimes"]["reference"]["device"] == "CPU"
    assert any(n.startswith("candidate: ") and "OpenVINO" in n and "float32" in n for n in out["notes"])
    html = page.read_text()
    assert "OpenVINO" in html and "ONNX Runtime" in html and "float32" in html
    assert ("ORT runs" not in html) and (out["ort_runs"] == 1 or "OpenVINO runs" in html)  # the runs card names the runtime


def test_run_and_extract_data_with_openvino_give_onnx_runtimes_values(files, tmp_path):
    import layertap as lt

    x = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)  # exported at batch 2
    ort = lt.run(files["dynamo"], {"x": x}, taps=["stem", "block.1"])
    ov = lt.run(files["dynamo"], {"x": x}, taps=["stem", "block.1"], runtime="openvino", ov_precision="f32")
    assert list(ov) == list(ort) == ["output", "stem", "block.1"]
    for k in ort:
        np.testing.assert_allclose(ov[k], ort[k], rtol=1e-4, atol=1e-5)
    np.save(tmp_path / "x.npy", x)
    r = _cli("run", str(files["dynamo"]), "--input", f"x={tmp_path / 'x.npy'}", "--tap", "stem", "--runtime", "openvino",
             "-o", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    assert "OpenVINO outputs" in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["stem"], ort["stem"], rtol=1e-2, atol=1e-2)

    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):  # two batches of the file's fixed batch of 2
        np.save(data / f"s{i}.npy", np.random.default_rng(i).standard_normal((3, 16, 16)).astype(np.float32))
    feats = {}
    for name, extra in (("ort", []), ("openvino", ["--runtime", "openvino", "--ov-precision", "f32"])):
        r = _cli("extract", str(files["dynamo"]), "--tap", "stem", "--data", str(data), "-o", str(tmp_path / name),
                 "--batch-size", "2", *extra)
        assert r.returncode == 0, r.stderr
        feats[name] = lt.load_features(tmp_path / name)["stem"][:]
    np.testing.assert_allclose(feats["openvino"], feats["ort"], rtol=1e-4, atol=1e-5)
    manifest = json.loads((tmp_path / "openvino" / "manifest.json").read_text())
    assert manifest["model"]["runtime"] == {"runtime": "openvino", "ov_precision": "f32"}


@pytest.mark.parametrize("args, words", [
    (["--ov-device", "NPU7"], "OpenVINO has no device 'NPU7'"),
    (["--ov-precision", "f16"], "does not run --ov-precision f16"),
])
def test_bad_device_or_precision_exits_2_with_one_line_and_writes_nothing(files, tmp_path, args, words):
    if "f16" in args:
        from layertap.errors import LayertapError
        from layertap.runtimes import open_runtime

        try:
            open_runtime("openvino", ov_precision="f16")
            pytest.skip("this device runs float16")
        except LayertapError:
            pass
    page = tmp_path / "r.html"
    r = _cli("compare", str(files["ts"]), str(files["ts"]), "--cand-runtime", "openvino", *args, "--report", str(page))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    assert not page.exists() and list(tmp_path.iterdir()) == []


def test_a_file_openvino_cannot_read_exits_2_with_one_line(tmp_path):
    import onnx
    import onnx.helper as h

    g = h.make_graph([h.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "g",
                     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
    path = tmp_path / "odd.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)]), str(path))
    before = path.read_bytes()
    r = _cli("run", str(path), "--runtime", "openvino", "-o", str(tmp_path / "out.npz"))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "OpenVINO cannot read" in r.stderr, r.stderr
    assert path.read_bytes() == before and not (tmp_path / "out.npz").exists()


def test_without_openvino_installed_the_runtime_names_the_install_command(files):
    r = _cli("compare", str(files["ts"]), str(files["ts"]), "--cand-runtime", "openvino", hide_openvino=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "pip install 'layertap[openvino]'" in r.stderr, r.stderr


def test_runtime_options_that_do_not_fit_are_refused():
    from layertap.errors import LayertapError
    from layertap.runtimes import open_runtime

    with pytest.raises(LayertapError, match="execution provider 'CUDAExecutionProvider' is not available"):
        open_runtime("ort", providers="CUDAExecutionProvider,TensorrtExecutionProvider")
    with pytest.raises(LayertapError, match="--ov-device"):
        open_runtime("openvino", providers="CUDA")
    with pytest.raises(LayertapError, match="add --runtime openvino"):
        open_runtime("ort", ov_precision="f32")


def test_an_openvino_ir_pair_compares_with_its_onnx_source_by_tensor_name(files, tmp_path):
    import openvino as ov

    import layertap as lt

    xml = tmp_path / "ts.xml"
    ov.save_model(ov.convert_model(str(files["ts"])), str(xml))  # weights compressed to float16 by default
    before = xml.read_bytes(), xml.with_suffix(".bin").read_bytes()
    report = lt.compare(files["ts"], None, xml, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    statuses = {r.name: r.status for r in report.rows}
    assert report.ok and statuses["stem.1"] == statuses["block.2"] == statuses["output"] == "pass"
    assert 0 < report.rows[-1].rel_err < 1e-2  # float16 weights: a small, real difference
    back = lt.compare(xml, None, files["ts"], runtime_options=lt.RuntimeOptions(runtime="openvino", cand_runtime="ort", ov_precision="f32"))
    assert back.ok and back.runtimes["reference"]["runtime"] == "OpenVINO"
    r = _cli("compare", str(files["ts"]), str(xml), "--ov-precision", "f32")  # an IR side runs in OpenVINO
    assert r.returncode == 0 and "in OpenVINO" in " ".join(r.stdout.split()), r.stdout + r.stderr  # notes wrap at 80 columns
    r = _cli("compare", str(files["ts"]), str(xml), "--cand-runtime", "ort")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "only OpenVINO runs" in r.stderr, r.stderr
    r = _cli("compare", str(files["ts"]), str(xml), "--cand-runtime", "openvino", "--local")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "OpenVINO IR" in r.stderr, r.stderr
    x = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    ir = lt.run(xml, {"x": x}, taps=["stem", "/block/block.2/Relu_output_0"], runtime="openvino", ov_precision="f32")
    onnx_values = lt.run(files["ts"], {"x": x}, taps=["stem", "/block/block.2/Relu_output_0"])
    assert list(ir) == list(onnx_values) == ["output", "stem", "/block/block.2/Relu_output_0"]
    for k in ir:
        np.testing.assert_allclose(ir[k], onnx_values[k], rtol=1e-2, atol=1e-2)
    assert (xml.read_bytes(), xml.with_suffix(".bin").read_bytes()) == before


def test_openvino_exposes_tensors_in_batches_and_judges_by_any_metric(files):
    import layertap as lt

    one = lt.compare(files["dynamo"], None, files["dynamo"], runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    batched = lt.compare(files["dynamo"], None, files["dynamo"], metric="cosine", runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32", batch_outputs=2), criterion=lt.Criterion(check_finite=True))
    assert batched.ok and batched.criterion.metric == "cosine"
    assert batched.ort_runs > one.ort_runs == 2  # one run per side unbatched, several with two tensors per run
    assert any("exposing the intermediates in batches" in n for n in batched.notes)
    assert [r.max_abs for r in batched.rows] == [r.max_abs for r in one.rows]


def test_openvino_compare_and_run_never_import_torch_and_ort_alone_never_imports_openvino(files):
    code = (
        "import sys, layertap as lt\n"
        f"lt.run({str(files['ts'])!r})\n"
        "assert 'openvino' not in sys.modules\n"
        f"lt.compare({str(files['ts'])!r}, None, {str(files['ts'])!r}, runtime_options=lt.RuntimeOptions(cand_runtime='openvino'))\n"
        "assert 'openvino' in sys.modules and 'torch' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_openvino_reads_an_unedited_file_from_disk_and_an_edited_graph_from_memory(files, tmp_path, monkeypatch):
    import onnx

    import layertap as lt

    ext = tmp_path / "ext.onnx"  # weights in an external data file beside it
    onnx.save(onnx.load(str(files["ts"])), str(ext), save_as_external_data=True, location="ext.data", size_threshold=0)
    from layertap.runtimes.source import SessionSource

    inlined: list[str] = []
    real = SessionSource.inlined
    monkeypatch.setattr(SessionSource, "inlined",
                        lambda source, model=None: inlined.append((model or source.model).graph.name) or real(source, model))
    report = lt.compare(ext, None, ext, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32", batch_outputs=3))
    assert report.ok and report.ort_runs > 2 and inlined == []  # every batch read the file itself
    assert any(n.startswith("OpenVINO ran ") and "exposing the intermediates in batches" in n for n in report.notes)
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    got = lt.run(ext, {"x": x}, taps=["stem"], runtime="openvino", ov_precision="f32")
    np.testing.assert_allclose(got["stem"], lt.run(ext, {"x": x}, taps=["stem"])["stem"], rtol=1e-4, atol=1e-5)
    assert inlined == []
    local = lt.compare(ext, None, ext, local=True, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    assert local.ok and inlined  # the part graphs (--local) are edited graphs, read from memory


def test_no_ort_opt_on_a_side_openvino_runs_is_refused(files):
    import layertap as lt
    from layertap.errors import LayertapError

    with pytest.raises(LayertapError, match=r"--no-ort-opt .* OpenVINO runs the candidate"):
        lt.compare(files["ts"], None, files["ts"], runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ort_optimizations=False))
    with pytest.raises(LayertapError, match=r"--ref-no-ort-opt .* OpenVINO runs the reference"):
        lt.compare(files["ts"], None, files["ts"], runtime_options=lt.RuntimeOptions(runtime="openvino", cand_runtime="ort", ref_ort_optimizations=False))
    mixed = lt.compare(files["ts"], None, files["ts"], runtime_options=lt.RuntimeOptions(runtime="openvino", cand_runtime="ort", ort_optimizations=False))
    assert mixed.ok and any("graph optimisations disabled" in n for n in mixed.notes)
    r = _cli("compare", str(files["ts"]), str(files["ts"]), "--cand-runtime", "openvino", "--no-ort-opt")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "OpenVINO runs the candidate" in r.stderr, r.stderr


def test_a_reduced_precision_is_judged_at_its_rounding_and_a_real_fault_still_fails_at_its_row(files, tmp_path):
    if not _bf16_runs():
        pytest.skip("this CPU does not run OpenVINO at bf16")
    import onnx
    from onnx import numpy_helper

    import layertap as lt

    report = lt.compare(files["ts"], None, files["ts"], runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"))
    assert report.ok and report.precision == "bfloat16" and report.judged_at_format, report.footer()
    compared = [r for r in report.rows if r.ok is not None]
    assert all(r.format_rel is not None and r.impl_rel is not None for r in compared)
    assert report.footer()[-1].startswith("no divergence beyond bfloat16 rounding; output cosine ")
    tight = lt.compare(files["ts"], None, files["ts"], rtol=1e-3, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"))
    assert not tight.ok and tight.criterion.rtol == 1e-3 and not tight.judged_at_format
    model = onnx.load(str(files["ts"]))  # the weight of the second Conv times 1.02 in a copy
    weights = {i.name: i for i in model.graph.initializer}
    conv = [n for n in model.graph.node if n.op_type == "Conv"][1]
    w = weights[conv.input[1]]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(1.02), w.name))
    bad = tmp_path / "fault.onnx"
    onnx.save(model, str(bad))
    found = lt.compare(files["ts"], None, bad, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"), criterion=lt.Criterion(allow_different_weights=True))
    assert not found.ok and conv.output[0] in found.first_divergence_row.onnx, found.footer()
    r = _cli("compare", str(files["ts"]), str(files["ts"]), "--cand-runtime", "openvino", "--ov-precision", "bf16")
    assert r.returncode == 0 and "no divergence beyond bfloat16 rounding" in r.stdout, r.stdout + r.stderr


def test_layers_lists_an_openvino_irs_tensors_with_their_module_paths(files, tmp_path):
    import openvino as ov

    xml = tmp_path / "ts.xml"
    ov.save_model(ov.convert_model(str(files["ts"])), str(xml))
    r = _cli("layers", str(xml), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {row["name"]: row for row in out["rows"]}
    assert rows["x"]["op"] == "input" and rows["x"]["shape"] == [2, 3, 16, 16]
    relu = rows["/block/block.2/Relu_output_0"]  # the ONNX tensor name, OpenVINO's op type, the module path
    assert (relu["op"], relu["module"], relu["dtype"], relu["shape"]) == ("Relu", "block.2", "float32", [2, 8, 16, 16])
    assert out["source"] == "torchscript" and any("an OpenVINO IR" in n for n in out["notes"])
    bad = tmp_path / "bad.xml"
    bad.write_text("<net/>")
    r = _cli("layers", str(bad))
    assert r.returncode == 2 and "OpenVINO cannot read" in r.stderr and "not an ONNX file" not in r.stderr, r.stderr


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's ISA cap is for x86 CPUs")
def test_fix_in_openvino_keeps_what_its_int8_kernels_lose_where_onnx_runtime_keeps_nothing(files, tmp_path):
    """The same int8 conversion, searched in the runtime it will run in: on a CPU without VNNI (oneDNN capped
    at AVX2) OpenVINO's int8 kernels saturate and miss the target that ONNX Runtime's exact sums meet, so
    ``fix --runtime openvino`` keeps a module in float where ``fix`` in ONNX Runtime keeps none; the file it
    writes meets the target in OpenVINO."""
    import torch

    path = tmp_path / "cnn.onnx"
    torch.onnx.export(files["model"], (files["x"][:1],), str(path), dynamo=False, input_names=["x"])
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(2):
        np.save(calib / f"s{i}.npy", np.random.default_rng(i).standard_normal((3, 16, 16)).astype(np.float32))
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    outs = {}
    for runtime in ("ort", "openvino"):
        out = tmp_path / f"fixed-{runtime}.onnx"
        cmd = [sys.executable, "-m", "layertap", "fix", str(path), "--to", "int8", "--calib", str(calib),
               "--inputs", str(calib), "--target", "sqnr:45", "-o", str(out), "--runtime", runtime, "--json"]
        cmd += ["--ov-precision", "f32"] if runtime == "openvino" else []
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[runtime] = json.loads(r.stdout)
    assert outs["ort"]["kept"] == [] and outs["ort"]["ok"]
    assert outs["openvino"]["kept"] and outs["openvino"]["ok"], outs["openvino"]
    plain = outs["openvino"]["rows"][0]
    assert plain["action"] == "plain" and plain["metric"] < 45 <= outs["ort"]["rows"][0]["metric"]
    r = subprocess.run([sys.executable, "-m", "layertap", "fix", str(path), "--to", "int8", "-o",
                        str(tmp_path / "x.onnx"), "--ov-precision", "f32"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--ov-precision" in r.stderr and r.stderr.count("\n") == 1, r.stderr
