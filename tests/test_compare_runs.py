"""Compare any two runs: ONNX vs ONNX (float16, int8 QDQ, ORT-optimised, the other
exporter, the same file run two ways), many samples, metrics, --local, --fp16-block-list,
providers, bad inputs. Every conversion is made here with the real converters."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from layertap.errors import LayertapError

onnx = pytest.importorskip("onnx")


def _row(report, name):
    return next(r for r in report.rows if r.name == name)


# -- a small model whose float32 values leave the float16 range -------------------------------
def _big_net(torch_mod):
    nn = torch_mod.nn

    class Big(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.norm = nn.LayerNorm(16)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.norm(self.fc1(x)))

    torch_mod.manual_seed(0)
    net = Big().eval()
    with torch_mod.no_grad():
        net.fc1.weight.mul_(2e4)  # |fc1(x)| ~ 1e4 * |x|: beyond 65504 for inputs of magnitude ~10
    return net


def _fp16(src: Path, dst: Path, block: list[str] | None = None) -> Path:
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True, node_block_list=block)
    onnx.save(model, str(dst))
    return dst


@pytest.fixture(scope="module")
def big(torch_mod, tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    net = _big_net(torch_mod)
    x = torch_mod.randn(2, 8, generator=torch_mod.Generator().manual_seed(1))
    fp32 = d / "big.onnx"
    torch_mod.onnx.export(net, (x,), str(fp32), dynamo=False, input_names=["x"], output_names=["y"])
    return net, x, fp32, _fp16(fp32, d / "big16.onnx")


def _samples(scales):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((2, 8)).astype(np.float32)
    return [{"x": base * s} for s in scales]


def test_sample_dependent_overflow_found_on_the_right_sample(big):
    import layertap as lt

    _, _, fp32, fp16 = big
    report = lt.compare(fp32, None, fp16, samples=_samples([0.01, 20.0, 0.02]), metric="cosine", criterion=lt.Criterion(check_finite=True))
    assert not report.ok
    fc1 = _row(report, "fc1")
    assert fc1.ok is False and fc1.finite is False and fc1.worst_sample == 1
    assert report.first_divergence == "fc1" and report.first_nonfinite.name == "fc1"
    assert report.first_divergence_counts == {"fc1": 1}
    assert "first non-finite values: fc1" in str(report)
    small = lt.compare(fp32, None, fp16, samples=_samples([0.01, 0.02]), metric="cosine")
    assert small.ok, str(small)


def test_fp16_block_list_round_trip(big, tmp_path):
    """The written list, given to convert_float_to_float16 with the options it names, makes the comparison pass."""
    import layertap as lt
    from layertap.fixing.convert import FP16_OPTIONS

    _, _, fp32, fp16 = big
    samples = _samples([20.0])
    bad = lt.compare(fp32, None, fp16, samples=samples, metric="cosine")
    assert not bad.ok
    out = tmp_path / "block.json"
    found = lt.fix(fp32, None, to="fp16", out=None, samples=samples, search_options=lt.SearchOptions(rank_report=bad))
    found.write_nodes(out)
    names = json.loads(out.read_text())
    assert found.ok and names == found.nodes
    from onnxconverter_common import float16

    fixed = tmp_path / "fixed16.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), node_block_list=names, **FP16_OPTIONS), str(fixed))
    good = lt.compare(fp32, None, fixed, samples=samples, metric="cosine")
    assert good.ok, str(good)
    assert _row(good, "fc1").finite is True


def test_pytorch_reference_with_samples_and_metrics(big):
    import layertap as lt

    net, x, _, fp16 = big
    report = lt.compare(net, x * 0.01, fp16, samples=3, metric="sqnr", criterion=lt.Criterion(min_sqnr_db=20))
    assert report.samples == 3
    norm = _row(report, "norm")
    assert norm.sqnr_db is not None and norm.cosine is not None and norm.worst_sample in (0, 1, 2)
    with pytest.raises(LayertapError, match="unknown metric"):
        lt.compare(net, x, fp16, metric="l2")


# -- resnet18 variants: QDQ int8, ORT-optimised, the other exporter, the same file twice ------
@pytest.fixture(scope="module")
def r18(torch_mod, tmp_path_factory):
    import torchvision

    d = tmp_path_factory.mktemp("r18runs")
    torch_mod.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch_mod.randn(1, 3, 32, 32, generator=torch_mod.Generator().manual_seed(2))
    ts = d / "ts.onnx"
    torch_mod.onnx.export(model, (x,), str(ts), dynamo=False, input_names=["x"])
    return model, x, ts, d


def test_int8_qdq_compared_through_dequantize(r18):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    import layertap as lt

    _, x, ts, d = r18

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.data = iter([{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.data, None)

    q = d / "q.onnx"
    quantize_static(str(ts), str(q), Reader(), quant_format=QuantFormat.QDQ)
    report = lt.compare(ts, {"x": x.numpy()}, q, metric="sqnr", criterion=lt.Criterion(min_sqnr_db=5))
    assert report.ok, str(report)
    compared = [r for r in report.rows if r.ok is not None]
    assert len(compared) >= 30
    assert any(n.endswith("_DequantizeLinear_Output") for r in compared for n in r.onnx)
    judged = lt.compare(ts, {"x": x.numpy()}, q)  # judged at int8: the quantiser's own rounding passes
    assert judged.ok and judged.precision == "int8", judged.footer()
    strict = lt.compare(ts, {"x": x.numpy()}, q, rtol=1e-3)  # a tolerance the user sets decides: int8 is not that close
    assert not strict.ok


def test_ort_optimised_copy_and_same_file_two_ways(r18):
    import onnxruntime as ort

    import layertap as lt

    _, x, ts, d = r18
    opt = d / "opt.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(opt)
    ort.InferenceSession(str(ts), so, providers=["CPUExecutionProvider"])
    report = lt.compare(ts, x.numpy(), opt)
    assert report.ok, str(report)
    assert sum(r.status == "pass" for r in report.rows) >= 30
    # one file, ORT with and without graph optimisations as the two sides
    twice = lt.compare(ts, x.numpy(), ts, samples=2, runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False))
    assert twice.ok and twice.samples == 2
    assert any("ORT_DISABLE_ALL" in n for n in twice.notes)
    with pytest.raises(LayertapError, match="same file"):
        lt.compare(ts, x.numpy(), ts)


def test_a_tensor_several_calls_hand_out_is_judged_once_per_sample(r18, monkeypatch):
    import dataclasses

    import layertap as lt
    from layertap.comparing import align
    from layertap.metrics import Criterion

    _, x, ts, d = r18
    fp16 = _fp16(ts, d / "ts16.onnx")
    feeds = [{"x": x.numpy() * s} for s in (1.0, 2.0)]
    judged = []
    judge = Criterion.judge
    monkeypatch.setattr(Criterion, "judge", lambda self, r, g: judged.append(1) or judge(self, r, g))
    report = lt.compare(ts, None, fp16, samples=feeds, metric="cosine")
    compared = [r for r in report.rows if r.status in ("pass", "FAIL")]
    by_tensor: dict = {}
    for row in compared:
        by_tensor.setdefault(tuple(row.onnx), []).append(row)
    shared = [rows for rows in by_tensor.values() if len(rows) > 1]
    assert shared, "resnet18's blocks hand out their last ReLU's tensor: several rows share it"
    assert len(judged) == len(by_tensor) * len(feeds) < len(compared) * len(feeds)
    for rows in shared:  # every row of a shared tensor holds the same figures
        assert len({(r.max_abs, r.cosine, r.sqnr_db, r.worst_sample) for r in rows}) == 1, [r.name for r in rows]
    # the rows are those of judging every row on its own
    monkeypatch.setattr(align.RowBuilder, "_judge", align.RowBuilder.judge_pair)
    each = lt.compare(ts, None, fp16, samples=feeds, metric="cosine")
    assert [dataclasses.asdict(r) for r in each.rows] == [dataclasses.asdict(r) for r in report.rows]


def test_ort_enable_all_copy_read_through_its_nchwc_layout(r18):
    """ORT's default level (ORT_ENABLE_ALL) saves x86 files whose Convs run in a blocked NCHWc
    layout under new tensor names: each is read back as NCHW, and a fault is found there."""
    import onnxruntime as ort
    from onnx import numpy_helper

    import layertap as lt
    from layertap.runtimes.ort_kernels import NCHWC_DOMAIN, nchwc_block_size

    model, x, ts, d = r18
    full = d / "all.onnx"
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(full)
    so.log_severity_level = 3
    ort.InferenceSession(str(ts), so, providers=["CPUExecutionProvider"])
    m = onnx.load(str(full))
    if nchwc_block_size() is None or not any(n.domain == NCHWC_DOMAIN for n in m.graph.node):
        pytest.skip("this CPU / onnxruntime has no NCHWc kernels")
    report = lt.compare(ts, x.numpy(), full)
    assert report.ok, str(report)
    passed = [r for r in report.rows if r.status == "pass"]
    assert len(passed) >= 30 and sum(any(n.startswith("reorder_token") for n in r.onnx) for r in passed) >= 20
    assert {"layer1.0", "layer2.1.relu#1", "layer4"} <= {r.name for r in passed}  # Convs with the residual Add fused in
    node = next(n for n in m.graph.node if n.name == "/layer2/layer2.1/relu/Relu_output_0_nchwc")
    init = next(i for i in m.graph.initializer if i.name == node.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    bad = d / "all_bad.onnx"
    onnx.save(m, str(bad))
    faulty = lt.compare(ts, x.numpy(), bad, local=True)
    assert faulty.first_divergence == "layer2.1.relu#0"
    assert _row(faulty, "layer2.0").ok is True
    # --local feeds the NCHWc parts the reference's values in their blocked layout
    assert _row(faulty, "layer2.1.relu#0").local_rel > 0.1
    later = [r for r in faulty.rows if r.name.startswith(("layer3.", "layer4.")) and r.local_rel is not None]
    assert len(later) >= 8 and max(r.local_rel for r in later) < 1e-4, [(r.name, r.local_rel) for r in later]
    assert "max|cand - ref| / max|ref|" in "\n".join(faulty.footer())
    # a PyTorch reference cannot read the blocked tensors: never a false FAIL, and the note says what to do
    direct = lt.compare(model, x, full)
    assert direct.ok and any("compare SRC.onnx THIS.onnx" in n for n in direct.notes), direct.notes


def test_onnxslim_simplified_copy(r18):
    onnxslim = pytest.importorskip("onnxslim")
    import layertap as lt

    _, x, ts, d = r18
    slim = d / "slim.onnx"
    onnx.save(onnxslim.slim(onnx.load(str(ts))), str(slim))
    report = lt.compare(ts, x.numpy(), slim)
    assert report.ok, str(report)
    assert sum(r.status == "pass" for r in report.rows) >= 40


def test_other_exporter_aligned_by_scopes(torch_mod, r18):
    import layertap as lt

    model, x, ts, d = r18
    dyn = d / "dyn.onnx"
    torch_mod.onnx.export(model, (x,), str(dyn), dynamo=True)
    report = lt.compare(dyn, x.numpy(), ts)  # input names differ: matched by position
    assert report.ok, str(report)
    assert {"layer2.0.relu#1", "layer4", "fc"} <= {r.name for r in report.rows if r.status == "pass"}


def test_local_error_names_the_perturbed_module(torch_mod, r18):
    """A perturbed weight: large local error at its module, near zero at every module after it."""
    from onnx import numpy_helper

    import layertap as lt

    model, x, ts, d = r18
    m = onnx.load(str(ts))
    node = next(n for n in m.graph.node if n.name == "/layer2/layer2.1/conv1/Conv")
    init = next(i for i in m.graph.initializer if i.name == node.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    bad = d / "perturbed.onnx"
    onnx.save(m, str(bad))
    for ref in (ts, model):
        report = lt.compare(ref, x.numpy() if ref is ts else x, bad, local=True)
        assert report.first_divergence == "layer2.1.bn1"
        assert _row(report, "layer2.1.bn1").local_rel > 0.1
        later = [r for r in report.rows if r.name.startswith(("layer3.", "layer4.")) and r.local_rel is not None]
        assert later and all(r.ok is False for r in later if r.name.endswith("bn2"))
        assert max(r.local_rel for r in later) < 1e-4, [(r.name, r.local_rel) for r in later]
        if ref is model:  # an internal tensor (a residual Add) has no PyTorch value: the row says so
            assert any("no reference value" in (r.note or "") for r in report.rows)


def test_pytorch_reference_batches_share_one_session_per_batch_across_samples(torch_mod, r18):
    """Several ORT batches and several samples: each batch's session is built once for all the
    samples, rows and local errors equal those of one big batch, RAM stays within the budget."""
    import layertap as lt

    model, x, ts, d = r18
    xs = [x, x * 0.5, -x]
    whole = lt.compare(model, x, ts, samples=xs, local=True)
    parts = lt.compare(model, x, ts, samples=xs, local=True, runtime_options=lt.RuntimeOptions(batch_outputs=8))
    assert whole.ort_runs == 3 and whole.samples == 3
    n_batches = parts.ort_runs // 3
    assert n_batches > 2 and parts.ort_runs == 3 * n_batches
    assert any(f"{n_batches} ORT session(s) for all of them" in n for n in parts.notes), parts.notes
    assert [r.name for r in parts.rows] == [r.name for r in whole.rows]
    def same(a, b):  # ORT fuses differently when other tensors are exposed: float noise only
        return (a is None) == (b is None) and (a is None or abs(a - b) < 1e-5)

    for a, b in zip(whole.rows, parts.rows):
        assert (a.status, a.onnx) == (b.status, b.onnx), a.name
        assert same(a.rel_err, b.rel_err) and same(a.local_rel, b.local_rel), (a.name, a.rel_err, b.rel_err)
    assert sum(r.local_rel is not None for r in parts.rows) >= 20
    # a budget too small for one sample's values: they wait on disk, the rows do not change
    tight = lt.compare(model, x, ts, samples=xs, runtime_options=lt.RuntimeOptions(batch_outputs=8, memory_budget=1 << 16))
    assert [(r.name, r.status) for r in tight.rows] == [(r.name, r.status) for r in parts.rows]
    assert all(same(a.rel_err, b.rel_err) for a, b in zip(tight.rows, parts.rows))
    assert any("held on disk" in n for n in tight.notes), tight.notes


# -- CLI ------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layertap", *args], capture_output=True, text=True, timeout=600)


def test_cli_onnx_reference_never_imports_torch(big, tmp_path):
    _, _, fp32, fp16 = big
    code = (
        "import sys\nfrom layertap.cli.main import main\n"
        f"rc = main(['compare', {str(fp32)!r}, {str(fp16)!r}, '--input', '2x8', '--metric', 'cosine', '--json'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metric"] == "cosine"


def test_cli_inputs_folder_and_block_list(big, tmp_path):
    _, _, fp32, fp16 = big
    folder = tmp_path / "samples"
    folder.mkdir()
    for i, s in enumerate(_samples([0.01, 20.0])):
        np.save(folder / f"s{i}.npy", s["x"])
    out = tmp_path / "block.json"
    r = _cli("compare", str(fp32), str(fp16), "--inputs", str(folder), "--metric", "cosine", "--check-finite",
             "--fp16-block-list", str(out))
    assert r.returncode == 1, r.stderr
    assert "first non-finite values: fc1" in r.stdout and "Worst sample" in r.stdout
    assert "/fc1/Gemm" in json.loads(out.read_text())


def test_cli_bad_inputs_are_exit_2_and_write_nothing(big, r18, tmp_path):
    _, _, fp32, fp16 = big
    _, _, ts, _ = r18
    plot = tmp_path / "p.png"
    r = _cli("compare", str(ts), str(fp32), "--plot", str(plot))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "layertap: error:" in r.stderr
    assert not plot.exists()
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip file")
    r = _cli("compare", str(fp32), str(fp16), "--inputs", str(broken))
    assert r.returncode == 2 and "broken.npz" in r.stderr and r.stderr.count("\n") == 1
    r = _cli("compare", str(fp32), str(fp32), "--cand-providers", "NoSuchEP")
    assert r.returncode == 2 and "CPUExecutionProvider" in r.stderr
    r = _cli("compare", str(fp32), str(fp32), "--no-ort-opt")
    assert r.returncode == 0, r.stderr


def test_not_variants_of_one_model(tmp_path):
    """Two unrelated files: no module scope or tensor name in common."""
    from onnx import TensorProto, helper

    import layertap as lt
    from layertap.errors import OnnxFileError

    def model(path, op, name):
        vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
        g = helper.make_graph([helper.make_node(op, ["x"], [name]), helper.make_node("Neg", [name], ["y"])], "g",
                              [vi("x")], [vi("y")])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    a, b = model(tmp_path / "a.onnx", "Relu", "r"), model(tmp_path / "b.onnx", "Sigmoid", "s")
    with pytest.raises(OnnxFileError, match="variants of one model"):
        lt.compare(a, None, b)


# -- inputs generated from the reference file's declared shapes ------------------------------
def _image_and_text_net(torch_mod):
    nn = torch_mod.nn

    class Gate(nn.Module):
        def forward(self, e, mask):
            return e * mask.unsqueeze(-1).to(e.dtype)

    class ImageAndText(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.emb = nn.Embedding(100, 8)
            self.gate = Gate()

        def forward(self, img, ids, attention_mask):
            return self.conv(img).mean(), self.gate(self.emb(ids), attention_mask)

    torch_mod.manual_seed(0)
    return ImageAndText().eval()


def test_onnx_reference_without_inputs_generates_them_as_run_does(torch_mod, tmp_path):
    """No inputs given: images 224x224, masks all ones, every other symbolic size 1."""
    import layertap as lt

    net = _image_and_text_net(torch_mod)
    args = (torch_mod.randn(1, 3, 32, 32), torch_mod.zeros(1, 5, dtype=torch_mod.long), torch_mod.ones(1, 5, dtype=torch_mod.long))
    path = tmp_path / "dyn.onnx"
    axes = {"img": {0: "batch", 2: "h", 3: "w"}, "ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    torch_mod.onnx.export(net, args, str(path), dynamo=False, input_names=list(axes), dynamic_axes=axes)
    report = lt.compare(path, None, path, samples=2, runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False))
    conv, emb, gate = (_row(report, n) for n in ("conv", "emb", "gate"))
    assert list(conv.shape) == [1, 4, 112, 112] and list(emb.shape) == [1, 1, 8]
    assert report.ok and gate.ref_max == emb.ref_max  # the mask passes every embedding value through


def test_pytorch_reference_samples_drawn_like_the_example(torch_mod, tmp_path):
    """Further samples: the example's shapes and dtypes, ids below its largest id + 1, masks kept."""
    import layertap as lt
    from layertap.pytorch.values import random_like

    torch_mod.manual_seed(0)
    net = torch_mod.nn.Sequential(torch_mod.nn.Embedding(10, 4), torch_mod.nn.Linear(4, 2)).eval()
    ids, mask = torch_mod.tensor([[9, 0, 3]]), torch_mod.tensor([True, False])
    path = tmp_path / "emb.onnx"
    torch_mod.onnx.export(net, (ids,), str(path), dynamo=False)
    report = lt.compare(net, ids, path, samples=4)
    assert report.ok and report.samples == 4 and {r.worst_sample for r in report.rows} <= {0, 1, 2, 3}
    drawn, kept = random_like((ids, mask), seed=1)
    assert drawn.dtype == torch_mod.int64 and drawn.shape == ids.shape and int(drawn.max()) < 10 and kept is mask
    assert torch_mod.equal(drawn, random_like((ids,), seed=1)[0]) and not torch_mod.equal(drawn, random_like((ids,), seed=2)[0])


