"""Compiled PyTorch as a candidate (``--cand-runtime inductor``, ``lt.compare(model, x, torch.compile(model))``):
rows by module path judged against float64 beside eager, graph breaks as rows, taps that change nothing, the
fewest modules kept eager by ``fix``. Most cases hand torch.compile a backend that runs the FX graph in Python
(fast, and able to break one op); the inductor runs are few and marked slow."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torchvision
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass

import layertap as lt
from _faults import faulty_backend
from layertap.errors import LayertapError
from layertap.options import RuntimeOptions, SearchOptions
from layertap.pytorch.compiled import keep_eager


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64)


def test_a_wrong_op_in_the_compiled_graph_is_named_at_its_module(resnet):
    model, x = resnet
    report = lt.compare(model, x, torch.compile(model, backend=faulty_backend("layer3.0.conv1")))
    assert not report.ok
    assert report.first_divergence == "layer3.0.conv1"
    assert all(r.ok for r in report.rows[: [r.name for r in report.rows].index("layer3.0.conv1")])
    text = str(report)
    assert "compiled loses" in text and "what eager float32 loses here against float64" in text
    assert report.to_dict()["versus"] == {"candidate": "compiled", "ideal": "eager float32", "reference": "float64"}
    assert any("tapping changed nothing" in n for n in report.notes)


def test_a_healthy_compile_passes_with_rows_for_every_module(resnet):
    model, x = resnet
    report = lt.compare(model, x, torch.compile(model, backend="aot_eager"), samples=2)
    assert report.ok, str(report)
    assert {r.name for r in report.rows} >= {"layer3.0.conv1", "layer4.1", "fc", "output"}
    row = next(r for r in report.rows if r.name == "layer4.1")
    assert row.format_rel is not None and row.format_rel > 0  # eager float32 against float64
    assert report.samples == 2


@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_a_transformer_block_passes_at_float32_and_under_bf16_autocast(autocast):
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 6, 32)
    report = lt.compare(block, x, torch.compile(block, backend="aot_eager"),
                        runtime_options=RuntimeOptions(autocast=autocast))
    assert report.ok, str(report)
    precision = "bfloat16" if autocast else "float32"
    assert report.versus == ("compiled", f"eager {precision}", "float64")
    assert report.runtimes["candidate"]["precision"] == precision
    out = next(r for r in report.rows if r.name == "output")
    # eager's own error against float64 is what the rows are judged beside: bfloat16's is far larger
    assert (out.format_rel > 1e-3) if autocast else (0 < out.format_rel < 1e-5)


def test_a_candidate_called_with_keyword_tensors_gets_them_as_the_model_does():
    """A padding mask given by keyword reaches the compiled candidate, its tapped copy and the float64 reference
    alike: the block's output depends on it, and every row passes."""
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 3:] = True
    with torch.no_grad():
        assert not torch.allclose(block(x, src_key_padding_mask=mask)[1], block(x)[1], atol=1e-3)  # the mask matters
    report = lt.compare(block, None, torch.compile(block, backend="aot_eager"),
                        samples=[{"src": x, "src_key_padding_mask": mask}])
    assert report.ok, str(report)
    assert {r.name: r.status for r in report.rows}["linear2"] == "pass" and report.versus[2] == "float64"


def test_no_cxx_compiler_says_how_to_get_one(tmp_path):
    import os
    import subprocess
    import sys

    net = tmp_path / "net.py"
    net.write_text("import torch\nNet = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), "
                   "torch.nn.LayerNorm(4)).eval()\n")
    env = {**os.environ, "CXX": "no-such-compiler-here", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "layertap", "compare", f"{net}:Net", "--input", "2x4",
                           "--cand-runtime", "inductor"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2, done.stderr
    assert "needs a C++ compiler" in done.stderr and "--compile-backend aot_eager" in done.stderr


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum() > 0:  # data-dependent: dynamo breaks the graph here
            y = y * 2
        return y


def test_a_graph_break_is_a_note_on_its_module_row():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _Branchy(), nn.ReLU()).eval()
    report = lt.compare(model, torch.randn(2, 4), torch.compile(model, backend="eager"))
    assert report.ok
    row = next(r for r in report.rows if r.name == "1")
    assert "graph break" in row.note
    assert any("graph break" in n for n in report.notes)
    assert "graph break" not in (next(r for r in report.rows if r.name == "0").note or "")


def test_another_checkpoint_as_candidate_names_the_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with pytest.raises(LayertapError, match="weights"):
        lt.compare(model, torch.randn(2, 4), other)


