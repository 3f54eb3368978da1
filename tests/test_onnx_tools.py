"""ONNX files that other tools rewrote: ORT-optimised, quantised, float16, onnxslim.

Every module tap on such a file either equals PyTorch's value (float tolerance;
quantisation tolerance for int8) or is refused with a reason; none is answered
with another module's value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import layertap as lt
from _tiny import tiny_bert_config
from layertap.errors import OnnxFileError
from layertap.onnxfile.scopemap import ScopeMap
from layertap.selectors import Tap

VARIANTS = ["plain", "ort", "qdyn", "qdq", "fp16", "slim"]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """Relative RMS error of ``a`` against ``b``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-6))


def _tolerance(variant: str) -> float:
    return {"qdyn": 0.25, "qdq": 0.25, "fp16": 1e-2}.get(variant, 1e-4)


class _Reader:
    """A tiny calibration reader for quantize_static (two seeded batches)."""

    def __init__(self, shape):
        self._it = iter([{"x": np.random.default_rng(i).standard_normal(shape).astype(np.float32)} for i in range(2)])

    def get_next(self):
        return next(self._it, None)


def _make_variant(src: Path, variant: str, out: Path) -> Path | None:
    import onnxruntime as ort

    if variant == "plain":
        return src
    if variant == "ort":
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(out)
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        return out
    if variant == "qdyn":
        from onnxruntime.quantization import quantize_dynamic

        quantize_dynamic(str(src), str(out))
        return out
    if variant == "qdq":
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

        reader = type("R", (_Reader, CalibrationDataReader), {})((1, 3, 32, 32))
        quantize_static(str(src), str(out), reader, quant_format=QuantFormat.QDQ)
        return out
    if variant == "fp16":
        from onnxconverter_common import float16

        onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(out))
        return out
    onnxslim = pytest.importorskip("onnxslim")
    try:
        onnx.save(onnxslim.slim(onnx.load(str(src))), str(out))
    except Exception:  # noqa: BLE001 - onnxslim does not handle every file; the other variants still count
        return None
    return out


def _every_module_output(torch_mod, model, args: tuple, value) -> dict[str, list]:
    """``value(output)`` of every call of every submodule in one forward, by module path (plain hooks)."""
    seen: dict[str, list] = {}
    handles = [m.register_forward_hook(lambda m, a, o, n=n: seen.setdefault(n, []).append(value(o)))
               for n, m in model.named_modules() if n]
    try:
        with torch_mod.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.fixture(scope="module")
def rewritten(resnet18, torch_mod, tmp_path_factory):
    """resnet18 (1x3x32x32) from both exporters, each rewritten by every tool, plus PyTorch's values."""
    x = torch_mod.randn(1, 3, 32, 32, generator=torch_mod.Generator().manual_seed(3))
    seen = _every_module_output(torch_mod, resnet18, (x,), lambda o: o.detach().numpy().copy())
    folder = tmp_path_factory.mktemp("rewritten")
    files: dict[tuple[str, str], Path] = {}
    for exporter in ("dynamo", "torchscript"):
        src = folder / f"{exporter}.onnx"
        torch_mod.onnx.export(resnet18, (x,), str(src), dynamo=exporter == "dynamo", input_names=["x"],
                              output_names=["output"])
        for variant in VARIANTS:
            made = _make_variant(src, variant, folder / f"{exporter}_{variant}.onnx")
            if made is not None:
                files[(exporter, variant)] = made
    return files, x.numpy(), seen


