"""The CLI parses its command line once and reads each ONNX file once.

Counters sit on the lowest-level calls (``onnx.load`` per path, ``Tap.parse`` of
a text, ``InputSpec.parse``, ``parse_model_spec``), so a second parse or read
anywhere, CLI or library, shows up.
"""

from __future__ import annotations

import collections
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(4, 96)  # weights over 1 KiB: ORT sessions take them out of the graph
            self.act = nn.ReLU()
            self.head = nn.Linear(96, 3)
            with torch.no_grad():
                self.head.weight.mul_(1e7)  # beyond float16's range: the block list names head's node

        def forward(self, x):
            return self.head(self.act(self.fc(x)))
    """
)


@pytest.fixture(scope="module")
def net_files(torch_mod, tmp_path_factory):
    """A model file, its TorchScript export, and a folder with one sample."""
    d = tmp_path_factory.mktemp("parse_once")
    (d / "net.py").write_text(MODEL_FILE)
    spec = f"{d / 'net.py'}:Net"
    from layertap.pytorch.models import load_model

    model, _ = load_model(spec)
    onnx_path = d / "net.onnx"
    torch_mod.onnx.export(model, (torch_mod.zeros(2, 4),), str(onnx_path), dynamo=False,
                          input_names=["x"], output_names=["output"])
    samples = d / "samples"
    samples.mkdir()
    np.save(samples / "s0.npy", np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    return spec, onnx_path, samples


@pytest.fixture
def counts(monkeypatch):
    """Counter of ONNX file reads (by resolved path), tap/input/model-spec parses."""
    import onnx

    import layertap.inputs
    import layertap.selectors
    import layertap.specs

    seen: collections.Counter = collections.Counter()
    load = onnx.load

    def counting_load(f, *a, **k):
        seen[("read", str(Path(f).resolve()))] += 1
        return load(f, *a, **k)

    monkeypatch.setattr(onnx, "load", counting_load)
    tap_parse = layertap.selectors.Tap.parse.__func__
    input_parse = layertap.inputs.InputSpec.parse.__func__
    spec_parse = layertap.specs.parse_model_spec

    def count_tap(cls, text):
        seen["tap texts parsed"] += isinstance(text, str)
        return tap_parse(cls, text)

    def count_input(cls, text):
        seen["input specs parsed"] += 1
        return input_parse(cls, text)

    def count_spec(text):
        seen["model specs checked"] += 1
        return spec_parse(text)

    monkeypatch.setattr(layertap.selectors.Tap, "parse", classmethod(count_tap))
    monkeypatch.setattr(layertap.inputs.InputSpec, "parse", classmethod(count_input))
    monkeypatch.setattr(layertap.specs, "parse_model_spec", count_spec)
    return seen


def _reads(counts: collections.Counter, path: Path) -> int:
    return counts[("read", str(path.resolve()))]


def test_compare_reads_the_candidate_once(net_files, counts, tmp_path):
    """--inputs (the candidate's input names), the comparison, --fp16-block-list and --node-data
    all use one read of the candidate; --input and MODEL are parsed and checked once."""
    from layertap.cli.main import main

    spec, cand, samples = net_files
    block, nodes = tmp_path / "block.json", tmp_path / "nodes.json"
    rc = main(["compare", spec, str(cand), "--input", "2x4", "--inputs", str(samples),
               "--fp16-block-list", str(block), "--node-data", str(nodes), "--json"])
    assert rc == 0
    assert _reads(counts, cand) == 1
    assert counts["input specs parsed"] == 1 and counts["model specs checked"] == 1
    import onnx

    graph = onnx.load(str(cand)).graph
    assert json.loads(block.read_text()) == ["/head/Gemm"]  # the one module beyond float16's range
    error = json.loads(nodes.read_text())["results"]
    assert error and set(error) <= {n.name for n in graph.node}


def test_compare_onnx_reference_reads_each_file_once(net_files, counts, tmp_path):
    """ONNX vs ONNX: REF is read once for the comparison (its input names for --inputs, then the
    comparison) and once more, with its weights, by --fp16-block-list, which converts it; CAND once
    (the comparison, then --fp16-block-list and --node-data)."""
    import shutil

    from layertap.cli.main import main

    _, ref, samples = net_files
    cand = tmp_path / "cand.onnx"
    shutil.copyfile(ref, cand)
    nodes = tmp_path / "nodes.json"
    rc = main(["compare", str(ref), str(cand), "--inputs", str(samples), "--no-ort-opt",
               "--fp16-block-list", str(tmp_path / "block.json"), "--node-data", str(nodes), "--json"])
    assert rc == 0
    assert (_reads(counts, ref), _reads(counts, cand)) == (2, 1)
    assert json.loads((tmp_path / "block.json").read_text()) == ["/head/Gemm"]
    import onnx

    error = json.loads(nodes.read_text())["results"]
    assert error and set(error) <= {n.name for n in onnx.load(str(cand)).graph.node}


def test_compare_reads_the_module_scopes_once(net_files, monkeypatch, tmp_path):
    """--local and --node-data use the module scopes the comparison read: the candidate's
    ScopeMap is built once for the whole command."""
    from layertap.cli.main import main
    from layertap.onnxfile.scopemap import ScopeMap

    built: list[int] = []
    from_model = ScopeMap.from_model.__func__

    def counting(cls, model, **kw):
        built.append(len(model.graph.node))
        return from_model(cls, model, **kw)

    monkeypatch.setattr(ScopeMap, "from_model", classmethod(counting))
    spec, cand, _ = net_files
    nodes = tmp_path / "nodes.json"
    assert main(["compare", spec, str(cand), "--input", "2x4", "--local", "--node-data", str(nodes), "--json"]) == 0
    assert len(built) == 1
    module = json.loads(nodes.with_name("nodes.module.json").read_text())["results"]
    assert module["/head/Gemm"]["value"] == "head" and module["/fc/Gemm"]["value"] == "fc"


def test_compare_samples_parse_inputs_once(net_files, counts):
    """--samples N draws N inputs from the one parse of --input."""
    from layertap.cli.main import main

    spec, cand, _ = net_files
    assert main(["compare", spec, str(cand), "--input", "2x4", "--samples", "3", "--json"]) == 0
    assert counts["input specs parsed"] == 1 and counts["model specs checked"] == 1
    assert _reads(counts, cand) == 1


def test_export_parses_taps_once(net_files, counts, tmp_path):
    """Each --tap text is parsed once (the library takes the parsed taps), --input and MODEL once."""
    import onnx

    from layertap.cli.main import main

    spec, _, _ = net_files
    out = tmp_path / "tapped.onnx"
    rc = main(["export", spec, "--input", "2x4", "--tap", "fc", "--tap", "hidden=act", "-o", str(out),
               "--exporter", "torchscript", "--json"])
    assert rc == 0
    assert counts["tap texts parsed"] == 2
    assert counts["input specs parsed"] == 1 and counts["model specs checked"] == 1
    assert [o.name for o in onnx.load(str(out)).graph.output][1:] == ["fc", "hidden"]


def test_layers_parses_inputs_and_model_once(net_files, counts, capsys):
    from layertap.cli.main import main

    spec, _, _ = net_files
    assert main(["layers", spec, "--input", "2x4", "--json"]) == 0
    assert counts["input specs parsed"] == 1 and counts["model specs checked"] == 1
    paths = [r["path"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert paths == ["", "fc", "act", "head"]


def test_run_reads_the_file_once(net_files, counts, capsys):
    """``run FILE --tap``: the taps resolve against the one read of the file."""
    from layertap.cli.main import main

    _, onnx_path, _ = net_files
    assert main(["run", str(onnx_path), "--tap", "fc", "--input", "2x4", "--json"]) == 0
    assert _reads(counts, onnx_path) == 1
    names = [r["name"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert names == ["output", "fc"]
