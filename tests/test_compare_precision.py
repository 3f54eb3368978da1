"""Judged at the candidate's precision: a healthy float16, bfloat16 or int8 run passes, and the first divergence
names a fault (a wrong op, a changed constant, a value the format cannot carry), not rounding.

Trained models (CREPE tiny, MTCNN's ONet) on realistic inputs, with faults injected into the files at known
modules; both kinds of reference (the PyTorch model, the float32 file)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from _faults import replace_op, scale_weight, shrink_scale

FP16_OK = {"keep_io_types": True, "max_finite_val": 65504.0}


def _export(model, x, path: Path) -> Path:
    import torch

    torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=False, input_names=["x"], opset_version=17)
    return path


def _fp16(src: Path, dst: Path, **options) -> Path:
    import onnx
    from onnxconverter_common import float16

    onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), **(options or FP16_OK)), str(dst))
    return dst


def _int8(src: Path, dst: Path, calib: list[np.ndarray]) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": c} for c in calib])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return dst


@pytest.fixture(scope="module")
def crepe(tmp_path_factory):
    """Trained CREPE tiny: the float32 file, its float16 conversion, a static int8 QDQ file calibrated on 24
    tone frames, and two frames to compare on."""
    from _trained import crepe_tiny, tone_frames

    d = tmp_path_factory.mktemp("precision-crepe")
    model = crepe_tiny()
    frames = [tone_frames(1, seed=s) for s in (7, 8)]
    fp32 = _export(model, frames[0], d / "crepe.onnx")
    return {"model": model, "frames": frames, "fp32": fp32, "fp16": _fp16(fp32, d / "crepe16.onnx"),
            "int8": _int8(fp32, d / "crepe8.onnx", [tone_frames(1, seed=100 + i) for i in range(24)]), "dir": d}


@pytest.fixture(scope="module")
def onet(tmp_path_factory):
    """Trained MTCNN ONet on face crops: the float32 file and a static int8 QDQ file."""
    from _trained import face_crops, onet

    d = tmp_path_factory.mktemp("precision-onet")
    model = onet()
    crops = [face_crops(1, seed=s) for s in (3, 4)]
    fp32 = _export(model, crops[0], d / "onet.onnx")
    return {"model": model, "crops": crops, "fp32": fp32,
            "int8": _int8(fp32, d / "onet8.onnx", [face_crops(1, seed=50 + i) for i in range(24)]), "dir": d}


def _both(files: dict, cand, key: str = "frames", **kwargs):
    """The candidate judged against the float32 file and against the PyTorch model."""
    import torch

    import layertap as lt

    samples = files[key]
    by_file = lt.compare(files["fp32"], None, cand, samples=[{"x": s} for s in samples], **kwargs)
    tensors = [torch.from_numpy(s) for s in samples]
    by_model = lt.compare(files["model"], tensors[0], cand, samples=tensors, **kwargs)
    return by_file, by_model


def _output_tensor(path: Path, op: str, nth: int = 0) -> str:
    import onnx

    return [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == op][nth].output[0]


# -- healthy runs pass ------------------------------------------------------------------------------
def test_a_healthy_float16_file_passes_at_float16(crepe):
    import layertap as lt

    for report in _both(crepe, crepe["fp16"]):
        assert report.ok and report.precision == "float16" and report.judged_at_format, "\n".join(report.footer())
        compared = [r for r in report.rows if r.ok is not None]
        assert compared and all(r.format_rel is not None and r.impl_rel is not None for r in compared)
        assert all(r.precision == "float16" for r in compared if r.path)
        last = report.footer()[-1]
        assert last.startswith("no divergence beyond float16 rounding; output cosine "), last
        assert report.output_cosine > 0.9999 and report.ideal_output_cosine > 0.9999 and "(an ideal float16 run: " in last
    # the fixed rule, asked for, flags the same file at a BatchNorm: rounding, not a fault
    fixed = lt.compare(crepe["fp32"], None, crepe["fp16"], samples=[{"x": s} for s in crepe["frames"]], criterion=lt.Criterion(precision="fp32"))
    assert not fixed.ok and not fixed.judged_at_format and fixed.precision == "float32"


def test_a_calibrated_int8_file_passes_at_int8(crepe, onet):
    for files, key in ((crepe, "frames"), (onet, "crops")):
        for report in _both(files, files["int8"], key):
            assert report.ok and report.precision == "int8", "\n".join(report.footer())
            assert report.footer()[-1].startswith("no divergence beyond int8 quantisation; output cosine")


def test_the_users_rule_still_decides(crepe):
    """--rtol/--metric given: they judge every row (the ideal run's numbers are still shown)."""
    import layertap as lt

    samples = [{"x": s} for s in crepe["frames"]]
    tight = lt.compare(crepe["fp32"], None, crepe["int8"], samples=samples, rtol=1e-3)
    assert not tight.ok and not tight.judged_at_format and tight.precision == "int8"
    assert any(r.format_rel is not None for r in tight.rows)
    cosine = lt.compare(crepe["fp32"], None, crepe["int8"], samples=samples, metric="cosine", criterion=lt.Criterion(min_cosine=0.99))
    assert cosine.ok and not cosine.judged_at_format


# -- faults are named at their module -----------------------------------------------------------------
def test_float16_faults_are_named_at_their_module(crepe):
    import layertap as lt

    d = crepe["dir"]
    # CREPE's ReLUs are functional (F.relu between conv4 and conv4_BN): the BatchNorm reading it shows it
    replace_op(crepe["fp16"], d / "wrong-op.onnx", _output_tensor(crepe["fp16"], "Relu", 3))
    for report in _both(crepe, d / "wrong-op.onnx"):
        first = report.first_divergence_row
        assert first is not None and first.path == "conv4_BN", "\n".join(report.footer())
        assert first.impl_rel > 10 * first.format_rel
    conv = _output_tensor(crepe["fp16"], "Conv", 3)
    weight = scale_weight(crepe["fp16"], d / "weight.onnx", conv, 1.02)  # 2%: some 40x float16's rounding there
    for report in _both(crepe, d / "weight.onnx", criterion=lt.Criterion(allow_different_weights=True)):
        first = report.first_divergence_row
        assert first is not None and first.path == weight.rpartition(".")[0], "\n".join(report.footer())


def test_a_converters_documented_cap_is_part_of_the_format(crepe):
    """onnxconverter-common with its default settings caps every weight at 1e4 (max_finite_val): CREPE's
    conv2_BN variances of up to 1.22e4 (which float16 holds) become 1e4, output cosine 0.99998. That cap is
    the format as the converter writes it: the ideal run caps them too, the comparison passes at both
    references and names the parameter, with the setting that keeps it; a real change in the same file (a
    Conv weight x1.05) still fails its module."""
    import layertap as lt

    capped = _fp16(crepe["fp32"], crepe["dir"] / "capped.onnx", keep_io_types=True)
    for report in _both(crepe, capped):
        assert report.ok and report.judged_at_format, "\n".join(report.footer())
        assert [c.name for c in report.weights.capped] == ["conv2_BN.running_var"] and not report.weights.differing
        assert any("capped 1 parameter(s) at 10000" in n and "max_finite_val=65504" in n for n in report.notes), report.notes
        row = next(r for r in report.rows if r.path == "conv2_BN")
        assert "conv2_BN.running_var capped at 10000" in (row.note or "") and row.format_rel > 0.05  # the ideal run caps it
    conv = _output_tensor(capped, "Conv", 3)
    weight = scale_weight(capped, crepe["dir"] / "capped-weight.onnx", conv, 1.05)
    for report in _both(crepe, crepe["dir"] / "capped-weight.onnx", criterion=lt.Criterion(allow_different_weights=True)):
        first = report.first_divergence_row
        assert first is not None and first.path == weight.rpartition(".")[0], "\n".join(report.footer())


def test_int8_faults_are_named_at_their_module(onet):
    d = onet["dir"]
    conv = _output_tensor(onet["fp32"], "Conv", 2)  # the quantiser reading conv3's output, given 1/10 of its scale
    shrink_scale(onet["int8"], d / "clip.onnx", conv)
    for report in _both(onet, d / "clip.onnx", "crops"):
        first = report.first_divergence_row
        assert first is not None and "int8 clipping" in (first.limit or ""), "\n".join(report.footer())
        assert first.path in ("conv3", "prelu3"), first.name
    prelu = _output_tensor(onet["int8"], "PRelu", 1)
    replace_op(onet["int8"], d / "wrong8.onnx", prelu)
    for report in _both(onet, d / "wrong8.onnx", "crops"):
        first = report.first_divergence_row
        assert first is not None and first.path == "prelu2", "\n".join(report.footer())


# -- the local split: each module's own part judged at the format ------------------------------------------
@pytest.fixture(scope="module")
def resnet8(tmp_path_factory):
    """torchvision resnet18 (TorchScript, BatchNorms folded into the Convs) at 64x64, its int8 QDQ file, and the
    same file with layer3.0.conv1's weight scale x1.02: a change int8's accumulated noise hides in the whole run."""
    import torch
    import torchvision

    d = tmp_path_factory.mktemp("precision-resnet")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, 64, 64))
    model.eval()
    rng = np.random.default_rng(1)
    frames = [rng.standard_normal((1, 3, 64, 64)).astype(np.float32) for _ in range(2)]
    fp32 = _export(model, frames[0], d / "r18.onnx")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(fp32), str(d / "r18-pre.onnx"))
    int8 = _int8(d / "r18-pre.onnx", d / "r18-int8.onnx", [rng.standard_normal((1, 3, 64, 64)).astype(np.float32) for _ in range(16)])
    conv = next(n.output[0] for n in __import__("onnx").load(str(int8)).graph.node if n.name == "/layer3/layer3.0/conv1/Conv")
    scale_weight(int8, d / "r18-int8-w2.onnx", conv, 1.02)
    return {"model": model, "frames": frames, "fp32": fp32, "int8": int8, "fault": d / "r18-int8-w2.onnx", "dir": d}