def test_both_references_run_through_one_driver_with_the_same_batches_and_notes(torch_mod, tmp_path):
    """A PyTorch reference and an ONNX reference, in batches over several samples: the same
    batch plan and run order (one session per batch for all samples), the same notes on batches
    and sessions, and the rows of one big batch."""
    import layertap as lt
    from _tiny import small_cnn

    model, x = small_cnn(), torch_mod.randn(1, 3, 16, 16, generator=torch_mod.Generator().manual_seed(0))
    path = tmp_path / "cnn.onnx"
    torch_mod.onnx.export(model, (x,), str(path), dynamo=False)
    xs = [x, x * 0.5, -x]
    torch_ref = dict(ref=model, args=x, samples=xs)
    onnx_ref = dict(ref=str(path), args=None, samples=[{"input.1": a.numpy()} for a in xs])
    for sides, kw, runs in ((1, torch_ref, lt.RuntimeOptions()), (2, onnx_ref, lt.RuntimeOptions(ref_ort_optimizations=False))):
        whole = lt.compare(cand=path, **kw, runtime_options=runs)  # an ONNX reference runs in ORT too
        parts = lt.compare(cand=path, **kw, runtime_options=replace(runs, batch_outputs=1))
        n_batches = parts.ort_runs // (3 * sides)
        assert n_batches > 2 and parts.ort_runs == 3 * sides * n_batches, parts.ort_runs
        assert any(f"ONNX Runtime ran {3 * n_batches} times" in n and "in batches" in n for n in parts.notes), parts.notes
        said = [n for n in parts.notes if n.startswith("3 samples") and n.endswith("ORT session(s) for all of them")]
        sessions = int(said[0].split("; ")[-1].split()[0]) if said else 0
        assert sides * 2 < sessions <= sides * n_batches, parts.notes  # a session per batch, not per run
        assert [(r.name, r.status) for r in parts.rows] == [(r.name, r.status) for r in whole.rows]
        assert whole.ok and parts.ok and len(whole.rows) > 5


