"""Same model, or refuse: compare checks the reference's parameters against the candidate's first.

Files are made here by the real exporters (dynamo and TorchScript), onnxconverter-common (float16)
and onnxruntime.quantization (int8 QDQ); models are small conv/BatchNorm/linear nets whose
weights and BatchNorm statistics come from a seed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from layertap.errors import LayertapError

onnx = pytest.importorskip("onnx")

EXPORTERS = ["dynamo", "torchscript"]
REFUSAL = re.compile(
    r"^the file's weights are not the model's: \S+ differs \(rel [0-9.e+-]+\), and (\d+) of (\d+) matched "
    r"parameters differ; export this checkpoint again, or pass --allow-different-weights$"
)


def _net(seed: int):
    """Conv-BN-ReLU twice, pool, Linear; weights and BatchNorm statistics from ``seed``."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    ).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return net


def _x():
    import torch

    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def _calib(n: int = 3):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.data = iter([{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(n)])

        def get_next(self):
            return next(self.data, None)

    return Reader()


@pytest.fixture(scope="module")
def files(torch_mod, tmp_path_factory):
    """Per exporter: the file of seed 0, its float16 and int8 QDQ conversions; and the file of seed 1."""
    from onnxconverter_common import float16
    from onnxruntime.quantization import QuantFormat, quantize_static

    d = tmp_path_factory.mktemp("weights")
    out = {}
    for exporter in EXPORTERS:
        made = {}
        for seed in (0, 1):
            path = d / f"{exporter}{seed}.onnx"
            torch_mod.onnx.export(_net(seed), (_x(),), str(path), dynamo=exporter == "dynamo", input_names=["x"])
            made[seed] = path
        fp16 = d / f"{exporter}_fp16.onnx"
        onnx.save(float16.convert_float_to_float16(onnx.load(str(made[0])), keep_io_types=True), str(fp16))
        qdq = d / f"{exporter}_qdq.onnx"
        quantize_static(str(made[0]), str(qdq), _calib(), quant_format=QuantFormat.QDQ, per_channel=True)
        out[exporter] = {"a": made[0], "b": made[1], "fp16": fp16, "qdq": qdq}
    return out


def _edited(src: Path, dst: Path, name: str, factor: float = 1.5) -> Path:
    """A copy of ``src`` with initializer ``name`` scaled by ``factor`` (a hand edit)."""
    from onnx import numpy_helper

    model = onnx.load(str(src))
    init = next(i for i in model.graph.initializer if i.name == name)
    values = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array((values * factor).astype(values.dtype), name))
    onnx.save(model, str(dst))
    return dst


def _row(report, name):
    return next(r for r in report.rows if r.name == name)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_another_seed_is_refused_in_one_line(files, exporter):
    import layertap as lt
    from layertap.comparing.weight_check import DifferentWeightsError

    with pytest.raises(DifferentWeightsError) as err:
        lt.compare(_net(1), _x(), files[exporter]["a"])
    message = str(err.value)
    found = REFUSAL.match(message)
    assert found, message
    # dynamo keeps the parameter names (BatchNorm folded into each Conv weight, recomputed here); TorchScript only the Linear's
    differ, matched = int(found.group(1)), int(found.group(2))
    assert differ == matched == (6 if exporter == "dynamo" else 2), message
    assert isinstance(err.value, LayertapError)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_same_weights_pass_the_check_with_folded_batchnorms(files, exporter):
    import layertap as lt

    report = lt.compare(_net(0), _x(), files[exporter]["a"])
    assert report.ok, str(report)
    assert report.weights.matched == (6 if exporter == "dynamo" else 2)
    assert report.weights.differing == [] and not any(r.weights for r in report.rows)
    assert report.to_dict()["weights"]["matched"] == report.weights.matched


def test_allow_different_weights_compares_anyway(files):
    import layertap as lt

    report = lt.compare(_net(1), _x(), files["dynamo"]["a"], criterion=lt.Criterion(allow_different_weights=True))
    assert report.weights.compared_anyway and not report.ok
    assert any(n.startswith("compared anyway (allow_different_weights): the file's weights are not the model's")
               for n in report.notes), report.notes
    assert not any(r.weights for r in report.rows)  # the note says it once, not on every row