def test_the_local_split_names_a_fault_the_whole_run_hides(resnet8):
    """A weight 2% off in an int8 file: the whole run's format error (0.04 there, accumulated over 20 modules)
    hides it; the module's own part, run alone at int8 on the reference's inputs, costs 0.005-0.01, and the
    file's part scales its values by 2% against it: named at its own module, by both references, with the
    split in the words."""
    import layertap as lt

    criterion = lt.Criterion(allow_different_weights=True)
    whole = _both(resnet8, resnet8["fault"], criterion=criterion)
    assert all(r.ok for r in whole), [r.first_divergence for r in whole]
    for report in _both(resnet8, resnet8["fault"], criterion=criterion, local=True):
        first = report.first_divergence_row
        assert first is not None and first.path == "layer3.0.bn1", "\n".join(report.footer())  # conv1 is folded into it
        assert first.local_format_rel < first.format_rel / 3 and abs(first.local_impl_gain - 0.02) < 0.005
        assert "% larger than an ideal int8 run's" in report.footer()[-1], report.footer()[-1]
        assert "Local impl" in [c.header for c in report.columns]


def test_healthy_files_pass_their_local_split(resnet8, crepe):
    """Every compared module of a healthy int8 and float16 file passes on its own part, both references; the
    split is there for nearly every row, and it is smaller than the whole run's format error past the start."""
    for files, cand in ((resnet8, resnet8["int8"]), (crepe, crepe["fp16"]), (crepe, crepe["int8"])):
        for report in _both(files, cand, local=True):
            assert report.ok, "\n".join(report.footer())
            split = [r for r in report.rows if r.local_format_rel is not None]
            compared = [r for r in report.rows if r.ok is not None and r.path]
            assert len(split) >= 0.8 * len(compared), [r.name for r in compared if r.local_format_rel is None]
            assert sum(r.local_format_rel <= r.format_rel * 1.01 for r in split) >= 0.9 * len(split)


