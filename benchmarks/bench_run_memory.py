"""Peak memory of ``lt.run`` on a model whose weights (~400 MB) are inline in the .onnx file.

Side by side, each in its own subprocess (peak RSS is that process's
``VmHWM``): ``lt.run`` with one intermediate tap, and plain ONNX Runtime
loading the file by path and running it (no tap; the floor). Inline weights
are the hard case: the graph cannot be read without them, so every copy
(protobuf message, serialised bytes, ONNX Runtime's own) costs their size.

Goal: ``lt.run`` peak RSS <= 2.5x the weights (ORT alone needs about 1x-2x).

Run::

    .venv/bin/python benchmarks/bench_run_memory.py [--mb 400] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
kind, src = sys.argv[1:3]
x = {"x": np.ones((1, int(sys.argv[3])), np.float32)}
t = time.perf_counter()
if kind == "layertap":
    import layertap as lt
    out = lt.run(src, x, taps=["h0"])
    assert set(out) == {"output", "h0"}
else:
    import onnxruntime as ort
    so = ort.SessionOptions(); so.log_severity_level = 3
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, x)
wall = time.perf_counter() - t
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec
hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
print(json.dumps({"wall_s": wall, "peak_mb": hwm / 1024}))
"""


def build(folder: Path, mb: float) -> tuple[Path, int]:
    """A MatMul -> Relu chain of 4 layers with random float32 weights inline in the file."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    n = 4
    dim = int((mb * 2**20 / n / 4) ** 0.5)
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array((rng.standard_normal((dim, dim), np.float32) / dim).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}" if i < n - 1 else "y"], name=f"relu{i}"))
        prev = f"h{i}"
    g = helper.make_graph(nodes, "inline", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])], inits)
    path = folder / "inline.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path, dim


def measure(kind: str, src: Path, dim: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, kind, str(src), str(dim)], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"{kind} failed: {r.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=400)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ns = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lt-bench-run-", dir=ns.dir))
    try:
        src, dim = build(folder, ns.mb)
        size = src.stat().st_size / 2**20
        print(f"model: {src} ({size:.0f} MB, weights inline)")
        lt = measure("layertap", src, dim)
        plain = measure("ort", src, dim)
        print(f"{'run':<34}{'wall s':>8}{'peak RSS MB':>14}{'x weights':>11}")
        for name, r in (("lt.run, 1 tap", lt), ("onnxruntime by path, no tap", plain)):
            print(f"{name:<34}{r['wall_s']:>8.2f}{r['peak_mb']:>14.0f}{r['peak_mb'] / size:>11.2f}")
        ok = lt["peak_mb"] <= 2.5 * size
        print(f"lt.run / plain ORT peak RSS: {lt['peak_mb'] / plain['peak_mb']:.2f}x;", "goal (<= 2.5x the weights):",
              "met" if ok else "NOT met")
        return 0 if ok else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
