"""lt.export of models whose own modules are called ``model`` (every Hugging Face ``*ForCausalLM``):
outputs keep the taps' names, verification finds them, scopes and weights read as ``named_modules()``.

Every ORT value is compared with a PyTorch value taken by plain hooks, at a batch
size other than the exported one.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import layertap as lt


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _hooked_outputs(model: nn.Module, paths: list[str], run) -> dict[str, torch.Tensor]:
    """Each module's output (or ``PATH:input``'s first argument) from plain hooks while ``run()`` runs."""
    got: dict[str, torch.Tensor] = {}
    handles = []
    for key in paths:
        path, _, port = key.partition(":")
        mod = model.get_submodule(path)
        if port == "input":
            handles.append(mod.register_forward_pre_hook(lambda m, a, key=key: got.__setitem__(key, a[0].clone())))
        else:
            handles.append(mod.register_forward_hook(lambda m, a, o, key=key: got.__setitem__(key, o.clone())))
    try:
        with torch.no_grad():
            got["output"] = run()
    finally:
        for h in handles:
            h.remove()
    return got


def _module_paths(path) -> set[str]:
    return {r.module for r in lt.onnx_layers(path).rows if r.module}


@pytest.fixture(scope="module")
def tiny_llama(torch_mod):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # Eager attention: the TorchScript exporter cannot convert SDPA with grouped KV heads.
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_causal_lm_taps_under_model_keep_their_names_and_verify(tiny_llama, tmp_path, exporter):
    taps = ["model.layers.1.mlp", "model.norm"]
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    path = tmp_path / "llama.onnx"
    report = lt.export(tiny_llama, (ids,), path, taps=taps, exporter=exporter)
    names = ["output[logits]", *taps]
    assert [r.name for r in report.rows] == names
    assert report.ok and all(r.ok for r in report.rows), str(report)
    assert [o.name for o in _session(path).get_outputs()] == names
    # The scopes and weights drop the wrapper's level only: the user's ``model.`` stays.
    assert {"model.layers.1.mlp", "model.norm", "lm_head"} <= _module_paths(path)
    inits = {i.name for i in onnx.load(str(path), load_external_data=False).graph.initializer}
    assert "model.embed_tokens.weight" in inits and not any(n.startswith("model.model.") for n in inits)
    other = torch.randint(0, 100, (3, 5), generator=torch.Generator().manual_seed(2))
    ref = _hooked_outputs(tiny_llama, taps, lambda: tiny_llama(other).logits)
    values = _session(path).run(names, {"input_ids": other.numpy()})
    for name, value in zip(names, values):
        np.testing.assert_allclose(value, ref[name.replace("output[logits]", "output")].numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


class Collide(nn.Module):
    """Children named like the export wrapper's attributes, present (``model``) and past (``_fn``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 6), nn.ReLU())
        self._fn = nn.Linear(6, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        return self.head(self._fn(self.model(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_children_named_model_and_fn_keep_their_paths(tmp_path, torch_mod, exporter):
    model = Collide().eval()
    taps = ["model", "model.0", "_fn", "model.1:input", "head"]
    path = tmp_path / "c.onnx"
    report = lt.export(model, torch.randn(2, 4), path, taps=taps, exporter=exporter, export_options=lt.ExportOptions(input_names=["model.x"]))
    names = ["output", *taps]
    assert [r.name for r in report.rows] == names and report.ok, str(report)
    sess = _session(path)
    assert [i.name for i in sess.get_inputs()] == ["model.x"]
    assert {"model.0", "_fn", "head"} <= _module_paths(path)
    x = torch.randn(5, 4)
    ref = _hooked_outputs(model, taps, lambda: model(x))
    for name, value in zip(names, sess.run(names, {"model.x": x.numpy()})):
        np.testing.assert_allclose(value, ref[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
