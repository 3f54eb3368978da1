"""lt.export: taps as named ONNX outputs, checked in ONNX Runtime against PyTorch.

Every ORT value is compared here with a PyTorch value computed by plain hooks
in the test (not only through the report), at batch sizes other than the
exported one.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import layertap as lt
from layertap.errors import LayertapError, SelectorError
from layertap.onnxfile.metadata import TAPS_KEY

RN_TAPS = ["layer1", "layer3.1.conv2", "layer2.0.relu", "fc", "logits=fc", "conv1:input", "fc:input"]
RN_NAMES = ["output", "layer1", "layer3.1.conv2", "layer2.0.relu#0", "layer2.0.relu#1", "fc", "logits",
            "conv1:input", "fc:input"]


def session(path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def hooked(model: nn.Module, run, spec: list[tuple[str, str]]) -> list[torch.Tensor]:
    """Run ``run()`` and return, per (path, port), every call's tensor (plain hooks)."""
    got: dict[tuple[str, str], list[torch.Tensor]] = {k: [] for k in spec}
    handles = []
    for path, port in spec:
        mod = model.get_submodule(path)
        if port == "input":
            handles.append(mod.register_forward_pre_hook(lambda m, a, key=(path, port): got[key].append(a[0].clone())))
        else:
            handles.append(mod.register_forward_hook(lambda m, a, o, key=(path, port): got[key].append(o.clone())))
    try:
        with torch.no_grad():
            out = run()
    finally:
        for h in handles:
            h.remove()
    return out, got


def assert_close(a: np.ndarray, b: torch.Tensor, name: str) -> None:
    b = b.detach().numpy()
    assert a.shape == b.shape, f"{name}: ORT shape {a.shape} vs PyTorch {b.shape}"
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4, err_msg=name)


# -- resnet18, both exporters -----------------------------------------------------
@pytest.fixture(scope="session", params=["dynamo", "torchscript"])
def rn_export(request, resnet18, resnet_input, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"export_{request.param}") / "r18.onnx"
    report = lt.export(resnet18, resnet_input, path, taps=RN_TAPS, exporter=request.param)
    return request.param, path, report


def test_resnet_outputs_are_named_in_order(rn_export):
    exporter, path, report = rn_export
    assert report.exporter == exporter
    assert [r.name for r in report.rows] == RN_NAMES
    assert [o.name for o in session(path).get_outputs()] == RN_NAMES
    assert [i.name for i in session(path).get_inputs()] == ["x"]


def test_resnet_report_passes_at_two_batch_sizes(rn_export):
    _, _, report = rn_export
    assert report.ok, str(report)
    for row in report.rows:
        assert [c.batch for c in row.checks] == [{"x": 2}, {"x": 3}]
        assert row.max_abs is not None and row.max_abs < 1e-3
    data = json.loads(report.to_json())
    assert data["ok"] is True and [r["name"] for r in data["rows"]] == RN_NAMES


@pytest.mark.parametrize("batch", [1, 3])
def test_resnet_ort_matches_pytorch_at_other_batch(rn_export, resnet18, batch):
    _, path, _ = rn_export
    x = torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(batch))
    spec = [("layer1", "output"), ("layer3.1.conv2", "output"), ("layer2.0.relu", "output"),
            ("fc", "output"), ("conv1", "input"), ("fc", "input")]
    out, got = hooked(resnet18, lambda: resnet18(x), spec)
    expected = {
        "output": out,
        "layer1": got[("layer1", "output")][0],
        "layer3.1.conv2": got[("layer3.1.conv2", "output")][0],
        "layer2.0.relu#0": got[("layer2.0.relu", "output")][0],
        "layer2.0.relu#1": got[("layer2.0.relu", "output")][1],
        "fc": got[("fc", "output")][0],
        "logits": got[("fc", "output")][0],
        "conv1:input": x,
        "fc:input": got[("fc", "input")][0],
    }
    values = session(path).run(RN_NAMES, {"x": x.numpy()})
    for name, value in zip(RN_NAMES, values):
        assert_close(value, expected[name], name)
    # The graph-input tap is the input itself, not stale or shared data.
    np.testing.assert_array_equal(values[RN_NAMES.index("conv1:input")], x.numpy())


def test_resnet_duplicate_outputs_are_distinct_tensors(rn_export):
    _, path, _ = rn_export
    model = onnx.load(str(path))
    outs = [o.name for o in model.graph.output]
    assert len(set(outs)) == len(outs)
    assert not set(outs) & {i.name for i in model.graph.input}
    producers = {o for n in model.graph.node for o in n.output}
    assert set(outs) <= producers  # each output is produced by its own node output


