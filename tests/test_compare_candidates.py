"""Calls whose tensor is only a candidate (an optimizer rewrite or a node inserted without scope at
their edge) are paired by value and compared like any other: a fault there is found at that call.

Faults are injected into the exported graph (a ``Mul`` inside the module's scope), never by
changing the model after export.
"""

from __future__ import annotations

import numpy as np
import pytest

from _faults import scale_module_output

C_ATTN = "h.0.attn.c_attn"


@pytest.fixture(scope="module")
def tiny_gpt2(torch_mod, tmp_path_factory):
    """GPT-2, 2 layers 32 wide, exported by both exporters (dynamo's optimizer splits c_attn's
    output with a ``Split`` that has no module scope)."""
    transformers = pytest.importorskip("transformers")
    import layertap as lt

    torch_mod.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    model = transformers.GPT2Model(cfg).eval()
    ids = torch_mod.randint(0, 100, (1, 8), generator=torch_mod.Generator().manual_seed(1))
    folder = tmp_path_factory.mktemp("gpt2")
    files = {}
    for exporter in ("dynamo", "torchscript"):
        files[exporter] = folder / f"{exporter}.onnx"
        lt.export(model, (ids,), files[exporter], exporter=exporter, verify=False)
    return model, ids, files


def _row(report, name):
    return next(r for r in report.rows if r.name == name)


def test_module_before_an_unscoped_split_is_paired_by_value(tiny_gpt2):
    """dynamo: c_attn's output feeds the optimizer's scope-less Split; the tensor is there and
    equals PyTorch's, so c_attn is compared (it was "no counterpart")."""
    import onnx

    import layertap as lt
    from layertap.onnxfile.scopemap import ScopeMap

    model, ids, files = tiny_gpt2
    graph = onnx.load(str(files["dynamo"]), load_external_data=False)
    cps = {c.path: c for c in ScopeMap.from_model(graph).counterparts()}
    assert cps[C_ATTN].note and "inserted" in cps[C_ATTN].note  # refused on structure...
    assert cps[C_ATTN].unverified  # ...kept as a candidate
    report = lt.compare(model, ids, files["dynamo"])
    for layer in ("h.0", "h.1"):
        row = _row(report, f"{layer}.attn.c_attn")
        assert row.status == "pass" and row.rel_err < 1e-5 and "checked numerically" in row.note, str(report)
        assert row.onnx == list(cps[f"{layer}.attn.c_attn"].unverified)
    assert report.ok, str(report)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_fault_at_c_attn_is_the_first_divergence(tiny_gpt2, tmp_path, exporter):
    import layertap as lt

    model, ids, files = tiny_gpt2
    bad = tmp_path / "fault.onnx"
    scale_module_output(files[exporter], bad, C_ATTN, np.full(96, 1.2))
    report = lt.compare(model, ids, bad)
    row = _row(report, C_ATTN)
    assert report.first_divergence == C_ATTN, str(report)
    assert row.status == "FAIL" and row.rel_err == pytest.approx(0.2, rel=1e-3)
    assert _row(report, "h.0.ln_1").status == "pass"
    if exporter == "dynamo":
        assert "divergence starts here" in row.note


def test_candidate_that_differs_fails_even_when_the_next_module_agrees(tiny_gpt2, tmp_path):
    """1% on the query columns of c_attn: c_attn is off by ~1e-2, c_proj after the softmax and the
    residual after it agree within 1e-3. The differing candidate is the FAIL, not silence."""
    import layertap as lt

    model, ids, files = tiny_gpt2
    scale = np.ones(96)
    scale[:32] = 1.01
    bad = tmp_path / "diluted.onnx"
    scale_module_output(files["dynamo"], bad, C_ATTN, scale)
    report = lt.compare(model, ids, bad)
    row, after = _row(report, C_ATTN), _row(report, "h.0.attn.c_proj")
    assert after.status == "pass" and _row(report, "output").status == "pass", str(report)
    assert row.status == "FAIL" and row.ok is False and row.rel_err > 5e-3, str(report)
    assert "agrees" in row.note and "h.0.attn.c_proj" in row.note
    assert not report.ok and report.first_divergence == C_ATTN


def test_blame_notes_what_the_next_compared_module_shows():
    from layertap.comparing import FAIL, PASS, CompareReport, CompareRow
    from layertap.comparing.align import REWRITE_DIFFERS, blame_rewritten

    rows = [
        CompareRow("attn", "attn", 0, "Attention", [1], 0.5, 0.5, FAIL, False, note=REWRITE_DIFFERS),
        CompareRow("norm2", "norm2", 0, "LayerNorm", [1], 0.0, 0.0, PASS, True),
        CompareRow("fc", "fc", 0, "Linear", [1], 1.0, 1.0, FAIL, False),
    ]
    kept = blame_rewritten(rows)
    assert [r.status for r in kept] == [FAIL, PASS, FAIL]
    assert "norm2) agrees" in kept[0].note
    assert CompareReport(kept).first_divergence == "attn"


def test_module_before_a_quantizer_island_is_not_judged_on_it(resnet18, resnet_input, resnet_onnx_dynamo, tmp_path):
    """QDQ (dynamo): a clipping Q/DQ pair after a residual Add stands for the block's ReLU, so the
    Add's tensor is not the block's value (cosine 0.7 against it): the block is compared at its
    dequantised value after that pair, and passes."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    import layertap as lt

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": resnet_input.numpy()}])

        def get_next(self):
            return next(self.batches, None)

    qdq = tmp_path / "qdq.onnx"
    quantize_static(str(resnet_onnx_dynamo), str(qdq), Reader(), quant_format=QuantFormat.QDQ)
    report = lt.compare(resnet18, resnet_input, qdq, metric="cosine", criterion=lt.Criterion(min_cosine=0.95))
    block = _row(report, "layer2.0")
    assert block.status == "pass" and block.cosine > 0.99, str(report)
    assert not [r.name for r in report.rows if r.ok is False], str(report)