def test_fix_keeps_the_faulted_module_eager_and_writes_keep_eager_json(resnet, tmp_path):
    model, x = resnet
    out = tmp_path / "keep-eager.json"
    report = lt.fix(model, x, to="fp32", out=out, target="cosine:0.99999", samples=2,
                    search_options=SearchOptions(runtime="inductor",
                                                 runtime_settings={"compile_backend": faulty_backend("layer3.0.conv1")}))
    assert report.ok, str(report)
    assert report.kept and all(k == "layer3.0.conv1" or "layer3.0.conv1".startswith(k + ".") for k in report.kept)
    assert "kept eager: 1 module" in str(report) or "kept eager:" in str(report)
    written = json.loads(out.read_text())
    assert written["keep_eager"] == report.kept and "keep_eager" in written["apply"]
    # the cure applied as the file says: the faulty backend no longer reaches the module
    fixed = keep_eager(copy.deepcopy(model), out)
    got = torch.compile(fixed, backend=faulty_backend("layer3.0.conv1"))(x)
    assert torch.nn.functional.cosine_similarity(got.flatten(), model(x).flatten(), dim=0) > 0.99999


def test_keep_eager_refuses_a_module_that_is_not_there():
    with pytest.raises(LayertapError, match="unknown module 'fc2'"):
        lt.keep_eager(nn.Sequential(nn.Linear(2, 2)), ["fc2"])


def test_a_model_that_cannot_compile_is_one_line_naming_the_module():
    model = nn.Sequential(nn.Linear(4, 4), _Branchy()).eval()
    with pytest.raises(LayertapError, match=r"could not compile the model in 1\b"):
        lt.compare(model, torch.randn(2, 4), torch.compile(model, backend="eager", fullgraph=True))


def test_cli_compares_a_model_with_itself_compiled(cli):
    done = cli("compare", "torchvision:resnet18", "--input", "1x3x32x32", "--cand-runtime", "inductor",
               "--compile-backend", "aot_eager", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] and data["versus"]["ideal"] == "eager float32"


def test_cli_refuses_autocast_for_an_onnx_candidate(cli, tmp_path):
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (torch.randn(1, 4),), path, dynamo=False)
    done = cli("compare", str(path), str(path), "--autocast", "bf16")
    assert done.returncode == 2 and "--cand-runtime inductor" in done.stderr


def test_cli_fix_writes_keep_eager_json(cli, tmp_path):
    out = tmp_path / "keep-eager.json"
    done = cli("fix", "torchvision:resnet18", "--input", "1x3x32x32", "--runtime", "inductor", "--compile-backend",
               "aot_eager", "--samples", "2", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["keep_eager"] == []


@pytest.mark.slow
def test_inductor_resnet18_passes_at_float32_and_under_bf16_autocast(resnet):
    model, x = resnet
    report = lt.compare(model, x, torch.compile(model))
    assert report.ok, str(report)
    assert any("tapping changed nothing" in n or "differ from the program's" in n for n in report.notes)
    bf16 = lt.compare(model, x, torch.compile(model), runtime_options=RuntimeOptions(autocast="bf16"))
    assert bf16.ok, str(bf16)


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU(inplace=True)  # overwrites bn's output: taps must clone
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.bn(self.conv(x))))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    torch.manual_seed(0)
    model = _Small().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 16, 16)
    path = tmp_path_factory.mktemp("aoti") / "m.pt2"
    report = lt.export(model, x, path, taps=["bn", "act", "head.1"])
    return model, x, path, report


def test_an_aotinductor_package_with_taps_equals_hooks(package):
    model, x, path, report = package
    assert report.ok and [r.name for r in report.rows] == ["output", "bn", "act", "head.1"]
    hooks = lt.extract(model, x, taps=["bn", "act", "head.1"])
    got = lt.run(path, [x.numpy()])
    for name in ("bn", "act", "head.1"):
        assert torch.allclose(torch.from_numpy(got[name]), hooks[name], atol=1e-5), name
    table = lt.onnx_layers(path)
    assert [(r.name, r.module) for r in table.rows if r.op == "tap"] == [("bn", "bn"), ("act", "act"), ("head.1", "head.1")]


def test_compare_a_model_with_its_package_by_module(package):
    model, x, path, _ = package
    report = lt.compare(model, x, path)
    assert report.ok, str(report)
    assert {r.name for r in report.rows} >= {"conv", "bn", "act", "head.2", "output"}
    assert any("tapping changed nothing" in n for n in report.notes)
    other = _Small().eval()
    with pytest.raises(LayertapError, match="weights"):
        lt.compare(other, x, path)