def test_resnet_metadata_and_symbolic_batch(rn_export):
    _, path, _ = rn_export
    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    records = json.loads(meta[TAPS_KEY])
    assert [r["name"] for r in records] == RN_NAMES
    by_name = {r["name"]: r for r in records}
    assert by_name["output"]["path"] is None
    assert by_name["layer2.0.relu#1"] == {"name": "layer2.0.relu#1", "selector": "layer2.0.relu#1",
                                          "path": "layer2.0.relu", "call": 1, "port": "output", "index": []}
    assert by_name["logits"]["selector"] == "fc" and by_name["conv1:input"]["port"] == "input"
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for out in model.graph.output:
        assert out.type.tensor_type.shape.dim[0].dim_param == "batch", out.name


# -- tiny CLIP through a callable ----------------------------------------------------
def clip_fn(model, pixel_values, input_ids):
    """Image embeddings, text embeddings and similarity logits in one graph."""
    img = model.get_image_features(pixel_values=pixel_values)
    txt = model.get_text_features(input_ids=input_ids)
    img = img if torch.is_tensor(img) else img.pooler_output
    txt = txt if torch.is_tensor(txt) else txt.pooler_output
    img = img / img.norm(dim=-1, keepdim=True)
    txt = txt / txt.norm(dim=-1, keepdim=True)
    return img, txt, model.logit_scale.exp() * img @ txt.t()


@pytest.fixture(scope="session")
def tiny_clip(torch_mod):
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=2),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16,
    )
    return CLIPModel(cfg).eval()


CLIP_TAPS = ["vis0=vision_model.encoder.layers.0", "text_model.final_layer_norm"]
CLIP_NAMES = ["output[0]", "output[1]", "output[2]", "vis0", "text_model.final_layer_norm"]