@pytest.mark.parametrize(("exporter", "param", "module"), [("dynamo", "3.weight", "3"), ("torchscript", "8.weight", "8")])
def test_edited_weight_is_named_on_its_module_row(files, tmp_path, exporter, param, module):
    """One weight changed by hand: the comparison runs and the owning module's row names it."""
    import layertap as lt

    bad = _edited(files[exporter]["a"], tmp_path / "edited.onnx", param)
    report = lt.compare(_net(0), _x(), bad)
    assert not report.ok
    assert [m.name for m in report.weights.differing] == [param]
    assert re.fullmatch(rf"{re.escape(param)} differs \(rel 0\.[0-9]+\)", _row(report, module).weights or "")
    assert sum(bool(r.weights) for r in report.rows) == 1
    assert (_row(report, module).remarks or "").startswith(f"{param} differs")  # the table's Note column
    # the folded Conv "3" is compared at its BatchNorm "4"; the Linear "8" at its own row
    assert report.first_divergence == ("4" if exporter == "dynamo" else "8")
    footer = "\n".join(report.footer())
    assert f"weights that differ at or before it, the likely cause: {param} differs" in footer, footer
    assert any(n.startswith(f"1 of {report.weights.matched} matched parameters differ from the model's: {param}")
               for n in report.notes), report.notes
    from layertap.reports.compare_page import explain

    assert f"Weights differ at or before it, the likely cause: {param} differs" in explain(report)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kind", ["fp16", "qdq"])
def test_converted_files_of_the_same_model_are_accepted(files, exporter, kind):
    """float16 and per-channel int8 QDQ copies: read through their formats, no refusal and no finding."""
    import layertap as lt

    cand = files[exporter][kind]
    for ref in (_net(0), files[exporter]["a"]):
        args = _x() if not isinstance(ref, Path) else _x().numpy()
        report = lt.compare(ref, args, cand, metric="sqnr", criterion=lt.Criterion(min_sqnr_db=5))
        assert report.weights.matched >= 2 and report.weights.differing == [], report.weights.to_dict()
        assert not any(r.weights for r in report.rows)
    if exporter == "dynamo":  # file against file: every weight of one naming, the folded ones included
        assert lt.compare(files[exporter]["a"], _x().numpy(), cand, metric="sqnr", criterion=lt.Criterion(min_sqnr_db=5)).weights.matched >= 6


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_files_from_two_seeds_are_refused(files, exporter):
    import layertap as lt
    from layertap.comparing.weight_check import DifferentWeightsError

    with pytest.raises(DifferentWeightsError, match=r"^the candidate's weights are not the reference's: \S+ differs "
                       r"\(rel [0-9.e+-]+\), and \d+ of \d+ matched parameters differ; make both files from one "
                       r"checkpoint, or pass --allow-different-weights$"):
        lt.compare(files[exporter]["a"], _x().numpy(), files[exporter]["b"])
    report = lt.compare(files[exporter]["a"], _x().numpy(), files[exporter]["b"], criterion=lt.Criterion(allow_different_weights=True))
    assert report.weights.compared_anyway and any(n.startswith("compared anyway") for n in report.notes)


def test_weight_damaged_by_a_converter_is_found_in_its_format(files, tmp_path):
    """A float16 file whose Linear weight lost its values is a finding read through float16, not a refusal."""
    import layertap as lt

    bad = _edited(files["dynamo"]["fp16"], tmp_path / "damaged.onnx", "8.weight", factor=0.0)
    report = lt.compare(files["dynamo"]["a"], _x().numpy(), bad)
    assert [m.name for m in report.weights.differing] == ["8.weight"]
    assert _row(report, "8").weights == "8.weight differs (rel 1)"


def test_cli_other_architecture_refused_in_one_line(resnet_onnx_dynamo, cli):
    """``compare torchvision:resnet50 r18.onnx``: refused before any forward, in one line."""
    proc = cli("compare", "torchvision:resnet50", str(resnet_onnx_dynamo))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("layertap: error: the file's weights are not the model's: "), proc.stderr
    # resnet50's bottleneck convs have other shapes than resnet18's: the line says so
    assert re.search(r"matched parameters differ, \d+ of them in shape \(layer1\.0\.conv1\.weight: 64x64x3x3 in "
                     r"the file, 64x64x1x1 in the model\); export this checkpoint again, or pass "
                     r"--allow-different-weights$", lines[0]), lines[0]


def test_cli_allow_different_weights(resnet_onnx_dynamo, cli):
    """``compare torchvision:resnet18`` (its own random weights) against another resnet18's file."""
    proc = cli("compare", "torchvision:resnet18", str(resnet_onnx_dynamo), "--input", "2x3x64x64")
    assert proc.returncode == 2 and REFUSAL.match(proc.stderr.strip().removeprefix("layertap: error: ")), proc.stderr
    proc = cli("compare", "torchvision:resnet18", str(resnet_onnx_dynamo), "--input", "2x3x64x64",
               "--allow-different-weights", "--json")
    assert proc.returncode == 1, proc.stderr
    import json

    summary = json.loads(proc.stdout)
    assert summary["weights"]["compared_anyway"] is True
    assert any(n.startswith("compared anyway") for n in summary["notes"])


