"""What compare says happened: row order, the fused-module words (terminal and HTML alike),
the deciding metric in the page, the ORT-optimisation hint, --plot labels, Model Explorer node data.

One small Conv-BN-ReLU net (two blocks, a Linear after a mean over the image) exported by both
exporters and quantised to int8 QDQ serves every test.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest


def _net(torch_mod):
    """conv1/bn1/relu1, conv2/bn2/relu2, a mean in the model's own code, fc. The Convs have no bias and
    the BatchNorms their initial statistics, so both folded biases are zeros: TorchScript keeps one
    initializer and copies it with an ``Identity`` node."""
    nn = torch_mod.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
            self.conv2, self.bn2, self.relu2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = self.relu1(self.bn1(self.conv1(x)))
            x = self.relu2(self.bn2(self.conv2(x)))
            return self.fc(x.mean((2, 3)))

    torch_mod.manual_seed(0)
    return Net().eval()


class _Reader:
    """Two seeded calibration batches for quantize_static."""

    def __init__(self):
        self._it = iter([{"x": np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype(np.float32)}
                         for i in range(2)])

    def get_next(self):
        return next(self._it, None)


@pytest.fixture(scope="module")
def files(torch_mod, tmp_path_factory):
    """The net, an input, and its files: TorchScript, dynamo, int8 QDQ (from TorchScript), and the
    TorchScript file with conv2's (folded) weights scaled by 1.1."""
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantFormat, quantize_static

    d = tmp_path_factory.mktemp("explain")
    model, x = _net(torch_mod), torch_mod.randn(1, 3, 16, 16, generator=torch_mod.Generator().manual_seed(1))
    kw = dict(input_names=["x"], output_names=["output"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_mod.onnx.export(model, (x,), str(d / "ts.onnx"), dynamo=False, **kw)
        torch_mod.onnx.export(model, (x,), str(d / "dyn.onnx"), dynamo=True, **kw)
    quantize_static(str(d / "ts.onnx"), str(d / "int8.onnx"), _Reader(), quant_format=QuantFormat.QDQ)
    proto = onnx.load(str(d / "ts.onnx"))
    conv = next(n for n in proto.graph.node if n.name == "/conv2/Conv")
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.1, init.name))
    onnx.save(proto, str(d / "broken.onnx"))
    return model, x, d


def _names(report):
    return [r.name for r in report.rows]


def _explanation(report) -> str:
    from layertap.reports.compare_page import explain

    return re.sub(r"<[^>]+>", " ", explain(report))


# -- rows in execution order --------------------------------------------------------------
def test_file_vs_file_rows_list_a_fused_conv_before_its_bn(files):
    """The dynamo file's graph order puts bn1's scope first; the rows follow PyTorch's order."""
    import layertap as lt

    _, x, d = files
    report = lt.compare(d / "dyn.onnx", {"x": x.numpy()}, d / "ts.onnx")
    names = _names(report)
    assert names.index("conv1") + 1 == names.index("bn1") and names.index("conv2") + 1 == names.index("bn2")
    conv1 = report.rows[names.index("conv1")]
    assert conv1.status == "absorbed" and conv1.fused_into == "bn1"
    assert report.ok, str(report)


# -- the words for a divergence after a fusion ---------------------------------------------------
@pytest.mark.parametrize("ref", ["model", "dyn.onnx"])
def test_summary_and_explanation_say_which_conv_was_fused_into_the_diverging_bn(files, ref):
    """conv2's weights broken in a file where it is fused into bn2: the divergence is found at bn2,
    and both the terminal summary and the HTML say that conv2 was fused into it (never conv1)."""
    import layertap as lt

    model, x, d = files
    report = (lt.compare(model, x, d / "broken.onnx") if ref == "model"
              else lt.compare(d / ref, {"x": x.numpy()}, d / "broken.onnx"))
    assert report.first_divergence == "bn2", str(report)
    words = "conv2 was fused into bn2 in the ONNX graph, so the error may start in conv2 as well"
    summary = "\n".join(report.footer())
    assert words in summary and words in _explanation(report)
    assert "conv1 was fused" not in summary + _explanation(report)


def test_int8_explanation_names_the_conv_fused_into_the_diverging_bn(files):
    """In the QDQ file bn1 is compared at its dequantised value and is the first divergence; conv1 was
    fused into bn1 (not into relu1), and nothing is said of conv2."""
    import layertap as lt

    _, x, d = files
    report = lt.compare(d / "ts.onnx", {"x": x.numpy()}, d / "int8.onnx", rtol=1e-3)  # a fixed tolerance: int8 fails it
    assert report.first_divergence == "bn1", str(report)
    summary, html = "\n".join(report.footer()), _explanation(report)
    for text in (summary, html):
        assert "conv1 was fused into bn1 in the ONNX graph" in text
        assert "conv1 was fused into relu1" not in text and "conv2" not in text