def _right_or_refused(path: Path, x: np.ndarray, refs: dict[str, np.ndarray], variant: str) -> tuple[int, int]:
    """Every module call of ``refs`` resolved on ``path``: its value equals PyTorch's, nearer than any other
    module's, or the call is refused with a one-line reason. Returns (answered, refused)."""
    smap = ScopeMap.from_model(onnx.load(str(path), load_external_data=False))
    answered: dict[str, str] = {}
    refused: dict[str, str] = {}
    for sel in refs:
        try:
            (_, tensor), = smap.resolve(Tap.parse(sel))
        except OnnxFileError as e:
            msg = str(e)
            assert "\n" not in msg and len(msg) > 20, (variant, sel, msg)
            refused[sel] = msg
            continue
        answered[sel] = tensor
    got = lt.run(path, {"x": x}, taps=list(answered)) if answered else {}
    for sel in answered:
        value, ref = got[Tap.parse(sel).name], refs[sel]
        assert value.shape == ref.shape, (variant, sel)
        err = _rel(value, ref)
        assert err <= _tolerance(variant), (variant, sel, err)
        # never another module's value: no other module's reference is closer
        for other, oref in refs.items():
            if oref.shape == ref.shape and _rel(oref, ref) > 1e-6:
                assert err < _rel(value, oref), (variant, sel, "closer to", other)
    return len(answered), len(refused)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_every_module_of_every_rewrite_is_right_or_refused(rewritten, exporter):
    files, x, seen = rewritten
    refs = {f"{p}#{k}": v for p, vals in seen.items() for k, v in enumerate(vals)}
    summary = {variant: _right_or_refused(path, x, refs, variant)
               for (exp, variant), path in files.items() if exp == exporter}
    print("resnet18", exporter, "answered/refused", summary)
    assert summary["plain"][0] > 50 and summary["fp16"][0] > 50, summary
    if exporter == "torchscript":  # TorchScript names survive the rewrites: most modules still answer
        assert summary["ort"][0] > 40 and summary["qdq"][0] > 30 and summary["qdyn"][0] > 30, summary


@pytest.mark.parametrize("variant", ["ort", "slim"])
def test_a_dynamo_file_a_tool_stripped_of_scopes_takes_the_models_own(rewritten, resnet18, torch_mod, tmp_path,
                                                                      variant):
    """ONNX Runtime's optimizer and onnxslim drop the dynamo exporter's scopes; the model exported again lends
    them by tensor name (:mod:`layertap.onnxfile.scopemap.lent`), and every module is again right or refused."""
    from layertap.onnxfile.scopemap.lent import Exported, lend_scopes
    from layertap.pytorch.exporter import dynamo_graph

    def exported_nodes(model, args):
        return Exported.of_model(dynamo_graph(model, args))

    files, x, seen = rewritten
    if ("dynamo", variant) not in files:
        pytest.skip(f"{variant} could not rewrite the dynamo file here")
    refs = {f"{p}#{k}": v for p, vals in seen.items() for k, v in enumerate(vals)}
    stripped = onnx.load(str(files[("dynamo", variant)]))
    assert ScopeMap.from_model(stripped).source == "none"
    # another model's export names few of these tensors: nothing is lent, and the file is left as it was
    other = torch_mod.nn.Sequential(torch_mod.nn.Conv2d(3, 4, 3), torch_mod.nn.ReLU()).eval()
    refused = lend_scopes(stripped, exported_nodes(other, (torch_mod.from_numpy(x),)))
    assert refused.refused is not None and "computing nodes" in refused.note(), refused
    assert ScopeMap.from_model(stripped).source == "none"
    lending = lend_scopes(stripped, exported_nodes(resnet18, (torch_mod.from_numpy(x),)))
    assert lending.refused is None and lending.lent >= 0.9 * lending.computing, lending
    onnx.save(stripped, str(tmp_path / "lent.onnx"))
    answered, refused = _right_or_refused(tmp_path / "lent.onnx", x, refs, variant)
    print(f"resnet18 dynamo {variant}, scopes lent: answered/refused", answered, refused)
    assert answered > 40, (answered, refused)


def test_ort_fused_conv_resolves_to_the_last_module(rewritten):
    files, x, seen = rewritten
    smap = ScopeMap.from_model(onnx.load(str(files[("torchscript", "ort")]), load_external_data=False))
    cps = {(c.path, c.call): c for c in smap.counterparts()}
    for absorbed in ("layer1.0.conv1", "layer1.0.bn1"):
        assert cps[(absorbed, 0)].absorbed_by == "layer1.0.relu" and "FusedConv" in cps[(absorbed, 0)].note
    assert smap.calls("layer1.0.relu") == 2 and "layer1.0.relu_1" not in smap.modules()
    with pytest.raises(OnnxFileError, match=r"layer1\.0\.conv1.*fused into node /layer1/layer1\.0/conv1/Conv"):
        lt.run(files[("torchscript", "ort")], {"x": x}, taps=["layer1.0.conv1"])
    got = lt.run(files[("torchscript", "ort")], {"x": x}, taps=["layer1.0.relu"])
    for k in range(2):
        np.testing.assert_allclose(got[f"layer1.0.relu#{k}"], seen["layer1.0.relu"][k], rtol=1e-3, atol=1e-4)


