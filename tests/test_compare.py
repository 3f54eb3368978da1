"""lt.compare: PyTorch vs ONNX Runtime, module by module."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from layertap.errors import LayertapError, OnnxFileError

EXPORTERS = ["resnet_onnx_dynamo", "resnet_onnx_torchscript"]


def _perturb_conv(src: Path, dst: Path, bn_path: str = "layer3.0.bn1", factor: float = 1.5) -> str:
    """Scale the weights of the Conv whose output is ``bn_path``'s value (the folded conv)."""
    import onnx
    from onnx import numpy_helper

    from layertap.onnxfile.scopemap import ScopeMap
    from layertap.selectors import Tap

    model = onnx.load(str(src))  # with weights: the copy is self-contained
    ((_, tensor),) = ScopeMap.from_model(model).resolve(Tap.parse(bn_path))
    node = next(n for n in model.graph.node if tensor in n.output)
    assert node.op_type == "Conv", node.op_type
    init = next(i for i in model.graph.initializer if i.name == node.input[1])
    w = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array((w * factor).astype(w.dtype), init.name))
    onnx.save(model, str(dst))
    return node.name


@pytest.fixture(scope="session")
def perturbed(request, tmp_path_factory):
    """Per exporter fixture name: a copy of the file with layer3.0.conv1's weights scaled by 1.5."""
    cache: dict[str, Path] = {}

    def make(fixture: str) -> Path:
        if fixture not in cache:
            src = request.getfixturevalue(fixture)
            dst = tmp_path_factory.mktemp("perturbed") / f"{fixture}.onnx"
            _perturb_conv(src, dst)
            cache[fixture] = dst
        return cache[fixture]

    return make


@pytest.fixture(scope="session")
def clean_reports(request, resnet18, resnet_input):
    import layertap as lt

    cache = {}

    def get(fixture: str):
        if fixture not in cache:
            cache[fixture] = lt.compare(resnet18, resnet_input, request.getfixturevalue(fixture))
        return cache[fixture]

    return get


def _row(report, name):
    return next(r for r in report.rows if r.name == name)


# -- resnet18, both exporters ------------------------------------------------
@pytest.mark.parametrize("fixture", EXPORTERS)
def test_resnet18_compares_clean(clean_reports, fixture):
    report = clean_reports(fixture)
    assert report.ok, str(report)
    assert report.first_divergence is None
    assert report.to_dict()["first_divergence"] is None
    # BatchNorm folded into Conv: the Conv is absorbed, the BatchNorm compared.
    conv, bn = _row(report, "layer3.0.conv1"), _row(report, "layer3.0.bn1")
    assert (conv.status, conv.ok) == ("absorbed", None)
    assert conv.note == "fused into layer3.0.bn1; compared there"
    assert (bn.status, bn.ok) == ("pass", True) and bn.max_abs < 1e-3
    assert not report.failures
    statuses = {r.status for r in report.rows}
    assert statuses <= {"pass", "absorbed", "no counterpart"}
    assert sum(r.status == "pass" for r in report.rows) >= 40
    # execution order: children return before their parent; the model output is last
    names = [r.name for r in report.rows]
    assert names.index("layer1.0.relu#1") < names.index("layer1.0") < names.index("layer1") < names.index("layer2.0.bn1")
    assert names[-1] == "output" and report.rows[-1].status == "pass"


@pytest.mark.parametrize("fixture", EXPORTERS)
def test_perturbed_conv_is_first_divergence(resnet18, resnet_input, perturbed, fixture):
    import layertap as lt

    report = lt.compare(resnet18, resnet_input, perturbed(fixture))
    assert not report.ok
    first = report.first_divergence
    assert first is not None and first.startswith("layer3.0."), first
    assert first == "layer3.0.bn1"  # where the folded conv's value is compared
    assert report.to_dict()["first_divergence"] == first
    idx = report.rows.index(report.first_divergence_row)
    assert all(r.ok is not False for r in report.rows[:idx])
    assert any(r.name == "layer2" and r.ok for r in report.rows[:idx])
    assert _row(report, "output").ok is False
    assert report.first_divergence_row.rel_err > 1e-2
    # an error ten times past the rule is no rounding: no hint to turn ORT's optimisations off
    assert not any("ort_optimizations=False" in n for n in report.notes)


