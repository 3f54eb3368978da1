"""Hostile and broken inputs across every command.

Each case must end in exit 2 with exactly one line ``layertap: error: ...``
on stderr that names the problem, no traceback, no output file left behind,
and every input file byte-identical afterwards. The corpus is generated here.
"""

from __future__ import annotations

import hashlib
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from layertap.cli.main import main

TINY_PY = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            self.pair = Pair()

        def forward(self, x):
            return self.pair(self.body(x))[0]

    class Pair(nn.Module):
        def forward(self, x):
            return x, None

    def make():
        torch.manual_seed(0)
        return Tiny()
    """
)


def _graph_model(tmp: Path, *, external: str | None = None, n_outputs: int = 1, dup_outputs: bool = False, nodes: bool = True) -> Path:
    w = numpy_helper.from_array(np.ones((3, 3), np.float32), "W")
    node_list = [helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"), helper.make_node("Relu", ["H"], ["Y"], name="relu")] if nodes else []
    outs = [helper.make_tensor_value_info("Y" if nodes else "X", TensorProto.FLOAT, [2, 3])][:n_outputs]
    if dup_outputs:
        outs = outs + outs
    g = helper.make_graph(node_list, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])], outs, initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp / "model.onnx"
    if external is not None:
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
        # Point the reference somewhere hostile after a normal save.
        loaded = onnx.load(str(path), load_external_data=False)
        for init in loaded.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = external
        path.write_bytes(loaded.SerializeToString())
    else:
        onnx.save(m, str(path))
    return path


@dataclass
class Case:
    name: str
    argv: list[str]
    expect: str  # a fragment the error line must contain (case-insensitive)
    output: str | None = None  # output file that must not exist afterwards


def _corpus(tmp: Path) -> list[Case]:
    (tmp / "tiny.py").write_text(TINY_PY)
    tiny = f"{tmp / 'tiny.py'}:make"
    good = _graph_model(tmp)
    bad_dir = tmp / "bad"
    bad_dir.mkdir()
    not_onnx = bad_dir / "text.onnx"
    not_onnx.write_text("this is not a protobuf\n" * 10)
    data = good.read_bytes()
    truncated = bad_dir / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    flipped = bad_dir / "flipped.onnx"
    raw = bytearray(data)
    for i in range(0, len(raw), 7):
        raw[i] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    empty = bad_dir / "empty.onnx"
    empty.write_bytes(b"")

    cases_dirs = {}
    for key, loc in {"escape": "../outside.bin", "absolute": "/etc/passwd", "missing": "nothere.bin", "link": "link.bin"}.items():
        d = tmp / f"ext_{key}"
        d.mkdir()
        cases_dirs[key] = _graph_model(d, external=loc)
    (tmp / "outside.bin").write_bytes(np.ones((3, 3), np.float32).tobytes())
    os.symlink(tmp / "outside.bin", tmp / "ext_link" / "link.bin")

    nodes_dir = tmp / "no_nodes"
    nodes_dir.mkdir()
    no_nodes = _graph_model(nodes_dir, nodes=False)
    no_out_dir = tmp / "no_out"
    no_out_dir.mkdir()
    no_outputs = _graph_model(no_out_dir, n_outputs=0)
    dup_dir = tmp / "dup"
    dup_dir.mkdir()
    dup_outputs = _graph_model(dup_dir, dup_outputs=True)

    pickled = tmp / "whole.pt"
    import torch

    torch.save(torch.nn.Linear(2, 2), pickled)
    mismatch = tmp / "mismatch.pt"
    torch.save({"body.0.weight": torch.zeros(8, 4), "bogus.weight": torch.zeros(1)}, mismatch)
    npy_bad = tmp / "bad.npy"
    npy_bad.write_bytes(b"\x93NUMPY garbage")

    out = str(tmp / "out.onnx")
    npz = str(tmp / "acts.npz")
    missing_dir_out = str(tmp / "no" / "such" / "dir" / "out.onnx")
    return [
        Case("not onnx (layers)", ["layers", str(not_onnx)], "onnx"),
        Case("truncated protobuf (layers)", ["layers", str(truncated)], "onnx"),
        Case("bit-flipped protobuf (add-outputs)", ["add-outputs", str(flipped), "-o", out, "--tensor", "H"], "onnx", out),
        Case("empty file (run)", ["run", str(empty)], "onnx"),
        Case("external data escapes with ..", ["add-outputs", str(cases_dirs["escape"]), "-o", str(tmp / "o1.onnx"), "--tensor", "H"], "outside", str(tmp / "o1.onnx")),
        Case("external data absolute path", ["run", str(cases_dirs["absolute"])], "outside"),
        Case("external data symlink out", ["run", str(cases_dirs["link"])], "outside"),
        Case("external data missing", ["run", str(cases_dirs["missing"])], "nothere.bin"),
        Case("unknown tensor", ["add-outputs", str(good), "-o", out, "--tensor", "HH"], "did you mean", out),
        Case("unknown module", ["add-outputs", str(good), "-o", out, "--module", "layer1"], "layer1", out),
        Case("output equals input", ["add-outputs", str(good), "-o", str(good), "--tensor", "H"], "input"),
        Case("missing output folder (add-outputs)", ["add-outputs", str(good), "-o", missing_dir_out, "--tensor", "H"], "does not exist", missing_dir_out),
        Case("output folder is a file", ["add-outputs", str(good), "-o", str(good) + "/x.onnx", "--tensor", "H"], "is a file"),
        Case("unwritable output folder", ["add-outputs", str(good), "-o", "/proc/layertap-out.onnx", "--tensor", "H"], "cannot write in output folder"),
        Case("run wrong input shape", ["run", str(good), "--input", "X=4x5"], "x"),
        Case("run wrong input dtype", ["run", str(good), "--input", "X=2x3:int64"], "int64"),
        Case("run unknown input name", ["run", str(good), "--input", "Z=2x3"], "z"),
        Case("run malformed --input", ["run", str(good), "--input", "2xx3"], "--input"),
        Case("run unknown tap", ["run", str(good), "--tap", "Yy"], "yy"),
        Case("model with no nodes and a selector", ["add-outputs", str(no_nodes), "-o", out, "--module", "fc"], "fc", out),
        Case("model with no outputs", ["run", str(no_outputs)], "no graph outputs"),
        Case("duplicate output names", ["run", str(dup_outputs)], "duplicate"),
        Case("unknown zoo name", ["layers", "torchvision:resnet1800"], "resnet18"),
        Case("unimportable module spec", ["layers", "no_such_pkg_xyz.models:Net"], "no_such_pkg_xyz"),
        Case("missing attribute in file spec", ["layers", f"{tmp / 'tiny.py'}:nope"], "nope"),
        Case("spec file does not exist", ["layers", f"{tmp / 'nofile.py'}:make"], "nofile.py"),
        Case("malformed selector", ["extract", tiny, "--tap", "body.0#x", "--input", "2x4", "-o", npz], "body.0#x", npz),
        Case("unknown module path", ["extract", tiny, "--tap", "body.9", "--input", "2x4", "-o", npz], "did you mean", npz),
        Case("call index out of range", ["extract", tiny, "--tap", "body.0#3", "--input", "2x4", "-o", npz], "ran 1 time", npz),
        Case("non-tensor value without index", ["extract", tiny, "--tap", "pair", "--input", "2x4", "-o", npz], "tuple(Tensor[2,2], None)", npz),
        Case("unparsable --input", ["extract", tiny, "--tap", "body.0", "--input", "2x4:complex", "-o", npz], "complex", npz),
        Case("wrong input shape for the model", ["extract", tiny, "--tap", "body.0", "--input", "2x5", "-o", npz], "", npz),
        Case("unreadable .npy input", ["extract", tiny, "--tap", "body.0", "--input", str(npy_bad), "-o", npz], "bad.npy", npz),
        Case("missing output folder (extract)", ["extract", tiny, "--tap", "body.0", "--input", "2x4", "-o", str(tmp / "nope" / "a.npz")], "does not exist"),
        Case("wrong output suffix", ["extract", tiny, "--tap", "body.0", "--input", "2x4", "-o", str(tmp / "a.txt")], ".npz", str(tmp / "a.txt")),
        Case("pickled module as weights", ["layers", tiny, "--weights", str(pickled)], "unsafe", None),
        Case("state dict mismatch", ["layers", tiny, "--weights", str(mismatch)], "bogus.weight", None),
        Case("weights file missing", ["layers", tiny, "--weights", str(tmp / "none.pt")], "none.pt", None),
        Case("export to missing folder", ["export", tiny, "--input", "2x4", "-o", missing_dir_out], "does not exist", missing_dir_out),
        Case("export unknown tap", ["export", tiny, "--input", "2x4", "--tap", "bodyy", "-o", out], "body", out),
        Case("compare with a non-onnx file", ["compare", tiny, str(not_onnx), "--input", "2x4"], "onnx"),
        Case("unknown subcommand", ["frobnicate"], "frobnicate"),
    ]


def _hash_tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    return tmp, _corpus(tmp)


def test_corpus_is_large_enough(corpus):
    assert len(corpus[1]) >= 30


@pytest.mark.parametrize("index", range(42))
def test_hostile_input(index, corpus, capsys):
    tmp, cases = corpus
    if index >= len(cases):
        pytest.skip("corpus shorter than the parametrisation")
    case = cases[index]
    before = _hash_tree(tmp)
    code = main(case.argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, f"{case.name}: exit {code}, stderr={captured.err!r}"
    assert len(lines) == 1, f"{case.name}: expected one line, got {captured.err!r}"
    assert lines[0].startswith("layertap: error: "), lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert case.expect.lower() in lines[0].lower(), f"{case.name}: {lines[0]!r} lacks {case.expect!r}"
    if case.output:
        assert not Path(case.output).exists(), f"{case.name}: left {case.output}"
    leftovers = [p.name for p in tmp.rglob(".*.tmp")]
    assert not leftovers, f"{case.name}: temporary files left: {leftovers}"
    after = _hash_tree(tmp)
    assert {k: v for k, v in after.items() if k in before} == before, f"{case.name}: an input changed"