def test_quantized_calls_by_data_flow_after_dequantize(rewritten):
    files, x, seen = rewritten
    for exporter in ("dynamo", "torchscript"):
        smap = ScopeMap.from_model(onnx.load(str(files[(exporter, "qdq")]), load_external_data=False))
        assert smap.calls("layer2.0.downsample") == 1
        (_, tensor), = smap.resolve(Tap.parse("layer2.0.downsample"))
        assert tensor.endswith("DequantizeLinear_Output")  # the value leaves the module after DequantizeLinear
    smap = ScopeMap.from_model(onnx.load(str(files[("torchscript", "qdyn")]), load_external_data=False))
    assert smap.calls("layer2.0.downsample") == 1
    with pytest.raises(OnnxFileError, match="folded into node"):
        smap.resolve(Tap.parse("layer1.0.conv1"))


# -- handmade graphs: sequences, scalars, generated inputs -------------------------
def _save(tmp_path: Path, name: str, nodes, inputs, outputs, inits=()) -> Path:
    from onnx import helper

    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def seq_file(tmp_path) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    split = numpy_helper.from_array(np.array([2, 3], np.int64), "split")
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["ragged"], axis=0, name="n_ragged"),
             helper.make_node("SplitToSequence", ["x"], ["even"], axis=0, keepdims=0, name="n_even"),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="n_total")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])
    outs = [helper.make_tensor_sequence_value_info("ragged", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [])]
    return _save(tmp_path, "seq", nodes, [x], outs, [split])


def test_sequences_are_lists_their_files_hold_elements_and_scalars_stay_0d(seq_file, tmp_path, cli):
    x = np.arange(5, dtype=np.float32)
    got = lt.run(seq_file, {"x": x}, taps=["even"])
    assert [k for k in got] == ["ragged", "total", "even"]
    assert isinstance(got["ragged"], list) and len(got["ragged"]) == 2 and len(got["even"]) == 5
    np.testing.assert_array_equal(got["ragged"][1], x[2:])
    assert got["total"].shape == () and got["even"][3].shape == ()
    out = tmp_path / "v.npz"
    r = cli("run", str(seq_file), "--input", f"x={_npy(tmp_path, x)}", "--tap", "even", "-o", str(out))
    assert r.returncode == 0, r.stderr
    saved = np.load(out)
    assert saved["total"].shape == () and float(saved["total"]) == 10.0  # 0-d stays 0-d in .npz
    np.testing.assert_array_equal(saved["ragged[0]"], x[:2])
    rows = {row.name: row for row in lt.onnx_layers(seq_file).rows}
    assert rows["ragged"].dtype == "sequence(float32)" and rows["total"].shape == []


def test_empty_sequence_tap_is_named_not_dropped_silently(tmp_path, capsys):
    from onnx import TensorProto, helper

    from layertap.cli.main import main

    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0, keepdims=0, name="split"),
             helper.make_node("SequenceLength", ["parts"], ["n"], name="len")]
    path = _save(tmp_path, "empty_seq", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                 [helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    got = lt.run(path, {"x": np.zeros(0, np.float32)}, taps=["parts"])
    assert list(got) == ["output", "parts"] and int(got["output"]) == 0 and got["parts"] == []
    said = "'parts' is an empty sequence on these inputs: it has no elements (parts[0], parts[1], ...) to show or save"
    out = tmp_path / "v.npz"
    assert main(["run", str(path), "--input", f"x={_npy(tmp_path, np.zeros(0, np.float32))}", "--tap", "parts",
                 "-o", str(out)]) == 0
    assert said in " ".join(capsys.readouterr().err.split())
    assert np.load(out).files == ["output"]
    assert len(lt.run(path, {"x": np.ones(2, np.float32)}, taps=["parts"])["parts"]) == 2


def _npy(tmp_path: Path, arr: np.ndarray) -> str:
    p = tmp_path / "in.npy"
    np.save(p, arr)
    return str(p)


def test_scalar_input_from_the_command_line(tmp_path, cli):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT, name="c"),
             helper.make_node("Mul", ["x", "srf"], ["y"], name="m")]
    path = _save(tmp_path, "scalar", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"]),
                                             helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    out = tmp_path / "y.npz"
    r = cli("run", str(path), "--input", "x=1x4", "--input", "sr=16000:int64", "-o", str(out))
    assert r.returncode == 0, r.stderr
    x = _spec_array("x=1x4")
    np.testing.assert_allclose(np.load(out)["output"], x * 16000, rtol=1e-6)


def _spec_array(text: str) -> np.ndarray:
    from layertap.inputs import InputSpec

    return InputSpec.parse(text).array(np.random.default_rng(0))


def test_generated_inputs_fit_the_model_and_are_named(tmp_path, cli):
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.ones((7, 4), np.float32), "emb.weight")
    nodes = [helper.make_node("Gather", ["emb.weight", "ids"], ["e"], name="g"),
             helper.make_node("ReduceMean", ["img"], ["m"], keepdims=0, name="r")]
    path = _save(tmp_path, "gen", nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                                          helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                 [helper.make_tensor_value_info("e", TensorProto.FLOAT, None),
                  helper.make_tensor_value_info("m", TensorProto.FLOAT, None)], [table])
    notes: list[str] = []
    got = lt.run(path, notify=notes.append)
    assert got["e"].shape == (1, 16, 4) and notes == [
        "generated inputs: ids=1x16 int64 in [0, 7), img=1x3x224x224 float32 (normal); pass them with --input "
        "NAME=SHAPE[:DTYPE] or NAME=FILE.npy (lt.run(..., inputs={NAME: array}))"]
    r = cli("run", str(path))
    assert r.returncode == 0 and "generated inputs: ids=1x16 int64 in [0, 7)" in r.stderr


