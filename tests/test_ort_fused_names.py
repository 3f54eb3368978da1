"""Files saved by ONNX Runtime's optimizer: nodes it fused keep a marked name (``fused /fc2/Gemm``),
and the module calls they came from are still read from it."""

from __future__ import annotations

import pytest


def _mlp(torch_mod):
    """A Linear ``fc2`` and a ReLU ``act`` that run twice; ORT fuses fc2's first call with act."""
    nn = torch_mod.nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.act, self.gelu = nn.Linear(8, 8), nn.Linear(8, 8), nn.ReLU(), nn.GELU()

        def forward(self, x):
            x = self.act(self.fc2(self.act(self.fc1(x))))
            return self.act(self.gelu(self.fc2(x)) + 1)

    torch_mod.manual_seed(0)
    return MLP().eval(), torch_mod.randn(2, 8)


@pytest.fixture(scope="module")
def ort_saved(torch_mod, tmp_path_factory):
    import onnxruntime as ort

    model, x = _mlp(torch_mod)
    folder = tmp_path_factory.mktemp("ort_fused")
    src = folder / "mlp.onnx"
    torch_mod.onnx.export(model, (x,), str(src), dynamo=False)
    files = {}
    for level in ("EXTENDED", "ALL"):
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_ENABLE_{level}")
        so.optimized_model_filepath = str(folder / f"mlp_{level}.onnx")
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        files[level] = folder / f"mlp_{level}.onnx"
    return model, x, files


@pytest.mark.parametrize("level", ["EXTENDED", "ALL"])
def test_layers_of_ort_saved_file_name_only_real_modules(ort_saved, level):
    import onnx

    import layertap as lt

    model, _, files = ort_saved
    nodes = [n.name for n in onnx.load(str(files[level]), load_external_data=False).graph.node]
    assert "fused /fc2/Gemm" in nodes and "/fc2_1/Gemm" in nodes  # what ORT leaves of fc2's two calls
    table = lt.onnx_layers(files[level])
    names = {p for p, _ in model.named_modules()}
    assert {r.module for r in table.rows if r.module} <= names
    by_tensor = {r.name: (r.module, r.call) for r in table.rows}
    assert by_tensor["/fc2_1/Gemm_output_0"] == ("fc2", 1)
    assert by_tensor["/act_1/Relu_output_0"] == ("act", 1)


def test_compare_aligns_the_second_call_of_a_module_whose_first_ort_fused(ort_saved):
    import layertap as lt

    model, x, files = ort_saved
    report = lt.compare(model, x, files["EXTENDED"])
    rows = {r.name: r for r in report.rows}
    assert rows["fc2#1"].status == "pass" and rows["fc2#1"].onnx == ["/fc2_1/Gemm_output_0"], str(report)
    assert rows["fc2#0"].status == "absorbed" and rows["fc1"].status == "absorbed"
    assert report.ok, str(report)