def test_a_row_that_fails_as_a_whole_but_not_on_its_own_says_where_its_error_comes_from(resnet8):
    """30% on the same weight: the whole run fails there and at every module after it; judged by its own part,
    each later module passes and says that its error comes from before it."""
    import layertap as lt

    scale_weight(resnet8["int8"], resnet8["dir"] / "w30.onnx",
                 next(n.output[0] for n in __import__("onnx").load(str(resnet8["int8"])).graph.node
                      if n.name == "/layer3/layer3.0/conv1/Conv"), 1.3)
    criterion = lt.Criterion(allow_different_weights=True)
    report = lt.compare(resnet8["fp32"], None, resnet8["dir"] / "w30.onnx", samples=[{"x": f} for f in resnet8["frames"]],
                        criterion=criterion, local=True)
    assert report.first_divergence == "layer3.0.bn1", "\n".join(report.footer())
    inherited = [r for r in report.rows if r.ok and "the error comes from before it" in (r.note or "")]
    first = report.rows.index(report.first_divergence_row)
    assert len(inherited) >= 10 and all(report.rows.index(r) > first for r in inherited)
    assert {"layer4.0.bn1", "avgpool", "fc"} <= {r.name for r in inherited}


def test_a_float16_overflow_is_named_with_its_size(torch_mod, tmp_path):
    """A module whose values leave float16's range fails there with the size it reached, even where the
    runtime computes in float32 and the output looks right."""
    import layertap as lt
    from _tiny import pool_cnn

    model = pool_cnn(overflow=1e5)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    fp16 = _fp16(_export(model, x, tmp_path / "big.onnx"), tmp_path / "big16.onnx")
    report = lt.compare(model, torch_mod.from_numpy(x), fp16)
    first = report.first_divergence_row
    assert first is not None and first.path in ("conv2", "relu2"), "\n".join(report.footer())
    assert first.limit.startswith("float16 overflow: |x| up to ") and first.limit.endswith("> 65504")
    assert "float16 overflow" in report.footer()[-1]