def test_onnx_reference_draws_token_ids_below_the_embedding_table(torch_mod, tmp_path):
    """No inputs given, a vocabulary of 10: random ids stay below 10 (as ``run`` draws them), so
    ONNX Runtime accepts every sample instead of refusing an out-of-range Gather index."""
    import layertap as lt

    torch_mod.manual_seed(0)
    net = torch_mod.nn.Sequential(torch_mod.nn.Embedding(10, 4), torch_mod.nn.Linear(4, 2)).eval()
    path = tmp_path / "emb.onnx"
    torch_mod.onnx.export(net, (torch_mod.tensor([[1, 2, 3]]),), str(path), dynamo=False, input_names=["ids"],
                          dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    report = lt.compare(path, None, path, samples=3, runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False))
    assert report.ok and report.samples == 3, str(report)
    assert [r.shape for r in report.rows][0] == [1, 1, 4]


def test_onnx_runtime_reports_the_providers_that_ran_not_those_asked_for(tmp_path):
    import warnings

    import onnx.helper as h

    from layertap.runtimes.ort import OrtRuntime
    from layertap.runtimes.source import SessionSource

    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", 1, [2])],
                     [h.make_tensor_value_info("y", 1, [2])])
    source = SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path)
    rt = OrtRuntime("cpu")
    # a provider ORT cannot load here: it builds the session on CPU with only a warning
    rt.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = rt.open(source)
    assert engine.run(None, {"x": np.array([-1.0, 2.0], np.float32)})["y"].tolist() == [0.0, 2.0]
    info = rt.describe()
    assert info.device == "CPU" and info.note == "CUDA was asked for but did not load: ONNX Runtime ran on CPU"
    assert info.text().endswith("(CUDA was asked for but did not load: ONNX Runtime ran on CPU)")
    assert OrtRuntime("cpu").describe().to_dict() == {"runtime": "ONNX Runtime", "version": info.version, "device": "CPU",
                                                      "precision": "the file's own types"}


