"""``method=`` takes a method name or a callable ``fn(model, *args, **kwargs)`` everywhere:
lt.extract, lt.tap, lt.layers, lt.export, lt.compare, lt.extract_dataset. Anything else is a
LayertapError that names the bad value."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import layertap as lt
from layertap.errors import LayertapError


class Encoder(nn.Module):
    """``encode`` never calls the root module, so root hooks cannot serve a tap."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def encode(self, x):
        return self.enc(x).relu()

    def forward(self, x):
        return self.head(self.encode(x))


def encode_and_score(model, x):
    """Two methods in one call: the features and doubled scores."""
    h = model.encode(x)
    return h, model.head(h) * 2


TAPS = ["enc", "head", ":input", "score=[1]"]


def _expected(model: Encoder, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        enc = model.enc(x)
        head = model.head(enc.relu())
    return {"enc": enc, "head": head, ":input": x, "score": head * 2, "output[0]": enc.relu(), "output[1]": head * 2}


def test_extract_runs_a_callable_and_serves_root_taps_from_its_call(torch_mod):
    model, x = Encoder().eval(), torch.randn(2, 4)
    got = lt.extract(model, x, taps=TAPS, method=encode_and_score)
    want = _expected(model, x)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, msg=name)


def test_export_of_a_callable_gives_extracts_values(tmp_path, torch_mod):
    model, x = Encoder().eval(), torch.randn(2, 4)
    path = tmp_path / "e.onnx"
    report = lt.export(model, x, path, taps=TAPS, method=encode_and_score, exporter="torchscript")
    names = ["output[0]", "output[1]", "enc", "head", ":input", "score"]
    assert [r.name for r in report.rows] == names and report.ok, str(report)
    other = torch.randn(5, 4)
    got = lt.extract(model, other, taps=TAPS, method=encode_and_score)
    values = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, {"x": other.numpy()})
    for name, value in zip(names, values):
        np.testing.assert_allclose(value, got[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_layers_and_tap_take_a_callable(torch_mod):
    model, x = Encoder().eval(), torch.randn(2, 4)
    table = lt.layers(model, x, method=encode_and_score)
    assert [(r.name, r.shapes) for r in table.rows] == [("", [[2, 6], [2, 3]]), ("enc", [[2, 6]]), ("head", [[2, 3]])]
    # stop_early cannot read a callable's source: it waits for the end, never returns less
    with lt.tap(model, ["enc"], method=encode_and_score, stop_early=True) as taps:
        encode_and_score(model, x)
    assert not taps.stopped
    torch.testing.assert_close(taps["enc"], model.enc(x).detach())
    # a tap pinned to a call is complete once that call is in hand
    assert list(lt.extract(model, x, taps=["enc#0"], method=encode_and_score, stop_early=True)) == ["enc#0"]


def test_compare_and_extract_dataset_take_a_callable(tmp_path, torch_mod):
    model, x = Encoder().eval(), torch.randn(2, 4)
    path = tmp_path / "e.onnx"
    lt.export(model, x, path, method=encode_and_score, exporter="torchscript", verify=False)
    report = lt.compare(lt.Model(model, method=encode_and_score), x, path)
    assert report.ok and {"enc", "head"} <= {r.name for r in report.rows}, str(report)
    data = [np.full(4, i, np.float32) for i in range(6)]
    feats = lt.extract_dataset(lt.Model(model, method=encode_and_score), data, taps=["enc"], out=tmp_path / "f", batch_size=4, dataset_options=lt.DatasetOptions(progress=False))
    np.testing.assert_allclose(feats["enc"], model.enc(torch.from_numpy(np.stack(data))).detach().numpy(), rtol=1e-6)
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert manifest["model"]["method"] == "encode_and_score"


@pytest.mark.parametrize("call", ["extract", "tap", "layers", "export", "compare"])
def test_a_method_that_is_neither_name_nor_callable_is_named_in_the_error(tmp_path, torch_mod, call):
    model, x = Encoder().eval(), torch.randn(2, 4)
    runs = {
        "extract": lambda: lt.extract(model, x, taps=["enc"], method=3),
        "tap": lambda: lt.tap(model, ["enc"], method=3).__enter__(),
        "layers": lambda: lt.layers(model, x, method=3),
        "export": lambda: lt.export(model, x, tmp_path / "m.onnx", method=3),
        "compare": lambda: lt.compare(lt.Model(model, method=3), x, tmp_path / "m.onnx"),
    }
    if call == "compare":
        lt.export(model, x, tmp_path / "m.onnx", exporter="torchscript", verify=False)
    with pytest.raises(LayertapError, match=r"method=3 \(int\) is neither a method name nor a callable"):
        runs[call]()