def test_ort_refusal_on_generated_inputs_is_one_line_without_ort_logs(tmp_path, cli):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], axis=0, name="cat")]
    path = _save(tmp_path, "refuse", nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", "k"]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 5])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    r = cli("run", str(path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr  # ORT's own log lines are silenced; its text is in the error
    assert lines[0].startswith("layertap: error: ONNX Runtime failed to run") and "mismatched dimensions" in lines[0]
    assert "on generated inputs (a=1x512 float32 (normal), b=1x5" in lines[0]
    assert "pass the inputs it needs, e.g. --input a=1x512:float32 --input b=1x5:float32" in lines[0]


def test_repeated_module_taps_count_once(rewritten, cli, tmp_path):
    files, x, seen = rewritten
    path = files[("torchscript", "plain")]
    got = lt.run(path, {"x": x}, taps=["layer1.0", "layer1.0", "layer1.0.relu", "layer1.0.relu#1"])
    assert list(got) == ["output", "layer1.0", "layer1.0.relu#0", "layer1.0.relu#1"]
    np.testing.assert_allclose(got["layer1.0.relu#1"], seen["layer1.0.relu"][1], rtol=1e-3, atol=1e-4)
    out = tmp_path / "a.onnx"
    assert lt.add_outputs(path, out, modules=["layer1.0", "layer1.0"]) == ["layer1.0"]
    r = cli("run", str(path), "--tap", "layer1.0", "--tap", "layer1.0")
    assert r.returncode == 0, r.stderr


def test_file_without_scopes_says_so_and_layers_types_fused_ops(rewritten, cli):
    files, _, _ = rewritten
    path = files[("dynamo", "ort")]  # ORT drops the dynamo metadata: no module scopes left
    r = cli("run", str(path), "--tap", "layer1.0")
    assert r.returncode == 2 and "carries no module scopes" in r.stderr, r.stderr
    rows = lt.onnx_layers(path).rows
    fused = [row for row in rows if row.op == "FusedConv"]
    assert fused and all(row.dtype == "float32" and row.shape for row in rows)


# -- tiny BERT: ORT-fused attention/LayerNorm, quantize_dynamic's MatMulInteger -----
@pytest.fixture(scope="module")
def bert_rewritten(torch_mod, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    cfg = tiny_bert_config()
    torch_mod.manual_seed(0)

    class Wrap(torch_mod.nn.Module):  # the TorchScript exporter needs ids as the only argument
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(cfg)

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    model = Wrap().eval()
    ids = torch_mod.randint(0, 100, (1, 8), generator=torch_mod.Generator().manual_seed(0))

    def first(v):  # a tuple or model-output result: its first tensor (what one ONNX tensor can hold)
        while not isinstance(v, torch_mod.Tensor) and v is not None:
            v = v[0] if isinstance(v, (tuple, list)) and v else (v.to_tuple()[0] if hasattr(v, "to_tuple") else None)
        return None if v is None else v.detach().numpy().copy()

    seen = _every_module_output(torch_mod, model, (ids,), first)
    folder = tmp_path_factory.mktemp("bert_rewritten")
    files: dict[tuple[str, str], Path] = {}
    for exporter in ("dynamo", "torchscript"):
        src = folder / f"{exporter}.onnx"
        torch_mod.onnx.export(model, (ids,), str(src), dynamo=exporter == "dynamo", input_names=["ids"])
        for variant in ("plain", "ort", "qdyn"):
            made = _make_variant(src, variant, folder / f"{exporter}_{variant}.onnx")
            files[(exporter, variant)] = made
    return files, ids.numpy(), seen


@pytest.mark.slow
def test_bert_rewrites_are_right_or_refused(bert_rewritten):
    files, ids, seen = bert_rewritten
    refs = {f"{p}#{k}": v for p, vals in seen.items() for k, v in enumerate(vals) if isinstance(v, np.ndarray)}
    counts = {}
    for (exporter, variant), path in files.items():
        smap = ScopeMap.from_model(onnx.load(str(path), load_external_data=False))
        answered = {}
        for sel in refs:
            try:
                (_, tensor), = smap.resolve(Tap.parse(sel))
            except OnnxFileError as e:
                assert "\n" not in str(e)
                continue
            answered[sel] = tensor
        got = lt.run(path, {"ids": ids}, taps=list(answered)) if answered else {}
        for sel in answered:
            value, ref = got[Tap.parse(sel).name], refs[sel]
            assert value.shape == ref.shape, (exporter, variant, sel)
            err = _rel(value, ref)
            assert err <= _tolerance(variant), (exporter, variant, sel, err)
            for other, oref in refs.items():
                if oref.shape == ref.shape and _rel(oref, ref) > 1e-6:
                    assert err < _rel(value, oref), (exporter, variant, sel, "closer to", other)
        counts[(exporter, variant)] = len(answered)
    print("BERT answered", counts)
    assert counts[("torchscript", "ort")] > 10 and counts[("dynamo", "plain")] > 20, counts


def test_fused_gemm_and_activation_attribute_handmade():
    """FusedGemm under TorchScript names: the activation module keeps the value, fc is absorbed.
    A Conv with an activation attribute under dynamo scopes (no tensor name to tell the last
    module): the modules its output leaves are refused, never answered."""
    from onnx import TensorProto, helper

    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, None)  # noqa: E731
    gemm = helper.make_node("FusedGemm", ["x", "W"], ["/act/Relu_output_0"], name="/fc/Gemm", domain="com.microsoft",
                            activation="Relu")
    head = helper.make_node("Neg", ["/act/Relu_output_0"], ["/head/Neg_output_0"], name="/head/Neg")
    g = helper.make_graph([gemm, head], "g", [vi("x")], [vi("/head/Neg_output_0")],
                          [helper.make_tensor("W", TensorProto.FLOAT, [1], [1.0])])
    smap = ScopeMap.from_model(helper.make_model(g))
    cps = {c.path: c for c in smap.counterparts()}
    assert cps["fc"].absorbed_by == "act" and "FusedGemm with activation Relu" in cps["fc"].note
    assert smap.resolve(Tap.parse("act")) == [("act", "/act/Relu_output_0")]
    with pytest.raises(OnnxFileError, match="input of module 'act' is not in this file"):
        smap.resolve(Tap.parse("act:input"))

    conv = helper.make_node("Conv", ["x", "W"], ["y"], name="c", domain="com.microsoft.nchwc", activation="Relu")
    _ = conv.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'block', 'block.conv', 'conv']")
    tail = helper.make_node("Neg", ["y"], ["z"], name="n")
    _ = tail.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'head', 'neg']")
    g = helper.make_graph([conv, tail], "g", [vi("x")], [vi("z")], [helper.make_tensor("W", TensorProto.FLOAT, [1], [1.0])])
    smap = ScopeMap.from_model(helper.make_model(g))
    for path in ("block", "block.conv"):
        with pytest.raises(OnnxFileError, match="fuses several operations"):
            smap.resolve(Tap.parse(path))
    assert smap.resolve(Tap.parse("head")) == [("head", "z")]
