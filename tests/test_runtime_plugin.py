"""A runtime added from outside, through the public plug-in protocol alone: a numpy interpreter (onnx's
ReferenceEvaluator) registered with ``lt.register_runtime`` gets ``run``, ``compare`` rows with verdicts, and
a ``fix`` search, with no file of the package touched. Its kernels can be broken on purpose (one op of one
dtype), as a faulty backend's would be, and layertap must name the module that runs them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_relu import Relu
from torch import nn

import layertap as lt
from layertap.runtimes import InputInfo, RuntimeInfo, RuntimeSettings
from layertap.runtimes.plugins import VERBS, YES, plugin, runtime_matrix
from layertap.runtimes.source import SessionSource, open_source


def _type_text(elem: int) -> str:
    return {onnx.TensorProto.FLOAT: "tensor(float)", onnx.TensorProto.FLOAT16: "tensor(float16)",
            onnx.TensorProto.INT64: "tensor(int64)"}[elem]


class NumpyEngine:
    """One graph in the reference interpreter: a feed by name in, outputs by name out."""

    def __init__(self, model: onnx.ModelProto, new_ops: list) -> None:
        self.model, self.evaluator = model, ReferenceEvaluator(model, new_ops=new_ops)

    def get_inputs(self) -> list[InputInfo]:
        init = {t.name for t in self.model.graph.initializer}
        return [InputInfo(i.name, _type_text(i.type.tensor_type.elem_type),
                          [d.dim_value or d.dim_param or None for d in i.type.tensor_type.shape.dim])
                for i in self.model.graph.input if i.name not in init]

    def output_names(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    def run(self, names, feed):
        got = dict(zip(self.output_names(), self.evaluator.run(None, dict(feed))))
        return got if names is None else {n: got[n] for n in names}


class NumpyRuntime:
    """The engine opener: every tensor of a graph can be an output; parts run as the whole does."""

    optimize = True
    carries_branches = False

    def __init__(self, name: str, new_ops: list) -> None:
        self.name, self.new_ops = name, new_ops

    def open(self, model, outputs=(), *, only=False):
        source = open_source(model)[0] if isinstance(model, Path) else model
        graph = source.inlined()
        if only:
            del graph.graph.output[:]
        known = {o.name for o in graph.graph.output}
        for o in outputs:
            if (o if isinstance(o, str) else o.name) not in known:
                graph.graph.output.append(o if not isinstance(o, str) else onnx.helper.make_empty_tensor_value_info(o))
        return NumpyEngine(graph, self.new_ops)

    def open_tapped(self, source: SessionSource, tensors):
        return self.open(source)

    def open_part(self, source: SessionSource, part):
        return NumpyEngine(source.inlined(part), self.new_ops)

    def open_file(self, path, *, timing=False):
        return NumpyEngine(onnx.load(str(path)), self.new_ops)

    def exposable(self, model):
        return None

    def settings(self) -> str:
        return ""

    def rounding_note(self) -> str:
        return ""

    def describe(self) -> RuntimeInfo:
        return RuntimeInfo("numpy reference", onnx.__version__, "CPU", "the file's own types")


class NumpyPlugin:
    """The plug-in: a graph runtime that runs ONNX files, every verb a graph runtime has."""

    title = "numpy reference interpreter"
    form = "graph"
    suffixes: tuple[str, ...] = ()
    matrix = {verb: YES for verb in VERBS}

    def __init__(self, name: str, new_ops: list | None = None) -> None:
        self.name, self.new_ops = name, list(new_ops or [])

    def open(self, settings: RuntimeSettings) -> NumpyRuntime:
        settings.refuse(self.name, (), "the numpy interpreter has no settings")
        return NumpyRuntime(self.name, self.new_ops)


def _broken_run(self, x):
    (y,) = Relu._run(self, x)
    return (y * np.float16(1.5),) if y.dtype == np.float16 else (y,)


#: a ReLU kernel that is wrong at float16 only (it scales its output by 1.5), as a backend's faulty
#: half-precision kernel would be (the interpreter takes an op's type from its class name)
BrokenRelu = type("Relu", (Relu,), {"op_domain": "", "_run": _broken_run})


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act1 = nn.Linear(8, 16), nn.ReLU()
        self.fc2, self.act2 = nn.Linear(16, 16), nn.Tanh()
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(2, 8)
    path = tmp_path_factory.mktemp("plugin") / "net.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False)
    return model, x, path


@pytest.fixture(scope="module")
def runtimes():
    lt.register_runtime(NumpyPlugin("numpy"))
    lt.register_runtime(NumpyPlugin("numpy-broken", [BrokenRelu]))
    return "numpy", "numpy-broken"


def test_run_in_the_outside_runtime_gives_onnx_runtimes_values(exported, runtimes):
    model, x, path = exported
    got = lt.run(path, [x.numpy()], taps=["act1"], runtime="numpy")
    want = lt.run(path, [x.numpy()], taps=["act1"])
    assert list(got) == ["output", "act1"]
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_compare_rows_and_verdicts_come_from_the_outside_runtime(exported, runtimes, tmp_path):
    model, x, path = exported
    report = lt.compare(model, x, path, samples=2, runtime_options=lt.RuntimeOptions(cand_runtime="numpy"))
    assert report.ok and [r.path for r in report.rows] == ["fc1", "act1", "fc2", "act2", "fc3", ""]
    assert report.runtimes["candidate"]["runtime"] == "numpy reference"
    # the broken kernel: a float16 copy of the file, its ReLU wrong in this runtime only
    half = tmp_path / "net16.onnx"
    from onnxconverter_common import float16

    onnx.save(float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(half))
    assert lt.compare(model, x, half, samples=2).ok  # ONNX Runtime's float16 ReLU is right
    broken = lt.compare(model, x, half, samples=2, runtime_options=lt.RuntimeOptions(cand_runtime="numpy-broken"))
    assert not broken.ok and broken.first_divergence == "act1"
    # --local runs the part in the plug-in too: the ReLU alone is wrong, the Linear before it is not
    local = lt.compare(model, x, half, local=True, runtime_options=lt.RuntimeOptions(cand_runtime="numpy-broken"))
    rows = {r.path: r for r in local.rows}
    assert rows["act1"].local_rel > 0.3 > 1e-2 > rows["fc1"].local_rel


def test_fix_searches_in_the_outside_runtime(exported, runtimes, tmp_path):
    model, x, path = exported
    # ONNX Runtime: the plain float16 file meets the target, nothing kept
    assert lt.fix(path, to="fp16", out=tmp_path / "a.onnx", samples=4, target="rel:1e-2").kept == []
    # the broken runtime: the search keeps the module its faulty kernel runs, and the file it writes meets
    # the target when that runtime runs it
    report = lt.fix(path, to="fp16", out=tmp_path / "b.onnx", samples=4, target="rel:1e-2",
                    search_options=lt.SearchOptions(runtime="numpy-broken"))
    assert report.ok and report.kept == ["act1"] and not report.steps[0].ok  # the plain file misses it
    got = lt.run(tmp_path / "b.onnx", [x.numpy()], runtime="numpy-broken")["output"]
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-2, atol=1e-2)


def test_cli_names_an_outside_runtime_and_refuses_an_unknown_one(exported, runtimes, capsys):
    from layertap.cli.main import main

    model, x, path = exported
    assert main(["run", str(path), "--runtime", "numpy", "--json"]) == 0
    assert main(["run", str(path), "--runtime", "nunpy"]) == 2
    err = capsys.readouterr().err
    assert "unknown runtime 'nunpy'" in err and "numpy" in err


def test_a_bad_plugin_is_refused_with_what_it_lacks():
    class NoForm:
        name, title = "half", "half a plug-in"

    with pytest.raises(lt.LayertapError, match="is not a runtime plug-in: it needs form, suffixes, matrix, open"):
        lt.register_runtime(NoForm())
    with pytest.raises(lt.LayertapError, match="unknown runtime 'half'"):
        plugin("half")


def test_the_runtime_matrix_document_is_the_plugins_declarations():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "runtimes.md").read_text()
    section = doc.split("<!-- runtime-matrix -->\n")[1].split("<!-- /runtime-matrix -->")[0]
    assert section == runtime_matrix(), "regenerate it: make runtimes-doc"