@pytest.fixture(scope="session")
def clip_export(tiny_clip, tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    px = torch.randn(2, 3, 32, 32, generator=g)
    ids = torch.randint(0, 100, (3, 7), generator=g)
    path = tmp_path_factory.mktemp("clip") / "clip.onnx"
    report = lt.export(tiny_clip, (px, ids), path, taps=CLIP_TAPS, method=clip_fn)
    return path, report


def test_clip_callable_export_names_and_report(clip_export):
    path, report = clip_export
    assert report.ok, str(report)
    assert [r.name for r in report.rows] == CLIP_NAMES
    sess = session(path)
    assert [i.name for i in sess.get_inputs()] == ["pixel_values", "input_ids"]
    # image and text batches are separate symbols
    assert report.inputs == {"pixel_values": ["batch_pixel_values", 3, 32, 32], "input_ids": ["batch_input_ids", 7]}
    assert [c.batch for c in report.rows[0].checks] == [{"pixel_values": 2, "input_ids": 3},
                                                        {"pixel_values": 3, "input_ids": 4}]


@pytest.mark.parametrize("n_img,n_txt", [(1, 4), (5, 1)])
def test_clip_ort_matches_pytorch_at_other_batches(clip_export, tiny_clip, n_img, n_txt):
    path, _ = clip_export
    g = torch.Generator().manual_seed(10 + n_img)
    px = torch.randn(n_img, 3, 32, 32, generator=g)
    ids = torch.randint(0, 100, (n_txt, 7), generator=g)
    spec = [("vision_model.encoder.layers.0", "output"), ("text_model.final_layer_norm", "output")]
    (img, txt, logits), got = hooked(tiny_clip, lambda: clip_fn(tiny_clip, px, ids), spec)
    layer0 = got[spec[0]][0]
    layer0 = layer0 if torch.is_tensor(layer0) else layer0[0]
    expected = [img, txt, logits, layer0, got[spec[1]][0]]
    values = session(path).run(CLIP_NAMES, {"pixel_values": px.numpy(), "input_ids": ids.numpy()})
    assert values[2].shape == (n_img, n_txt)
    for name, value, ref in zip(CLIP_NAMES, values, expected):
        assert_close(value, ref, name)


# -- aliasing, static shapes, external data ------------------------------------------
class PassThrough(nn.Module):
    """Returns its input as the first output: the case pytorch#167848 gets wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return x, self.lin(x)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_output_aliasing_input_and_taps_on_same_tensor(tmp_path, torch_mod, exporter):
    model = PassThrough().eval()
    taps = ["lin", "again=lin", "lin:input"]
    report = lt.export(model, torch.randn(2, 4), tmp_path / "p.onnx", taps=taps, exporter=exporter)
    names = ["output[0]", "output[1]", "lin", "again", "lin:input"]
    assert report.ok and [r.name for r in report.rows] == names
    x = torch.randn(5, 4)
    values = session(tmp_path / "p.onnx").run(names, {"x": x.numpy()})
    with torch.no_grad():
        y = model.lin(x)
    for name, value, ref in zip(names, values, [x, y, y, y, x]):
        assert_close(value, ref, name)


def test_static_export_fixes_the_batch(tmp_path, torch_mod):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    report = lt.export(model, torch.randn(1, 4), tmp_path / "s.onnx", taps=["0"], dynamic_batch=False,
                       exporter="torchscript")
    assert report.ok and all(len(r.checks) == 1 for r in report.rows)
    assert report.inputs == {"input": [1, 4]}
    assert all(r.shape[0] == 1 for r in report.rows)


def test_batch_of_one_is_widened_and_stays_symbolic(tmp_path, torch_mod):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    report = lt.export(model, torch.randn(1, 4), tmp_path / "d.onnx", taps=["0"], exporter="torchscript")
    assert report.ok and report.inputs == {"input": ["batch", 4]}
    assert any("repeated to 2" in n for n in report.notes)
    x = torch.randn(1, 4)
    out, hid = session(tmp_path / "d.onnx").run(["output", "0"], {"input": x.numpy()})
    with torch.no_grad():
        assert_close(out, model(x), "output")
        assert_close(hid, model[0](x), "0")


def test_external_data_is_written_beside_the_model(tmp_path, torch_mod):
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU()).eval()
    path = tmp_path / "ext.onnx"
    report = lt.export(model, torch.randn(2, 64), path, taps=["0"], exporter="torchscript", export_options=lt.ExportOptions(external_data=True))
    assert report.ok
    assert sorted(os.listdir(tmp_path)) == ["ext.onnx", "ext.onnx.data"]
    proto = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"ext.onnx.data"}
    x = torch.randn(3, 64)
    out, = session(path).run(["output"], {"input": x.numpy()})
    with torch.no_grad():
        assert_close(out, model(x), "output")


def test_input_names_override(tmp_path, torch_mod):
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    report = lt.export(model, (torch.randn(2, 4),), tmp_path / "n.onnx",
                       exporter="torchscript", export_options=lt.ExportOptions(input_names=["features"]))
    assert list(report.inputs) == ["features"]
    with pytest.raises(LayertapError, match="input_names has 2 names"):
        lt.export(model, (torch.randn(2, 4),), tmp_path / "n2.onnx", export_options=lt.ExportOptions(input_names=["a", "b"]))


# -- failures -------------------------------------------------------------------------
class DataDependent(nn.Module):
    """A branch on tensor values: torch.export refuses it, tracing records one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y


class BakesBatch(nn.Module):
    """Uses the batch size as a Python number: traced as a constant, wrong at other batches."""

    def forward(self, x):
        return x * float(x.shape[0])


def test_unknown_tap_names_close_matches_and_writes_nothing(tmp_path, resnet18, resnet_input):
    with pytest.raises(SelectorError, match="did you mean: layer4"):
        lt.export(resnet18, resnet_input, tmp_path / "u.onnx", taps=["layer9"])
    assert os.listdir(tmp_path) == []


def test_dynamo_failure_is_one_line_and_falls_back(tmp_path, torch_mod):
    model = DataDependent().eval()
    x = torch.ones(2, 4)
    with pytest.raises(LayertapError) as info:
        lt.export(model, x, tmp_path / "dd.onnx")
    msg = str(info.value)
    assert "\n" not in msg and "dynamo exporter" in msg and "--exporter torchscript" in msg
    assert os.listdir(tmp_path) == []
    report = lt.export(model, x, tmp_path / "dd.onnx", taps=["lin"], export_options=lt.ExportOptions(fallback=True))
    assert report.exporter == "torchscript" and any("fell back" in n for n in report.notes)
    assert sorted(os.listdir(tmp_path)) == ["dd.onnx"]


def test_verification_failure_is_reported_not_raised(tmp_path, torch_mod):
    report = lt.export(BakesBatch(), torch.randn(2, 3), tmp_path / "b.onnx", exporter="torchscript")
    assert not report.ok
    (row,) = report.rows
    assert [c.ok for c in row.checks] == [True, False]  # right at batch 2, wrong at 3
    assert "FAILED" in str(report)
    assert (tmp_path / "b.onnx").exists()


def test_bad_arguments(tmp_path, torch_mod):
    model = nn.Linear(2, 2)
    with pytest.raises(LayertapError, match="unknown exporter"):
        lt.export(model, torch.ones(1, 2), tmp_path / "a.onnx", exporter="tensorrt")
    with pytest.raises(LayertapError, match="must end in"):
        lt.export(model, torch.ones(1, 2), tmp_path / "a.txt")
    with pytest.raises(LayertapError, match="does not exist"):
        lt.export(model, torch.ones(1, 2), tmp_path / "missing" / "a.onnx")
    with pytest.raises(LayertapError, match="also an output name"):
        lt.export(model, torch.ones(2, 2), tmp_path / "a.onnx", export_options=lt.ExportOptions(input_names=["output"]))
    assert os.listdir(tmp_path) == []


# -- corner cases of export ---------------------------------------------
class Attention(nn.Module):
    """nn.MultiheadAttention: under no_grad it takes a fused path TorchScript cannot export."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.attn(x, x, x)[0])


def test_torchscript_exports_multihead_attention(tmp_path, torch_mod):
    model = Attention().eval()
    report = lt.export(model, torch.randn(2, 5, 8), tmp_path / "a.onnx", taps=["attn[0]", "head:input"],
                       exporter="torchscript")
    assert report.ok, str(report)
    x = torch.randn(3, 5, 8)
    names = ["output", "attn[0]", "head:input"]
    values = session(tmp_path / "a.onnx").run(names, {"x": x.numpy()})
    with torch.no_grad():
        att = model.attn(x, x, x)[0]
        expected = [model.head(att), att, att]
    for name, value, ref in zip(names, values, expected):
        assert_close(value, ref, name)


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.diff(x, dim=1)  # no TorchScript-exporter symbolic at the default opset


def test_torchscript_failure_is_one_line_and_prints_nothing(tmp_path, torch_mod, capfd):
    log = torch._C._jit_onnx_log
    with pytest.raises(LayertapError, match="torchscript exporter failed: .*aten::diff") as info:
        lt.export(Unsupported(), torch.randn(2, 5), tmp_path / "u.onnx", exporter="torchscript")
    assert "\n" not in str(info.value)
    out, err = capfd.readouterr()  # file-descriptor level: C++ prints count too
    assert "Torch IR graph" not in out + err and out == ""
    assert torch._C._jit_onnx_log is log
    assert os.listdir(tmp_path) == []


class BakedReshape(nn.Module):
    """The batch size turned into a Python int: traced as a constant, ORT refuses other batches."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 2)

    def forward(self, x):
        return self.lin(x.reshape(int(x.shape[0]), -1))


def test_ort_refusing_another_batch_is_a_failed_check_not_a_crash(tmp_path, torch_mod, capfd):
    report = lt.export(BakedReshape().eval(), torch.randn(2, 2, 3), tmp_path / "r.onnx", taps=["lin:input"],
                       exporter="torchscript")
    assert not report.ok
    for row in report.rows:
        assert [c.ok for c in row.checks] == [True, False]
        assert row.problem.startswith("ONNX Runtime failed at batch 3:")
    assert "ONNX Runtime failed at batch 3" in str(report)
    assert os.listdir(tmp_path) == ["r.onnx"]
    assert "onnxruntime" not in capfd.readouterr().err  # ORT's own error log stays quiet


class TwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 6, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


def test_bad_tap_fails_before_export_with_real_shapes(tmp_path, torch_mod):
    with pytest.raises(SelectorError, match=r"tuple\(Tensor\[2,5,6\], Tensor\[1,2,6\]\)"):
        lt.export(TwoOut().eval(), torch.randn(2, 5, 4), tmp_path / "g.onnx", taps=["gru"])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_root_taps(tmp_path, torch_mod, exporter):
    """``""`` is the model output itself (named ``output``); ``:input`` the call's input."""
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).eval()
    report = lt.export(model, torch.randn(2, 4), tmp_path / "r.onnx", taps=["", "x_in=:input", "y="],
                       exporter=exporter)
    names = ["output", "x_in", "y"]
    assert report.ok and [r.name for r in report.rows] == names
    x = torch.randn(3, 4)
    values = session(tmp_path / "r.onnx").run(names, {"input": x.numpy()})
    with torch.no_grad():
        y = model(x)
    for name, value, ref in zip(names, values, [y, x, y]):
        assert_close(value, ref, name)