# -- OpenVINO at bfloat16 -------------------------------------------------------------------------------
def test_openvino_at_bf16_is_judged_at_bf16(onet, tmp_path):
    import layertap as lt
    from layertap.runtimes import open_runtime

    try:
        if open_runtime("openvino", ov_precision="bf16").describe().precision != "bfloat16":
            pytest.skip("OpenVINO does not run bfloat16 on this CPU")
    except Exception as e:  # noqa: BLE001 - no OpenVINO, or it refuses bf16 here
        pytest.skip(f"OpenVINO at bf16 is not available here: {e}")
    samples = [{"x": c} for c in onet["crops"]]
    report = lt.compare(onet["fp32"], None, onet["fp32"], samples=samples, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"))
    assert report.ok and report.precision == "bfloat16", "\n".join(report.footer())
    conv = _output_tensor(onet["fp32"], "Conv", 2)
    scale_weight(onet["fp32"], tmp_path / "w.onnx", conv, 1.05)
    bad = lt.compare(onet["fp32"], None, tmp_path / "w.onnx", samples=samples, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"), criterion=lt.Criterion(allow_different_weights=True))
    assert bad.first_divergence == "conv3", "\n".join(bad.footer())


# -- the option, the command line, the reports -----------------------------------------------------------
def test_precision_named_by_the_user(crepe):
    import layertap as lt
    from layertap.errors import LayertapError

    samples = [{"x": s} for s in crepe["frames"]]
    # one float32 file run two ways, judged as if the candidate ran at float16: its rows are well within it
    forced = lt.compare(crepe["fp32"], None, crepe["fp32"], samples=samples, runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False), criterion=lt.Criterion(precision="fp16"))
    assert forced.ok and forced.precision == "float16" and all(r.format_rel for r in forced.rows if r.ok is not None)
    with pytest.raises(LayertapError, match="precision int8 judges at a quantiser's scales"):
        lt.compare(crepe["fp32"], None, crepe["fp16"], samples=samples, criterion=lt.Criterion(precision="int8"))
    with pytest.raises(LayertapError, match="unknown precision 'fp8'"):
        lt.compare(crepe["fp32"], None, crepe["fp16"], samples=samples, criterion=lt.Criterion(precision="fp8"))


def test_cli_json_html_and_plot_carry_the_split(crepe, cli, tmp_path):
    from layertap.reports.compare_page import compare_fragment

    npz = tmp_path / "frames.npz"
    np.savez(npz, x=np.concatenate(crepe["frames"]))
    r = cli("compare", str(crepe["fp32"]), str(crepe["int8"]), "--inputs", str(npz), "--json",
            "--report", str(tmp_path / "r.html"), "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["precision"] == "int8" and out["judged_at_format"] and out["rule"].startswith("judged at int8")
    rows = [row for row in out["rows"] if row["ok"] is not None]
    assert all(row["precision"] == "int8" and row["format_rel"] is not None for row in rows if row["path"])
    assert 0.99 < out["ideal_output_cosine"] <= 1 and (tmp_path / "p.png").stat().st_size > 0
    html = (tmp_path / "r.html").read_text()
    assert 'class="band"' in html and "what int8 explains" in html
    fixed = cli("compare", str(crepe["fp32"]), str(crepe["int8"]), "--inputs", str(npz), "--precision", "fp32")
    assert fixed.returncode == 1 and "first divergence" in fixed.stdout
    assert "what float32" not in compare_fragment(_report(crepe))


def _report(crepe):
    import layertap as lt

    return lt.compare(crepe["fp32"], None, crepe["fp32"], samples=[{"x": crepe["frames"][0]}], runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False))


# -- the parts --------------------------------------------------------------------------------------------
def test_limits_of_each_format():
    from layertap.numformats import Format

    f16 = Format("float16")
    assert f16.limit(np.array([1.0, -7e4], np.float32)) == "float16 overflow: |x| up to 7e+04 > 65504"
    assert f16.limit(np.array([1.0, -3.4e38], np.float32)) is None  # float32's stand-in for -inf: float16's -inf holds it
    assert f16.limit(np.array([1.0, -1e9, -1e9], np.float32)) is None  # one repeated fill value: a mask
    assert f16.limit(np.array([1.0, 2e-9], np.float32)) is None and f16.limit(np.full(4, 2e-9, np.float32)).startswith(
        "float16 underflow")
    q = Format.quantised("int8", np.float32(0.01), np.int8(0))
    assert q.limit(np.linspace(-1.27, 1.27, 100, dtype=np.float32)) is None
    assert q.limit(np.linspace(-1.3, 1.3, 100, dtype=np.float32)) is None  # 2% of the values just past the range
    assert q.limit(np.linspace(-10, 10, 100, dtype=np.float32)).startswith("int8 clipping: ")
    relu = Format.quantised("int8", np.float32(0.01), np.int8(-128))  # [0, 2.55]: a ReLU folded into the quantiser
    assert relu.limit(np.linspace(-5, 2.5, 100, dtype=np.float32)) is None


def test_numpy_torch_and_onnx_runtime_round_alike():
    """The three places values are rounded (numpy checks, the PyTorch ideal run, the ONNX ideal graph) agree."""
    import onnx.helper as h
    import torch

    from layertap.numformats import Format, round_on_grid
    from layertap.onnxfile.rounded import rounded_model
    from layertap.pytorch.rounding import round_on_grid as torch_grid
    from layertap.pytorch.rounding import round_tensor

    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32) * 3
    per_channel = Format.quantised("int8", np.array([0.01, 0.02, 0.05], np.float32), np.zeros(3, np.int8), axis=1)
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["a"], ["b"]), h.make_node("Neg", ["b"], ["y"])],
                     "g", [h.make_tensor_value_info("x", 1, [2, 3, 4, 4])], [h.make_tensor_value_info("y", 1, [2, 3, 4, 4])])
    from layertap.runtimes.ort import source_session
    from layertap.runtimes.source import SessionSource

    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    def ideal_session(formats):
        rounded, held = rounded_model(model, Path("."), {}, formats)
        return source_session(SessionSource(rounded, Path("."), held=held), ["a"], optimize=False)

    for fmt in (Format("float16"), Format("bfloat16"), Format.quantised("uint8", np.float32(0.03), np.uint8(7)), per_channel):
        want = fmt.rounded(np.maximum(x, 0))
        got_torch = round_tensor(torch.from_numpy(np.maximum(x, 0)), fmt).numpy()
        got_ort = ideal_session({"a": fmt}).run(["a"], {"x": x})[0]
        np.testing.assert_array_equal(got_torch, want)
        np.testing.assert_allclose(got_ort, want, rtol=0, atol=1e-6)
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    grid = Format.quantised("int8", np.full(4, 0.01, np.float32), np.zeros(4, np.int8), axis=0)
    levels = np.array([127.0, 127.0, 63.0, 31.0], np.float32)
    np.testing.assert_allclose(torch_grid(torch.from_numpy(w), grid, levels).numpy(), round_on_grid(w, grid, levels), atol=1e-6)
    assert len(np.unique(round_on_grid(w, grid, levels)[3])) <= 63