def test_report_renders_and_serialises(clean_reports):
    report = clean_reports("resnet_onnx_dynamo")
    text = str(report)
    assert "layer3.0.bn1" in text and "absorbed" in text and "no divergence" in text
    assert "ort_optimizations=False" not in text  # the ORT fusion note only explains a failing row
    d = report.to_dict()
    assert d["ok"] is True and d["rtol"] == 1e-3 and d["counts"]["FAIL"] == 0
    assert {"name", "path", "call", "shape", "max_abs", "rel_err", "status", "onnx"} <= set(d["rows"][0])
    assert '"first_divergence": null' in report.to_json()


def test_without_ort_optimisations(resnet18, resnet_input, resnet_onnx_dynamo):
    import layertap as lt
    from layertap.cli.console import StepProgress

    with StepProgress(enabled=True) as progress, lt.reporting(progress):
        report = lt.compare(resnet18, resnet_input, resnet_onnx_dynamo, modules=["layer2"],
                            runtime_options=lt.RuntimeOptions(ort_optimizations=False))
    assert report.ok and report.ort_optimizations is False
    assert any("ORT_DISABLE_ALL" in n for n in report.notes)
    assert report.rows and all(r.path.startswith("layer2") for r in report.rows)


def test_batches_and_spill_give_the_same_rows(clean_reports, resnet18, resnet_input, resnet_onnx_dynamo):
    import layertap as lt

    ref = clean_reports("resnet_onnx_dynamo")
    small = lt.compare(resnet18, resnet_input, resnet_onnx_dynamo, runtime_options=lt.RuntimeOptions(batch_outputs=12, memory_budget=400_000))
    assert small.ort_runs > 3
    assert any("batches" in n for n in small.notes) and any("on disk" in n for n in small.notes)
    assert [(r.name, r.status) for r in small.rows] == [(r.name, r.status) for r in ref.rows]
    for a, b in zip(small.rows, ref.rows):
        assert (a.max_abs is None) == (b.max_abs is None)
        if a.max_abs is not None:
            # other exposed outputs -> other ORT fusions -> other float32 rounding
            assert a.max_abs == pytest.approx(b.max_abs, abs=1e-5)


@pytest.mark.parametrize("fixture", EXPORTERS)
def test_values_the_file_folded_away_are_not_kept(request, monkeypatch, resnet18, resnet_input, fixture):
    """A Conv whose BatchNorm the exporter folded in has no value in the file: the forward keeps its shape,
    not a copy of its value, and every row is as when every value was kept."""
    import layertap as lt
    from layertap.comparing import torch_ref, torch_side

    path = request.getfixturevalue(fixture)
    copies: list[tuple[int, ...]] = []
    to_numpy = torch_side.to_numpy
    monkeypatch.setattr(torch_side, "to_numpy", lambda t: copies.append(tuple(t.shape)) or to_numpy(t))
    lean = lt.compare(resnet18, resnet_input, path)
    kept_lean = len(copies)
    copies.clear()
    monkeypatch.setattr(torch_ref, "absorbed_modules", lambda view: frozenset())
    full = lt.compare(resnet18, resnet_input, path)
    absorbed = [r for r in full.rows if r.status == "absorbed"]
    assert len(absorbed) >= 10, [r.name for r in absorbed]
    assert kept_lean == len(copies) - len(absorbed), (kept_lean, len(copies), len(absorbed))
    assert lean.rows == full.rows
    assert all(r.shape for r in absorbed)


def test_fold_not_reported_by_scopes_is_still_absorbed(monkeypatch, resnet18, resnet_input, resnet_onnx_torchscript):
    """A Conv mapped to the fused tensor (scopes unaware of the fold) must not fail."""
    import layertap as lt
    from layertap.onnxfile.scopemap import scopes

    original = scopes.ScopeMap.counterparts

    def unaware(self):
        cps = original(self)
        by = {(c.path, c.call): c for c in cps}
        out = []
        for c in cps:
            if c.path.endswith("conv1") and not c.tensors:
                bn = by.get((c.path[: -len("conv1")] + "bn1", c.call))
                if bn is not None and bn.tensors:
                    out.append(scopes.Counterpart(c.path, c.call, bn.tensors, None))
                    continue
            if c.path.endswith("bn1") and (c.path[: -len("bn1")] + "conv1", c.call) in by:
                continue  # the BatchNorm looks as if it had no node
            out.append(c)
        return out

    monkeypatch.setattr(scopes.ScopeMap, "counterparts", unaware)
    report = lt.compare(resnet18, resnet_input, resnet_onnx_torchscript, modules=["layer1"])
    assert report.ok, str(report)
    conv, bn = _row(report, "layer1.0.conv1"), _row(report, "layer1.0.bn1")
    assert conv.status == "absorbed" and "fused" in conv.note
    assert bn.status == "pass" and "layer1.0.conv1" in bn.note