def test_a_package_that_is_not_one_is_one_line(tmp_path, cli):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    done = cli("layers", str(bad))
    assert done.returncode == 2 and "cannot load" in done.stderr and len(done.stderr.strip().splitlines()) == 1


class _CastsToFloat32(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).float() * self.scale.float()  # float32 whatever came in


def test_a_model_that_does_not_run_in_float64_is_compared_against_itself_and_says_so():
    torch.manual_seed(0)
    model = _CastsToFloat32().eval()
    report = lt.compare(model, torch.randn(2, 4), torch.compile(model, backend="aot_eager"))
    assert report.ok, str(report)
    assert report.versus is None
    assert any("does not run in float64" in n for n in report.notes)


class _Net(nn.Module):
    """A small CNN whose ReLU runs twice (calls ``relu#0``, ``relu#1``), whose BatchNorms inductor fuses into the
    ReLU's kernel, and whose ``Flatten`` is a view of a convolution's buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Sequential(nn.Conv2d(8, 4, 16), nn.Flatten(), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        return self.head(self.relu(self.bn2(self.conv2(y)) + y))


def _counting_builds(monkeypatch) -> list[int]:
    """Every C++ build inductor starts from here on (a kernel it has not built yet)."""
    from torch._inductor import cpp_builder

    builds: list[int] = []
    original = cpp_builder.CppBuilder.build

    def build(self, *args, **kwargs):
        builds.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", build)
    return builds


@pytest.mark.slow
def test_an_inductor_candidate_is_compiled_once_and_its_rows_are_its_own_buffers(monkeypatch):
    """No copy compiled with taps inside: the rows are the buffers of the program a plain compile makes (a plain
    compile after the compare builds no kernel), a BatchNorm inductor fused into the ReLU's kernel is absorbed
    there, a module called twice has a row per call, and a Flatten reads its convolution's buffer reshaped."""
    from torch._inductor.utils import fresh_cache

    torch.manual_seed(0)
    model, x = _Net().eval(), torch.randn(1, 3, 16, 16)
    builds = _counting_builds(monkeypatch)
    with fresh_cache():
        report = lt.compare(model, x, torch.compile(model))
        compared = len(builds)
        with torch.no_grad():
            torch.compile(copy.deepcopy(model))(x)
    assert report.ok, str(report)
    assert compared > 0 and len(builds) == compared
    rows = {r.name: r for r in report.rows}
    assert rows["bn1"].status == "absorbed" and "inductor fused it into relu#0's kernel" in rows["bn1"].note
    assert rows["bn2"].status == "absorbed" and "relu#1's kernel" in rows["bn2"].note
    assert {rows[n].status for n in ("conv1", "relu#0", "conv2", "relu#1", "head.0", "head.1", "head.2", "output")} == {"pass"}
    assert rows["head.1"].shape == [1, 4]
    assert any("buffers the compiled program itself writes" in n for n in report.notes)
    assert any("tapping changed nothing" in n for n in report.notes)


class _ScaledWeight(CustomGraphPass):
    """An inductor post-grad pass (a ``CustomGraphPass``) that scales the weight the convolution of the module
    named ``path`` reads: a wrong kernel input inside an inductor program."""

    def __init__(self, path: str, factor: float = 1.05) -> None:
        self.path, self.factor = path, factor

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.nodes:
            stack = node.meta.get("nn_module_stack") or {}
            if node.target is torch.ops.aten.convolution.default and any(
                    str(v[0]).split(".")[-1] == self.path for v in stack.values()):
                weight = node.args[1]
                with graph.inserting_before(node):
                    scaled = graph.call_function(torch.ops.aten.mul.Tensor, (weight, self.factor))
                scaled.meta["val"] = weight.meta["val"]
                node.replace_input_with(weight, scaled)
                return

    def uuid(self) -> tuple:
        return ("layertap-test-scaled-weight", self.path, self.factor)


@pytest.mark.slow
def test_a_wrong_kernel_input_in_an_inductor_program_is_named_at_its_module():
    torch.manual_seed(0)
    model, x = _Net().eval(), torch.randn(1, 3, 16, 16)
    report = lt.compare(model, x, torch.compile(model, options={"post_grad_custom_post_pass": _ScaledWeight("conv2")}))
    assert not report.ok
    assert report.first_divergence == "conv2"
    names = [r.name for r in report.rows]
    assert "FAIL" not in {r.status for r in report.rows[: names.index("conv2")]}


