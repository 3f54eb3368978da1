"""A command whose stdout reader goes away (``layertap ... | head``) ends quietly, as ``git log | head`` does."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from onnx import TensorProto, helper, save

# exit status of a quiet end on a closed pipe: 128 + SIGPIPE
CLOSED = 141


@pytest.fixture(scope="module")
def long_onnx(tmp_path_factory) -> Path:
    """3000 Relus in a row: its layers table (~200 kB) outgrows any pipe's buffer."""
    nodes, prev = [], "x"
    for i in range(3000):
        nodes.append(helper.make_node("Relu", [prev], [f"t{i}"], name=f"relu{i}"))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 8])])
    path = tmp_path_factory.mktemp("pipes") / "long.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def piped(argv: list[str], reader: str) -> subprocess.CompletedProcess:
    """``layertap ARGV | READER`` in a shell; returncode is layertap's own status."""
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "layertap", *argv])
    return subprocess.run(["bash", "-c", f"{command} | {reader}; exit ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("json", [False, True], ids=["table", "json"])
def test_layers_piped_to_head_ends_quietly(long_onnx, json):
    r = piped(["layers", str(long_onnx), *(["--json"] if json else [])], "head -1")
    assert r.stderr == ""
    assert r.returncode in (0, CLOSED), r.returncode
    assert r.stdout.strip() == ("{" if json else "ONNX tensors")


@pytest.mark.parametrize("json", [False, True], ids=["table", "json"])
def test_reader_gone_before_any_output(long_onnx, json):
    # `true` exits at once, so every write layertap makes meets a closed pipe
    r = piped(["layers", str(long_onnx), *(["--json"] if json else [])], "true")
    assert (r.returncode, r.stderr) == (CLOSED, "")


def test_model_printing_to_closed_pipe_is_not_its_error(tmp_path):
    """A forward that prints (and flushes) to a closed stdout: a quiet end, not 'the model failed'."""
    path = tmp_path / "chatty.py"
    path.write_text(textwrap.dedent("""
        from torch import nn

        class Chatty(nn.Linear):
            def forward(self, x):
                print("hello from forward", flush=True)
                return super().forward(x)

        def make():
            return Chatty(4, 2)
        """))
    r = piped(["layers", f"{path}:make", "--input", "2x4"], "true")
    assert (r.returncode, r.stderr) == (CLOSED, "")