# -- transformer ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert(torch_mod, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch_mod.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=64,
    )
    model = transformers.BertModel(cfg).eval()
    ids = torch_mod.randint(0, 99, (2, 7), generator=torch_mod.Generator().manual_seed(3))
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    torch_mod.onnx.export(model, (ids,), str(path), dynamo=True, input_names=["input_ids"])
    return model, ids, path


def test_tiny_bert_compares_clean(tiny_bert):
    import layertap as lt

    model, ids, path = tiny_bert
    report = lt.compare(model, ids, path)
    assert report.ok, str(report)
    assert report.first_divergence is None
    passed = {r.name for r in report.rows if r.status == "pass"}
    assert {"encoder.layer.1.attention.self", "encoder.layer.0.output.LayerNorm", "pooler", "output"} <= passed
    # ModelOutput result: both tensors (last_hidden_state, pooler_output) compared
    assert len(_row(report, "output").onnx) == 2


# -- tuple outputs ---------------------------------------------------------------
def test_tuple_output_module_pairs_by_position(torch_mod, tmp_path):
    import layertap as lt

    nn = torch_mod.nn

    class Halves(nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            return a * 2, b.sum(dim=1)  # different shapes: pairing by shape must work too

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.halves = Halves()
            self.out = nn.Linear(4, 3)

        def forward(self, x):
            a, b = self.halves(self.lin(x))
            return self.out(a) + b[:, None]

    torch_mod.manual_seed(0)
    model = Net().eval()
    x = torch_mod.randn(5, 8)
    path = tmp_path / "net.onnx"
    torch_mod.onnx.export(model, (x,), str(path), dynamo=True)
    report = lt.compare(model, x, path)
    assert report.ok, str(report)
    row = _row(report, "halves")
    assert row.status == "pass" and len(row.onnx) == 2 and row.shape == [5, 4]


# -- statistics and pairing ----------------------------------------------------------
def test_error_stats_near_zero_values_do_not_explode():
    from layertap.metrics import error_stats

    ref = np.array([0.0, 1e-9, 3.0], dtype=np.float32)
    got = np.array([1e-6, -1e-9, 3.0 + 1e-6], dtype=np.float32)
    s = error_stats(ref, got, rtol=1e-3, atol=1e-5)
    assert s.ok and s.rel_err < 1e-6 and s.scale == pytest.approx(3.0)


def test_fast_paths_give_the_exact_paths_values():
    """The one-pass float32 statistics and ORT's float16 cast agree with the plain numpy ones,
    special values included (those leave the fast path)."""
    from layertap.metrics import Criterion, error_stats, similarity
    from layertap.runtimes.ort_kernels import as_float32

    rng = np.random.default_rng(3)
    ref = rng.standard_normal(10_000).astype(np.float32)
    for got in (ref * 1.001, ref + 1e-7, ref.copy()):
        fast = Criterion(metric="cosine").judge(ref, got)
        slow, (cos, sqnr, finite) = error_stats(ref, got), similarity(ref, got)
        assert (fast.max_abs, fast.scale, fast.rel_err) == (slow.max_abs, slow.scale, slow.rel_err)
        assert (fast.cosine, fast.sqnr_db, fast.finite) == (cos, sqnr, finite)
    bad = ref.copy()
    bad[7] = np.nan
    assert not Criterion(check_finite=True).judge(ref, bad).ok and not Criterion().judge(ref, bad).finite
    half = np.concatenate([rng.standard_normal(8192), [np.inf, -np.inf, np.nan, 6e-8, -0.0, 65504.0]]).astype(np.float16)
    np.testing.assert_array_equal(as_float32(half), half.astype(np.float32))
    assert as_float32(half).dtype == np.float32


def test_large_tensors_judged_block_by_block_give_the_exact_paths_values():
    """Tensors of more than two blocks are judged block by block (each block read once):
    the same maxima, and the sums to float64 rounding; a NaN or inf in any block, or a
    candidate value past float32's range, leaves for the exact path."""
    from layertap.metrics import _BLOCK, Criterion, error_stats, similarity

    rng = np.random.default_rng(4)
    ref = rng.standard_normal(5 * _BLOCK + 123).astype(np.float32)
    for got in (ref * np.float32(1.001), ref + np.float32(1e-3) * rng.standard_normal(ref.size).astype(np.float32), ref.copy()):
        fast = Criterion().judge(ref, got)
        slow, (cos, sqnr, finite) = error_stats(ref, got), similarity(ref.astype(np.float64), got.astype(np.float64))
        assert (fast.max_abs, fast.scale, fast.rel_err, fast.ok) == (slow.max_abs, slow.scale, slow.rel_err, slow.ok)
        assert fast.cosine == pytest.approx(cos, abs=1e-7) and fast.sqnr_db == pytest.approx(sqnr, rel=1e-5)  # float32 dots
        assert fast.finite and finite
    assert Criterion().judge(ref, ref.copy()).cosine == 1.0 and math.isinf(Criterion().judge(ref, ref.copy()).sqnr_db)
    for bad_value in (np.nan, np.inf):
        bad = ref.copy()
        bad[4 * _BLOCK + 5] = bad_value
        judged = Criterion().judge(ref, bad)
        assert not judged.finite and not judged.ok and math.isinf(judged.max_abs)


def test_error_stats_fails_and_handles_nan():
    from layertap.metrics import error_stats

    s = error_stats(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    assert not s.ok and s.max_abs == pytest.approx(0.5) and s.rel_err == pytest.approx(0.25)
    same_nan = error_stats(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert same_nan.ok and same_nan.max_abs == 0.0
    one_nan = error_stats(np.array([0.5, 1.0]), np.array([np.nan, 1.0]))
    assert not one_nan.ok and math.isinf(one_nan.max_abs)
    zeros = error_stats(np.zeros(3), np.full(3, 1e-6))
    assert zeros.ok and math.isinf(zeros.rel_err)  # atol covers an all-zero reference


def test_pair_tensors():
    from layertap.comparing import pair_tensors

    assert pair_tensors([(2, 3), (2,)], [(2, 3), (2,)]) == [(0, 0), (1, 1)]
    assert pair_tensors([(2, 3), (2,)], [(2,), (2, 3)]) == [(1, 0), (0, 1)]
    assert pair_tensors([(1, 4, 1)], [(4,)]) == [(0, 0)]
    assert pair_tensors([(2, 3)], [(3, 2)]) == []


# -- bad input -------------------------------------------------------------------------
def test_bad_inputs_raise_layertap_errors(resnet18, resnet_input, resnet_onnx_dynamo, tmp_path, torch_mod):
    import layertap as lt

    with pytest.raises(OnnxFileError, match="does not exist"):
        lt.compare(resnet18, resnet_input, tmp_path / "missing.onnx")
    with pytest.raises(LayertapError, match="did you mean: layer3"):
        lt.compare(resnet18, resnet_input, resnet_onnx_dynamo, modules=["layer33"])
    with pytest.raises(LayertapError, match="rtol"):
        lt.compare(resnet18, resnet_input, resnet_onnx_dynamo, rtol=-1)
    with pytest.raises(LayertapError, match="takes 1"):
        lt.compare(resnet18, (resnet_input, resnet_input), resnet_onnx_dynamo)
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(OnnxFileError, match="is not an ONNX file"):
        lt.compare(resnet18, resnet_input, bad)
    # the same external-data policy as every ONNX command: nothing outside the model's folder
    import onnx

    escaping = tmp_path / "sub" / "escaping.onnx"
    escaping.parent.mkdir()
    proto = onnx.load(str(resnet_onnx_dynamo))
    onnx.save_model(proto, str(escaping), save_as_external_data=True, location="w.bin", size_threshold=0)
    graph = onnx.load(str(escaping), load_external_data=False)
    for init in graph.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../w.bin"
    escaping.write_bytes(graph.SerializeToString())
    with pytest.raises(OnnxFileError, match="outside the model's folder"):
        lt.compare(resnet18, resnet_input, escaping)


def test_plot_is_written(clean_reports, perturbed, resnet18, resnet_input, tmp_path):
    import layertap as lt

    report = lt.compare(resnet18, resnet_input, perturbed("resnet_onnx_dynamo"), modules=["layer3", "layer4"])
    out = tmp_path / "err.png"
    report.plot(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["err.png"]  # no temporary left behind
    with pytest.raises(LayertapError, match=".png"):
        report.plot(tmp_path / "err.jpg")


# -- corner cases: aliases, repeated calls, options ------------------------------------------------------------------
def _small_net(torch_mod, head: int = 4):
    """Conv+BN (folded on export), a module called twice, a ModuleList loop."""
    nn = torch_mod.nn

    class SmallNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.act = nn.ReLU()
            self.blocks = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1) for _ in range(2)])
            self.head = nn.Linear(8, head)

        def forward(self, x):
            x = self.act(self.bn(self.conv(x)))
            for blk in self.blocks:
                x = self.act(blk(x))
            return self.head(x.mean((2, 3)))

    torch_mod.manual_seed(0)
    model = SmallNet().eval()
    g = torch_mod.Generator().manual_seed(1)  # own stream: equal statistics whatever the head size
    with torch_mod.no_grad():
        model.bn.running_mean.uniform_(-0.1, 0.1, generator=g)
        model.bn.running_var.uniform_(0.5, 1.5, generator=g)
    return model


def _scale_initializer(src: Path, dst: Path, name: str, factor: float = 1.5) -> None:
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(src))
    init = next(i for i in proto.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, name))
    onnx.save(proto, str(dst))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_lt_export_file_aligns_by_module_path(torch_mod, tmp_path, exporter):
    """lt.export wraps the model: scopes read '_fn.conv' / 'model.conv'; compare must still align them."""
    import onnx

    import layertap as lt

    model = _small_net(torch_mod)
    x = torch_mod.randn(2, 3, 8, 8)
    path = tmp_path / "small.onnx"
    lt.export(model, x, path, taps=["blocks.1"], exporter=exporter, verify=False)
    report = lt.compare(model, x, path)
    assert report.ok, str(report)
    status = {r.name: r.status for r in report.rows}
    assert status["conv"] == "absorbed" and status["bn"] == "pass"
    assert status["blocks.0"] == status["blocks.1"] == status["act#2"] == status["head"] == "pass"
    assert "no counterpart" not in status.values()
    # a weight changed in the file is found at its own module, not at "output"
    weight = next(i.name for i in onnx.load(str(path)).graph.initializer if i.name.endswith("blocks.1.weight"))
    bad = tmp_path / "bad.onnx"
    _scale_initializer(path, bad, weight)
    assert lt.compare(model, x, bad).first_divergence == "blocks.1"


