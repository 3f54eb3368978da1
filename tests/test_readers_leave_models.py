"""Readers never edit what they read: one model (or ``ModelFile``) handed to two readers gives the same
results in either order, and every reader leaves its argument byte-identical (``SerializeToString``
before and after). An edit is a named step: ``..._in_place`` on a model of one's own, or a new model
returned; a caller gives its weights away only by saying so (``ModelFile.hand_over``)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper as h
from onnx import numpy_helper

import layertap as lt
from layertap.onnxfile.modelfile import read_model
from layertap.onnxfile.scopemap import ScopeMap
from layertap.runtimes import open_runtime


def _mlp(path):
    """``y = fc2(relu(fc1(x)))`` under TorchScript-style names (modules fc1, act, fc2), its two 16 KB
    weights inline (a runtime holds them apart: above its threshold)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"fc{k}.weight") for k in (1, 2)]
    nodes = [h.make_node("MatMul", ["x", "fc1.weight"], ["/fc1/MatMul_output_0"], name="/fc1/MatMul"),
             h.make_node("Relu", ["/fc1/MatMul_output_0"], ["/act/Relu_output_0"], name="/act/Relu"),
             h.make_node("MatMul", ["/act/Relu_output_0", "fc2.weight"], ["y"], name="/fc2/MatMul")]
    vi = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 64]) for n in ("x", "y")]
    onnx.save(h.make_model(h.make_graph(nodes, "mlp", vi[:1], vi[1:], weights), opset_imports=[h.make_opsetid("", 17)]),
              str(path))
    return path


@pytest.fixture
def mlp(tmp_path):
    return _mlp(tmp_path / "a.onnx"), _mlp(tmp_path / "b.onnx")


def _x():
    return np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)


def _compared(mf_ref, mf_cand):
    report = lt.compare(mf_ref, {"x": _x()}, mf_cand)
    return [(r.name, r.status, r.onnx, r.max_abs) for r in report.rows]


def _layers(mf):
    return [(r.name, r.op, r.module, r.call, r.dtype, r.shape) for r in lt.onnx_layers(mf).rows]


def _scopes(mf):
    return ScopeMap.from_model(mf.model).counterparts()


def _side(mf):
    from layertap.comparing.onnx_side import OrtSide

    side = OrtSide(mf, open_runtime("ort"))
    return side.run(["/act/Relu_output_0"], {"x": _x()})["/act/Relu_output_0"].tolist(), sorted(side.carried)


def _tapped(mf):
    from layertap.runtimes.runner import TappedSession

    session = TappedSession(mf, open_runtime("ort"), ["act", "fc1"])
    return {k: v.tolist() for k, v in session.run({"x": _x()}).items()}


READERS = {"layers": _layers, "scopes": _scopes, "side": _side, "tapped": _tapped}


@pytest.mark.parametrize("first,second", list(itertools.permutations(READERS, 2)))
def test_two_readers_of_one_file_agree_in_either_order_and_leave_it_as_it_was(mlp, first, second):
    mf = read_model(mlp[0])
    before = mf.model.SerializeToString()
    got = {first: READERS[first](mf)}
    got[second] = READERS[second](mf)
    assert mf.model.SerializeToString() == before
    alone = read_model(mlp[0])
    assert got[second] == READERS[second](alone)  # what it gives after the other reader is what it gives alone


def test_compare_leaves_both_files_it_was_given_as_they_were(mlp):
    ref, cand = read_model(mlp[0]), read_model(mlp[1])
    before = [ref.model.SerializeToString(), cand.model.SerializeToString()]
    first = _compared(ref, cand)
    assert [ref.model.SerializeToString(), cand.model.SerializeToString()] == before
    assert _compared(ref, cand) == first  # and the same files compare the same again
    assert _layers(cand) == _layers(read_model(mlp[1]))


def test_a_file_handed_over_gives_its_weights_away_and_the_same_comparison(mlp):
    ref, cand = read_model(mlp[0]), read_model(mlp[1])
    kept = _compared(ref, cand)
    handed = [read_model(p).hand_over() for p in mlp]
    assert _compared(*handed) == kept
    for mf in handed:  # the graph alone stays with its reader: its weights are held once, by the runtime
        assert not mf.handed_over and mf.model.graph.initializer
        assert not any(t.HasField("raw_data") for t in mf.model.graph.initializer)
        assert _layers(mf) == _layers(read_model(mlp[0]))


def test_scope_map_of_a_fused_decoder_reads_a_copy(llama_genai_fp32):
    """A fused decoder's q/k/v projections are slices its graph does not hold: the map reads a copy
    that makes them tensors; the model, read twice, stays the file's."""
    mf = read_model(llama_genai_fp32)
    before = mf.model.SerializeToString()
    first = ScopeMap.from_model(mf.model).counterparts()
    assert mf.model.SerializeToString() == before
    assert ScopeMap.from_model(mf.model).counterparts() == first
    assert "model.layers.0.self_attn.q_proj" in {c.path for c in first}
    assert _layers(mf) == _layers(read_model(llama_genai_fp32))
    assert mf.model.SerializeToString() == before


def test_weights_held_apart_and_sessions_leave_the_model_as_it_was(mlp):
    from layertap.runtimes.ort import ort_typer, source_session
    from layertap.runtimes.source import SessionSource

    model = read_model(mlp[0]).model
    before = model.SerializeToString()
    source = SessionSource.with_weights_held(model, mlp[0].parent)
    assert model.SerializeToString() == before and sorted(source.held) == ["fc1.weight", "fc2.weight"]
    graph = source.model.SerializeToString()
    session = source_session(source, ["/act/Relu_output_0"], only=True)
    assert [o.name for o in session.get_outputs()] == ["/act/Relu_output_0"]
    assert ort_typer(source.held)(source.model, source.folder, ["/act/Relu_output_0"])
    assert source.model.SerializeToString() == graph


def test_a_side_carries_branch_tensors_out_of_its_own_copy(tmp_path):
    from layertap.comparing.onnx_side import OrtSide
    from test_branches import cnn_in_if

    path = tmp_path / "cnn_if.onnx"
    cnn_in_if(path)
    mf = read_model(path)
    before = mf.model.SerializeToString()
    first, second = (OrtSide(mf, open_runtime("ort")) for _ in range(2))
    assert first.carried and first.carried == second.carried
    assert list(first.proto.graph.node[0].output) == list(second.proto.graph.node[0].output)
    assert mf.model.SerializeToString() == before and list(mf.model.graph.node[0].output) == ["logits"]