def _bfloat16_copy(src: Path, dst: Path) -> Path:
    """``src`` with every float weight stored as bfloat16 and widened back by a ``Cast`` before use."""
    import ml_dtypes
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    casts = []
    for init in graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or init.name.startswith("val_"):
            continue
        name = init.name
        values = numpy_helper.to_array(init).astype(ml_dtypes.bfloat16)
        init.CopyFrom(helper.make_tensor(f"{name}_bf16", onnx.TensorProto.BFLOAT16, values.shape,
                                         values.view(np.uint16).tobytes(), raw=True))
        casts.append(helper.make_node("Cast", [f"{name}_bf16"], [name], to=onnx.TensorProto.FLOAT))
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(dst))
    return dst


def test_bfloat16_weights_read_through_their_cast(files, tmp_path):
    """Weights stored as bfloat16 under a new name, widened by a ``Cast`` to the parameter's name: no finding."""
    import layertap as lt

    bf16 = _bfloat16_copy(files["torchscript"]["a"], tmp_path / "bf16.onnx")
    report = lt.compare(_net(0), _x(), bf16, metric="sqnr", criterion=lt.Criterion(min_sqnr_db=20))
    assert report.weights.matched == 2 and report.weights.differing == [], report.weights.to_dict()
    with pytest.raises(LayertapError, match="the file's weights are not the model's"):
        lt.compare(_net(1), _x(), bf16)


def test_weights_in_an_external_data_file_are_read_and_left_there(files, tmp_path):
    import layertap as lt

    path = tmp_path / "ext.onnx"
    onnx.save(onnx.load(str(files["dynamo"]["a"])), str(path), save_as_external_data=True, location="ext.onnx.data",
              size_threshold=64)  # the weights, not the small shape constants ORT must read inline
    before = path.read_bytes()
    assert lt.compare(_net(0), _x(), path).weights.matched == 6
    with pytest.raises(LayertapError, match=r"and 6 of 6 matched parameters differ"):
        lt.compare(_net(1), _x(), path)
    assert path.read_bytes() == before


def test_ort_optimised_copy_that_lost_the_fold_records(files):
    """ONNX Runtime's saved copy keeps the folded Conv weights' names but not the exporter's records (scopes,
    folds): the model exported again lends them back, so each Conv weight and bias is checked through its
    BatchNorm as in the exporter's own file, inside the FusedConv that now holds it; nothing is taken for another
    checkpoint, and another seed is still refused."""
    import onnxruntime as ort

    import layertap as lt

    opt = files["dynamo"]["a"].with_name("dynamo0_opt.onnx")  # beside its source: it reads the same data file
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(opt)
    ort.InferenceSession(str(files["dynamo"]["a"]), so, providers=["CPUExecutionProvider"])
    assert not any(p.key == "pkg.onnxscript.rewriter.rule_name" for n in onnx.load(str(opt)).graph.node
                   for p in n.metadata_props)
    report = lt.compare(_net(0), _x(), opt)
    assert any("took theirs from a fresh dynamo export" in n for n in report.notes), report.notes
    # both Convs' weights and biases through their BatchNorms, and the Linear's: as in the exporter's file
    assert report.weights.matched == 6 and report.weights.differing == [], report.weights.to_dict()
    with pytest.raises(LayertapError, match=r"^the file.s weights are not the model.s: 0\.weight differs \(rel "):
        lt.compare(_net(1), _x(), opt)


def _candidate_runs(monkeypatch, cand: Path) -> list[str]:
    """Records, in order, each run of the candidate file and each parameter the weight check read (with its thread)."""
    import threading

    from layertap.comparing import onnx_side
    from layertap.comparing import weight_check as weights

    events: list[str] = []
    run = onnx_side.OrtSide.run
    monkeypatch.setattr(onnx_side.OrtSide, "run", lambda self, names, feed: (
        events.append("candidate run") if self.path == cand else None) or run(self, names, feed))
    differs = weights._differs
    monkeypatch.setattr(weights, "_differs", lambda name, r, c: (
        events.append(f"checked on {threading.current_thread().name}")) or differs(name, r, c))
    return events


@pytest.mark.parametrize("reference", ["model", "file"])
def test_weight_check_runs_on_its_thread_and_refuses_before_the_candidate_runs(files, monkeypatch, reference):
    """The check runs beside the sides' work, on a worker thread; another checkpoint is still refused
    before the candidate's first run, and the same checkpoint's rows come after the whole check."""
    import layertap as lt
    from layertap.comparing.weight_check import DifferentWeightsError

    cand = files["dynamo"]["a"]
    events = _candidate_runs(monkeypatch, cand)
    other = _net(1) if reference == "model" else files["dynamo"]["b"]
    x = _x() if reference == "model" else _x().numpy()
    with pytest.raises(DifferentWeightsError):
        lt.compare(other, x, cand)
    assert events and "candidate run" not in events, events
    assert set(events) == {"checked on layertap-weight-check"}, events
    events.clear()
    same = _net(0) if reference == "model" else files["dynamo"]["fp16"]
    report = lt.compare(same, x, cand) if reference == "model" else lt.compare(same, x, cand, metric="cosine")
    assert report.weights.matched == 6 and report.ok, report.weights.to_dict()
    checks = [i for i, e in enumerate(events) if e.startswith("checked")]
    assert len(checks) == 6 and checks[-1] < events.index("candidate run"), events