class DictOut(nn.Module):
    """Dict outputs at both levels, like torchvision's segmentation models."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 2)})

    def feats(self, x):
        return {"out": self.body["a"](x), "aux": self.body["b"](x)}

    def forward(self, x):
        f = self.feats(x)
        return {"out": f["out"].relu(), "aux": f["aux"]}


def test_dict_outputs_and_method(tmp_path, torch_mod):
    model = DictOut().eval()
    report = lt.export(model, torch.randn(2, 4), tmp_path / "d.onnx", taps=["body.b", "h=body.a"],
                       method="feats", exporter="torchscript")
    names = ["output[out]", "output[aux]", "body.b", "h"]
    assert report.ok and [r.name for r in report.rows] == names
    x = torch.randn(5, 4)
    values = session(tmp_path / "d.onnx").run(names, {"x": x.numpy()})
    with torch.no_grad():
        f = model.feats(x)
    for name, value, ref in zip(names, values, [f["out"], f["aux"], f["aux"], f["out"]]):
        assert_close(value, ref, name)


def test_bert_model_output_fields_and_keyword_inputs(tmp_path, torch_mod):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, vocab_size=100)).eval()
    g = torch.Generator().manual_seed(4)
    ids, mask = torch.randint(0, 100, (2, 7), generator=g), torch.ones(2, 7, dtype=torch.long)
    report = lt.export(model, (), tmp_path / "b.onnx", taps=["emb=embeddings", "encoder.layer.1[0]"],
                       kwargs={"input_ids": ids, "attention_mask": mask}, exporter="torchscript")
    names = ["output[last_hidden_state]", "output[pooler_output]", "emb", "encoder.layer.1[0]"]
    assert report.ok, str(report)
    assert [r.name for r in report.rows] == names and list(report.inputs) == ["input_ids", "attention_mask"]
    ids, mask = torch.randint(0, 100, (4, 7), generator=g), torch.ones(4, 7, dtype=torch.long)
    mask[1, 4:] = 0
    acts = lt.extract(model, input_ids=ids, attention_mask=mask, taps=["emb=embeddings", "encoder.layer.1[0]"])
    values = session(tmp_path / "b.onnx").run(names, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    for name, value in zip(names, values):
        assert_close(value, acts[name], name)


def test_replacing_an_external_data_model_removes_its_old_data(tmp_path, torch_mod):
    model = nn.Sequential(nn.Linear(64, 64)).eval()
    path = tmp_path / "m.onnx"
    lt.export(model, torch.randn(2, 64), path, exporter="torchscript", export_options=lt.ExportOptions(external_data=True))
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    lt.export(model, torch.randn(2, 64), path, exporter="torchscript")
    assert os.listdir(tmp_path) == ["m.onnx"]
    (tmp_path / "m.onnx.data").write_bytes(b"not ours")  # a .data the old file never referred to stays
    lt.export(model, torch.randn(2, 64), path, exporter="torchscript")
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]


def test_file_reads_the_models_own_module_paths(rn_export, tmp_path):
    """Scopes and weight names carry no wrapper prefix (``_fn.``/``/model/``), so the ONNX side finds modules by path."""
    _, path, _ = rn_export
    modules = {r.module for r in lt.onnx_layers(path).rows if r.module}
    assert {"layer1.0.relu", "layer3.1.bn2", "fc"} <= modules
    assert not any(m.split(".")[0] in ("_fn", "model") for m in modules)
    proto = onnx.load(str(path), load_external_data=False)
    assert not [i.name for i in proto.graph.initializer if i.name.startswith(("_fn.", "model."))]
    assert not [n.name for n in proto.graph.node if n.name.startswith(("/model/", "/_fn/"))]
    added = lt.add_outputs(path, tmp_path / "more.onnx", modules=["layer3.0.bn2"])
    assert list(added) == ["layer3.0.bn2"]


def test_wrapper_hands_the_exporter_each_weight_once(resnet18, resnet_input):
    """The model is one child of the wrapper: registered twice (as ``model`` and as the
    ``forward`` it calls), every weight was a second graph input that torch.export traced
    and decomposed again (lt.export ran 1.5x a plain export)."""
    from layertap.pytorch.wrapper import TapWrapper
    from layertap.selectors import parse_taps

    wrapper = TapWrapper(resnet18, "forward", parse_taps(["layer1"]), (resnet_input,), {})
    names = [n for n, _ in wrapper.named_parameters(remove_duplicate=False)]
    assert len(names) == len(list(resnet18.parameters()))
    assert [n for n, _ in wrapper.named_children()] == ["model"]
    program = torch.export.export(wrapper, (resnet_input,), strict=False)
    lifted = program.graph_signature.inputs_to_parameters
    assert len(lifted) == len(names)