def test_the_ideal_pytorch_run_leaves_the_model_as_it_was(crepe):
    import torch

    from layertap.pytorch.rounding import RoundingPlan, rounded

    model = crepe["model"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.from_numpy(crepe["frames"][0])
    with torch.no_grad():
        exact = model(x)
        with rounded(model, RoundingPlan(regions={"": "float16"})):
            low = model(x)
        again = model(x)
    assert torch.equal(exact, again) and not torch.equal(exact, low)
    assert 0 < float((low - exact).abs().max()) < 1e-2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model._forward_hooks and all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert math.isfinite(float(low.sum()))


def test_repro_packages_the_first_fault_with_what_the_format_explains(crepe, tmp_path):
    """repro's first divergence is the precision-judged one, and repro.py allows the call what float16 explains."""
    import layertap as lt

    bad = crepe["dir"] / "repro-weight.onnx"
    scale_weight(crepe["fp16"], bad, _output_tensor(crepe["fp16"], "Conv", 3), 1.02)
    report = lt.repro(crepe["fp32"], {"x": crepe["frames"][0]}, bad, out=tmp_path / "pkg", criterion=lt.Criterion(allow_different_weights=True))
    assert report.module == "conv4" and report.reproduced, report
    assert any(n.startswith("judged at float16: repro.py allows what float16 explains at this call") for n in report.notes)
    healthy = lt.repro(crepe["fp32"], {"x": crepe["frames"][0]}, crepe["fp16"], out=tmp_path / "pkg2", module="conv4_BN")
    assert not healthy.reproduced  # within what float16 explains: nothing to reproduce