def test_file_of_a_wrapper_aligns_with_the_inner_model(torch_mod, tmp_path):
    """A file exported from ``Wrapper(model)`` names modules ``inner.conv``...: stripped, not 'no counterpart'."""
    import layertap as lt

    class Wrapper(torch_mod.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    model = _small_net(torch_mod)
    x = torch_mod.randn(2, 3, 8, 8)
    path = tmp_path / "wrapped.onnx"
    torch_mod.onnx.export(Wrapper(model).eval(), (x,), str(path), dynamo=False)
    report = lt.compare(model, x, path)
    assert report.ok and sum(r.status == "pass" for r in report.rows) >= 7, str(report)
    assert any("prefix 'inner.'" in n for n in report.notes)


def test_wrapper_prefix():
    from layertap.comparing.onnx_side import wrapper_prefix as _wrapper_prefix

    model = {"conv", "blocks", "blocks.0", "head"}
    assert _wrapper_prefix({"_fn", "_fn.conv", "_fn.blocks.0", "_fn.head"}, model) == "_fn"
    assert _wrapper_prefix({"outer.model.conv", "outer.model.head"}, model) == "outer.model"
    assert _wrapper_prefix({"conv", "blocks.0"}, model) == ""
    # a real child that merely shares a prefix is not stripped
    assert _wrapper_prefix({"blocks", "blocks.0", "conv"}, model | {"0"}) == ""


def test_file_of_another_model_is_refused(torch_mod, resnet_onnx_torchscript):
    import layertap as lt

    model = _small_net(torch_mod)
    with pytest.raises(OnnxFileError, match=r"does not look like an export of SmallNet: none of its \d+ module scopes \(avgpool"):
        lt.compare(model, torch_mod.randn(2, 3, 64, 64), resnet_onnx_torchscript)


def test_input_shape_the_file_cannot_take(resnet18, resnet_onnx_dynamo, torch_mod):
    import layertap as lt
    from layertap.errors import InputSpecError

    # exported with a fixed 2x3x64x64 input
    with pytest.raises(InputSpecError, match=r"input 'x' has shape 1x3x64x64 but the ONNX file expects 2x3x64x64"):
        lt.compare(resnet18, torch_mod.randn(1, 3, 64, 64), resnet_onnx_dynamo)


def test_input_shape_hint_fits_the_file():
    # A dynamic-batch file fed the wrong image size used to suggest "--input 1x..." (not the
    # user's batch) and "re-export with a dynamic batch" (the file already has one).
    from layertap.comparing.onnx_side import check_feed_shapes as _check_feed_shapes
    from layertap.errors import InputSpecError

    with pytest.raises(InputSpecError) as e:
        _check_feed_shapes({"x": np.zeros((4, 3, 64, 64))}, {"x": ("", 3, 224, 224)})  # an unnamed symbolic batch
    assert str(e.value) == ("input 'x' has shape 4x3x64x64 but the ONNX file expects Nx3x224x224 "
                            "(N can vary, the other sizes were fixed at export; pass --input 4x3x224x224)")
    with pytest.raises(InputSpecError, match=r"pass --input 1x3 or re-export with a dynamic batch\)$"):
        _check_feed_shapes({"x": np.zeros((2, 3))}, {"x": (1, 3)})


def test_input_shape_error_names_the_symbolic_batch_of_a_real_file(torch_mod, tmp_path):
    import layertap as lt
    from layertap.errors import InputSpecError

    model = _small_net(torch_mod)
    path = tmp_path / "batch.onnx"
    torch_mod.onnx.export(model, (torch_mod.randn(2, 3, 8, 8),), str(path), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    with pytest.raises(InputSpecError) as e:
        lt.compare(model, torch_mod.randn(4, 3, 16, 16), path)
    assert str(e.value) == ("input 'x' has shape 4x3x16x16 but the ONNX file expects batch x 3 x 8 x 8 "
                            "(batch can vary, the other sizes were fixed at export; pass --input 4x3x8x8)")


def test_output_of_another_shape_fails(torch_mod, tmp_path):
    """Same module paths, other head size: the output cannot match, so it must not pass silently."""
    import layertap as lt

    x = torch_mod.randn(2, 3, 8, 8)
    path = tmp_path / "head3.onnx"
    torch_mod.onnx.export(_small_net(torch_mod, head=3), (x,), str(path), dynamo=False)
    report = lt.compare(_small_net(torch_mod, head=4), x, path)
    assert not report.ok and report.first_divergence == "output"
    assert _row(report, "head").status == "no counterpart"
    assert "shapes differ" in _row(report, "output").note


def test_a_gpu_reference_forward_runs_in_full_float32_and_the_switches_come_back(monkeypatch):
    """PyTorch computes CUDA convolutions in TF32 by default (about 1e-3 from float32): a compare's
    reference forward turns that off for its forward and sets every switch back after, as it was."""
    import torch

    from layertap.pytorch.values import exact_float32

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    conv = torch.backends.cudnn.conv
    before = conv.fp32_precision
    conv.fp32_precision = "tf32"  # a user's choice, or the default on a GPU
    try:
        with exact_float32():
            inside = (conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
        assert inside == ("ieee", "ieee")
        assert conv.fp32_precision == "tf32" and torch.backends.cuda.matmul.fp32_precision != "ieee"
        with pytest.raises(RuntimeError), exact_float32():
            raise RuntimeError("a forward that fails")
        assert conv.fp32_precision == "tf32"
    finally:
        conv.fp32_precision = before