def test_the_wrapper_gets_a_store_after_the_kernel_that_writes_each_buffer_and_nowhere_else():
    from layertap.pytorch.inductor_taps import rewrite

    code = "\n".join([
        "cpp_fused_0 = async_compile.cpp_pybinding(['float*'], '''",
        "extern \"C\" void kernel(float* buf1) {}",  # a kernel's source: never touched
        "''')",
        "class Runner:",
        "    def call(self, args):",
        "        arg0_1, = args",
        "        buf0 = empty_strided_cpu((8, ), (1, ), torch.float32)",
        "        # Topologically Sorted Source Nodes: [x], Original ATen: [aten.convolution]",
        "        buf1 = extern_kernels.convolution(arg0_1, buf0, stride=(1, 1))",
        "        del buf0",
        "        buf2 = buf1; del buf1  # reuse",
        "        cpp_fused_relu_1(buf2, arg0_1)",
        "        assert_size_stride(buf2, (8, ), (1, ))",
        "        cpp_fused_add_2(buf2, buf3)",
        "        return (buf2, )",
        "",
        "runner = Runner()",
    ])
    got = rewrite(code, {"buf1": (("conv", 0),), "buf2": (("act", 0), ("block", 0))}).split("\n")
    assert got[:4] == code.split("\n")[:4]
    assert got[8].endswith("stride=(1, 1)); _layertap_store((('conv', 0),), buf1)")
    assert got[10] == "        buf2 = buf1; del buf1  # reuse"
    assert got[11] == "        cpp_fused_relu_1(buf2, arg0_1); _layertap_store((('act', 0), ('block', 0)), buf2)"
    assert got[13] == "        cpp_fused_add_2(buf2, buf3)"  # read after: stored once, where it was written
    assert got[-2:] == ["from layertap.pytorch.inductor_taps import store as _layertap_store", ""]
    assert len(got) == len(code.split("\n")) + 2  # the import goes at the end: every line keeps its number


@pytest.mark.slow
@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_an_inductor_timm_vision_transformer_passes_at_float32_and_under_bf16_autocast(autocast):
    """Attention under inductor: the fused kernels' buffers are the rows; a LayerScale or DropPath that computes
    nothing in the program reads the value it returns (its block's attention output)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10).eval()
    x = torch.randn(1, 3, 32, 32)
    report = lt.compare(model, x, torch.compile(model), runtime_options=RuntimeOptions(autocast=autocast))
    assert report.ok, str(report)
    rows = {r.name: r for r in report.rows}
    assert {rows[n].status for n in ("blocks.0.attn.qkv", "blocks.1.mlp.fc2", "blocks.1.ls2", "head")} == {"pass"}
    assert rows["blocks.1.ls2"].format_rel == rows["blocks.1.mlp.drop2"].format_rel  # the value it returns
    assert report.versus == ("compiled", f"eager {'bfloat16' if autocast else 'float32'}", "float64")


class _Two(nn.Module):
    """A module returning two values of different shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.a(x)), self.b(x).relu()


class _TwoHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.two, self.head = _Two(), nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.two(x)
        return self.head(torch.cat([a, b], -1))


@pytest.mark.slow
def test_a_module_returning_two_values_has_its_row_from_an_inductor_program():
    """Each value of the tuple is read from the buffer the program writes for it, matched to the module's values
    by shape."""
    torch.manual_seed(0)
    model, x = _TwoHead().eval(), torch.randn(2, 8)
    report = lt.compare(model, x, torch.compile(model))
    assert report.ok, str(report)
    assert {r.name: r.status for r in report.rows}["two"] == "pass"
    assert any("buffers the compiled program itself writes" in n for n in report.notes)


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.gru, self.head = nn.Linear(8, 16), nn.GRU(16, 32, batch_first=True), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, h = self.gru(torch.tanh(self.enc(x)))
        return self.head(out[:, -1] + h[-1])


def test_a_model_dynamo_compiles_nothing_of_says_its_rows_are_eager():
    """Dynamo skips RNN modules (``allow_rnn`` off) and so runs the whole frame eagerly: the rows are right,
    and the report says they are eager PyTorch's, not compiled kernels'."""
    torch.manual_seed(0)
    model, x = _Recurrent().eval(), torch.randn(2, 5, 8)
    report = lt.compare(model, x, torch.compile(model))
    assert report.ok, str(report)
    assert {r.name: r.status for r in report.rows}["gru"] == "pass"
    assert any(n.startswith("dynamo compiled no graph of the model") for n in report.notes)