def test_sessions_do_not_spin(r18):
    """layertap's ORT sessions wait for work without spinning: a spinning pool takes the cores the
    other side's run and the statistics need between runs (see benchmarks/bench_compare.py)."""
    from layertap.onnxfile.modelfile import read_model
    from layertap.runtimes.ort import source_session
    from layertap.runtimes.source import SessionSource

    mf = read_model(r18[2])
    sess = source_session(SessionSource.with_weights_held(mf.model, mf.folder))
    assert sess.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


# -- the runs beside the rows ------------------------------------------------------------------
def _pipeline_events(budget: int, nbytes: int, n: int = 3):
    """Driver._pipeline over ``n`` jobs whose runs hand out ``nbytes``: what ran where, in order.
    The rows of a job wait (up to 10 s, when the two jobs' values fit the budget) for the next
    job's run to start: with the runs beside the rows they never wait long, one at a time never
    see it start."""
    import threading

    from layertap.comparing.driver import Driver, Job, Values

    events: list[tuple[str, int, str]] = []
    running = [threading.Event() for _ in range(n)]
    driver = Driver(reference=None, candidate=None, local=False, progress=None)  # type: ignore[arg-type]

    def fetch(job):
        running[job.batch[0]].set()
        events.append(("run", job.batch[0], threading.current_thread().name))
        return Values({}, {"t": np.zeros(nbytes, np.uint8)})

    def judge(job, fetched):
        i = job.batch[0]
        if i + 1 < n:
            events.append(("next run beside", i, str(running[i + 1].wait(10 if budget >= 2 * nbytes else 0))))
        events.append(("rows", i, threading.current_thread().name))

    driver._fetch, driver._judge = fetch, judge  # type: ignore[method-assign]
    driver._pipeline(iter([Job(object(), [i]) for i in range(n)]), budget)  # type: ignore[arg-type]
    return events