# -- the deciding metric is what the page shows -------------------------------------------------
@pytest.mark.parametrize("metric, column, threshold", [
    ("sqnr", "SQNR dB", "SQNR threshold 45 dB"), ("cosine", "cosine", "cosine threshold 0.99999")])
def test_page_shows_the_deciding_metric_and_labels_its_threshold(files, metric, column, threshold):
    import layertap as lt
    from layertap.reports.compare_page import compare_fragment

    _, x, d = files
    report = lt.compare(d / "ts.onnx", {"x": x.numpy()}, d / "int8.onnx", metric=metric, criterion=lt.Criterion(min_sqnr_db=45, min_cosine=0.99999))
    first = report.first_divergence_row
    assert first is not None, str(report)
    html = compare_fragment(report)
    tree = html[html.index('class="tree"'):]
    assert f'data-h="{column}"' in tree and "tolerance 0.001" not in html
    assert html.count(f'class="threshold">{threshold}') == 2  # the wide chart and the phone chart
    value = f"SQNR {first.sqnr_db:.2f} dB" if metric == "sqnr" else f"cosine {first.cosine:.6f}"
    assert f"<title>{first.name}: {value}</title>" in html  # the plotted point is the deciding value
    assert f"{value} ({threshold})" in "\n".join(report.footer())
    assert any(c.key == ("sqnr_db" if metric == "sqnr" else "cosine") and c.drop == 0 for c in report.columns)


# -- the --no-ort-opt hint ------------------------------------------------------------------
def test_ort_optimisation_hint_only_when_the_divergence_could_be_rounding(files):
    import layertap as lt
    from layertap.comparing import FUSION_NOTE

    model, x, d = files
    clean = lt.compare(model, x, d / "ts.onnx")
    worst = max(r.rel_err for r in clean.rows if r.rel_err is not None)
    assert clean.ok and worst > 0 and FUSION_NOTE not in clean.notes
    # a tolerance just under float32 rounding: the first failing row is within 5x of it
    tight = lt.compare(model, x, d / "ts.onnx", rtol=worst / 5, atol=0.0)
    assert not tight.ok and FUSION_NOTE in tight.notes
    # weights x1.1: rel err ~0.1, a hundred times rtol 1e-3 -- no optimisation explains that
    broken = lt.compare(model, x, d / "broken.onnx")
    assert broken.first_divergence_row.rel_err > 50 * broken.rtol and FUSION_NOTE not in broken.notes


# -- --plot ------------------------------------------------------------------------------
def test_plot_labels_do_not_overlap_and_name_the_threshold():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from layertap.comparing import CompareReport, CompareRow
    from layertap.comparing.plot import plot_figure
    from layertap.metrics import Criterion

    rows = [CompareRow(f"encoder.layers.{i // 4}.block{i % 4}", "m", i, "Linear", [1], 1e-6, 1e-6 * (1 + i % 3),
                       "pass", True, sqnr_db=60.0) for i in range(300)]
    for r in rows[151:]:
        r.sqnr_db, r.status, r.ok = 20.0, "FAIL", False
    report = CompareReport(rows, criterion=Criterion(metric="sqnr"))
    fig = plot_figure(report)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax, renderer = fig.axes[0], canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    assert len(boxes) >= 20
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), "x labels overlap"
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert rows[151].name in labels
    assert "SQNR threshold 30 dB" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_ylabel() == "SQNR (dB)"


# -- Model Explorer node data -----------------------------------------------------------------
def test_node_data_gives_weight_copies_and_model_code_no_compared_values(files, tmp_path):
    import json

    import onnx

    import layertap as lt
    from layertap.reports.nodedata import write_node_data

    model, x, d = files
    report = lt.compare(model, x, d / "broken.onnx")
    paths = write_node_data(report, d / "broken.onnx", tmp_path / "nd.json")
    error, status, module = (json.loads(p.read_text())["results"] for p in paths)
    nodes = {n.name: n for n in onnx.load(str(d / "broken.onnx"), load_external_data=False).graph.node}
    copies = [k for k, n in nodes.items() if n.op_type == "Identity"]
    assert copies, "expected TorchScript's weight-copy Identity nodes"
    for name in copies:  # they copy a weight: no module call computes them
        assert name not in error and name not in status and name not in module
    mean = next(k for k, n in nodes.items() if n.op_type == "ReduceMean")  # the model's own code
    assert module[mean]["value"] == "(root)" and mean not in error and mean not in status
    fc = next(r for r in report.rows if r.name == "fc")
    assert error["/fc/Gemm"]["value"] == pytest.approx(fc.rel_err) and module["/fc/Gemm"]["value"] == "fc"