def test_weight_check_stops_when_asked():
    """A comparison that ends early (an error, a signal) stops its check at the next parameter."""
    import threading

    from layertap.comparing.weight_check import PendingCheck, judge

    read: list[str] = []

    class Param:
        def __init__(self, name: str) -> None:
            self.name = name

        def read(self):
            read.append(self.name)
            return np.zeros(3, np.float32), 0.0

    stop = threading.Event()
    stop.set()
    assert judge([("w", Param("w").read, Param("w"))], "model", "file", stop=stop).matched == 0 and read == []
    started = threading.Event()

    def slow(stop: threading.Event):
        started.set()
        stop.wait(10)  # a long check that notices the request
        return judge([(n, Param(n).read, Param(n)) for n in "abc"], "model", "file", stop=stop)

    pending = PendingCheck(slow, allow=False)
    assert started.wait(10)
    pending.cancel()
    assert pending.result().matched == 0 and read == []


@pytest.mark.parametrize("shape", [(70000,), (512, 256, 1, 1), (64, 3, 7, 7), (3, 40000)])
def test_blockwise_check_agrees_with_the_whole_array_rule(shape):
    """:func:`within` (block by block) says what ``all(|c - r| <= (ra + ca) * 1.01)`` says, with
    allowances as numbers, whole arrays and per-channel arrays, wherever the one bad element is."""
    from layertap.comparing.weight_check import within
    from layertap.onnxfile.weights import Allowance

    rng = np.random.default_rng(0)
    r = rng.standard_normal(shape).astype(np.float32)
    per_channel = (1 + np.abs(rng.standard_normal((shape[0],) + (1,) * (len(shape) - 1)))).astype(np.float32) * 1e-3
    for r_allow, c_allow in [(Allowance(), Allowance(floor=1e-3)), (Allowance(rel=1e-3), Allowance()),
                             (Allowance(floor=per_channel), Allowance(rel=2.0**-11, floor=1e-7))]:
        for where in (None, 0, r.size // 2, r.size - 1):
            c = r * (1 + rng.uniform(-1e-5, 1e-5, shape)).astype(np.float32)  # well within every allowance
            if where is not None:
                c.reshape(-1)[where] += np.float32(1.0)
            whole = (np.abs(r) * np.float32(r_allow.rel) + np.float32(0) + np.asarray(r_allow.floor, np.float32)
                     + np.abs(c) * np.float32(c_allow.rel) + np.asarray(c_allow.floor, np.float32))
            naive = bool(np.all(np.abs(c - r) <= whole * np.float32(1.01)))
            assert within(r, c, r_allow, c_allow) == naive == (where is None)


def test_external_weights_are_read_mapped_from_their_file_unless_it_cannot_hold_them(tmp_path):
    """A weight in external data is read mapped from its file (read-only: nothing copied, the file
    untouched), the same values as onnx reads; a data file too short for it is left to onnx's reader."""
    import onnx.helper as h
    from onnx import numpy_helper

    from layertap.onnxfile.modelfile import read_model
    from layertap.onnxfile.weights import file_params

    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float16)
    g = h.make_graph([h.make_node("MatMul", ["x", "fc.weight"], ["y"])], "g", [h.make_tensor_value_info("x", 10, [1, 64])],
                     [h.make_tensor_value_info("y", 10, [1, 32])], [numpy_helper.from_array(w, "fc.weight")])
    path = tmp_path / "m.onnx"
    onnx.save_model(h.make_model(g), str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    before = (tmp_path / "m.data").read_bytes()
    mf = read_model(path)
    value, allowance = file_params(mf.model, mf.folder)["fc.weight"].read()
    assert value.dtype == np.float32 and np.array_equal(value, w.astype(np.float32))
    assert np.allclose(allowance.of(value), np.abs(value) * 2.0**-11 + 1.2e-7)
    from layertap.onnxfile.weights import _mapped

    mapped = _mapped(mf.model.graph.initializer[0], mf.folder)
    assert mapped is not None and not mapped.flags.writeable and np.array_equal(mapped, w)
    assert (tmp_path / "m.data").read_bytes() == before
    (tmp_path / "m.data").write_bytes(before[:100])  # shorter than the weight
    assert _mapped(mf.model.graph.initializer[0], mf.folder) is None
    with pytest.raises(Exception):  # noqa: B017 - onnx's own error for a truncated data file
        file_params(mf.model, mf.folder)["fc.weight"].read()