def test_each_run_goes_beside_the_rows_of_the_run_before():
    """Runs on the worker thread, rows in the caller's; a job's run goes on while the job before is judged."""
    import threading

    events = _pipeline_events(budget=1 << 20, nbytes=1000)
    main = threading.current_thread().name
    assert [e for e in events if e[0] == "rows"] == [("rows", i, main) for i in range(3)]
    assert [e for e in events if e[0] == "run"] == [("run", i, "layertap-compare-runs") for i in range(3)]
    assert [e for e in events if e[0] == "next run beside"] == [("next run beside", 0, "True"), ("next run beside", 1, "True")]


def test_runs_whose_values_take_over_half_the_budget_wait_for_the_rows_before():
    """Two jobs' values are held at once only while they fit the memory budget: else rows come first."""
    events = _pipeline_events(budget=1500, nbytes=1000)
    order = [(kind, i) for kind, i, _ in events if kind != "next run beside"]
    assert order == [("run", 0), ("rows", 0), ("run", 1), ("rows", 1), ("run", 2), ("rows", 2)]
    assert [e[2] for e in events if e[0] == "next run beside"] == ["False", "False"]


@pytest.mark.parametrize("reference", ["file", "model"])
def test_rows_made_beside_the_runs_are_those_of_one_job_at_a_time(r18, monkeypatch, reference):
    """Every field of every row over several samples is what running and judging one job at a time gives."""
    import dataclasses

    import layertap as lt
    from layertap.comparing.driver import Driver

    model, x, ts, d = r18
    cand = _fp16(ts, d / "ts16-overlap.onnx")
    def run():
        if reference == "file":
            return lt.compare(ts, None, cand, samples=[{"x": x.numpy() * s} for s in (1.0, -2.0, 0.5)], metric="cosine")
        return lt.compare(model, x, cand, samples=[x, x * -2.0, x * 0.5], metric="cosine")

    overlapped = run()

    def one_at_a_time(self, jobs, budget):
        for job in jobs:
            self._judge(job, self._fetch(job))

    monkeypatch.setattr(Driver, "_pipeline", one_at_a_time)
    alone = run()
    assert overlapped.samples == 3 and overlapped.ort_runs == alone.ort_runs
    assert [dataclasses.asdict(r) for r in overlapped.rows] == [dataclasses.asdict(r) for r in alone.rows]
    assert overlapped.first_divergence_counts == alone.first_divergence_counts and overlapped.notes == alone.notes


def test_background_work_runs_on_one_long_lived_thread_per_kind():
    """One worker thread per kind of work, reused job after job (a new thread's memory arena pays a
    page fault per page), jobs in order, errors raised in the caller's thread; a forked child starts its own."""
    import os
    import threading

    from layertap.comparing.background import Background

    first = Background(threading.get_ident, name="layertap-test").result()
    assert Background(threading.get_ident, name="layertap-test").result() == first != threading.get_ident()
    seen: list[int] = []
    jobs = [Background(lambda i=i: seen.append(i), name="layertap-test") for i in range(5)]
    for job in jobs:
        job.result()
    assert seen == list(range(5))
    with pytest.raises(KeyError, match="gone"):
        Background(lambda: {}["gone"], name="layertap-test").result()
    pid = os.fork()
    if pid == 0:  # the child has no threads but its own: the job must still run
        os._exit(0 if Background(lambda: 7, name="layertap-test").result() == 7 else 1)
    assert os.waitpid(pid, 0)[1] == 0
