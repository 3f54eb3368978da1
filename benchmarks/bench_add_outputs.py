"""Benchmark: ``lt.add_outputs`` vs ``onnx.utils.extract_model`` on ~3 GB of external weights.

The weights live in a sparse file (``truncate``), so the benchmark needs little
disk; ``--dense`` writes them out (zeros in real blocks, as a converter writes a
file), which a copy must read and write. Each contender runs in its own subprocess;
peak RSS is that process's ``VmHWM`` (``ru_maxrss`` would report the parent's peak,
carried over ``exec``). Rows:

* ``add_outputs`` with ``DST`` beside ``SRC`` (the output shares the data file);
* ``add_outputs`` with ``DST`` in another folder (ONNX Runtime refuses data paths that leave
  a model's folder, so the data is copied there), beside its yardstick, a plain copy of
  the data in another process (``shutil.copyfile``, as ``cp`` without reflinks or holes);
* ``onnx.utils.extract_model``, the rival.

Run::

    .venv/bin/python benchmarks/bench_add_outputs.py [--gb 3] [--dir /tmp] [--keep] [--dense]

Goal: add_outputs <= 10 s and <= 400 MB for 3 GB of weights; into another folder, at most
the time of the plain copy (a clone or the data ranges alone where the file system can).
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
import json, resource, sys, time
kind, src, dst = sys.argv[1:4]
t = time.perf_counter()
err = None
try:
    if kind == "layertap":
        import layertap as lt
        lt.add_outputs(src, dst, tensors=["h0", "h1"])
    elif kind == "copy":
        import shutil
        shutil.copyfile(src + ".data", dst)
    else:
        import onnx.utils
        onnx.utils.extract_model(src, dst, ["x"], ["y", "h0", "h1"])
except Exception as e:
    err = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
wall = time.perf_counter() - t
# VmHWM: ru_maxrss would carry the parent's peak over exec
hwm = next((int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")), None)
print(json.dumps({"wall_s": wall, "peak_mb": hwm or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "error": err}))
"""


def build(folder: Path, gb: float, dense: bool = False) -> Path:
    """A MatMul chain whose weights (n_layers x dim x dim float32) sit in one sparse file (``dense``: zeros
    written out, every block allocated)."""
    from onnx import TensorProto, helper

    dim, n = 16384, max(1, round(gb * 2**30 / (16384 * 16384 * 4)))
    nbytes = dim * dim * 4
    data = folder / "big.onnx.data"
    with open(data, "wb") as f:
        if dense:
            zeros = bytes(1 << 24)
            for _ in range(nbytes * n // len(zeros)):
                f.write(zeros)
        f.truncate(nbytes * n)  # sparse: no blocks written (dense: the size it has)
    inits, nodes, prev = [], [], "x"
    for i in range(n):
        w = TensorProto(name=f"W{i}", data_type=TensorProto.FLOAT, dims=[dim, dim])
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", data.name), ("offset", str(i * nbytes)), ("length", str(nbytes))):
            w.external_data.add(key=k, value=v)
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}" if i < n - 1 else "y"], name=f"relu{i}"))
        prev = f"h{i}"
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "big.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def measure(kind: str, src: Path, dst: Path, timeout: int) -> dict:
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, kind, str(src), str(dst)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"wall_s": float(timeout), "peak_mb": None, "error": f"timed out after {timeout} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"wall_s": None, "peak_mb": None, "error": f"exit {r.returncode}: {r.stderr.strip()[-200:]}"}
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=3.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--dense", action="store_true", help="write the weights' blocks (zeros) instead of a sparse file")
    ns = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lt-bench-", dir=ns.dir))
    try:
        src = build(folder, ns.gb, ns.dense)
        size = (folder / "big.onnx.data").stat().st_size / 2**30
        print(f"model: {src} with {size:.2f} GiB of external weights ({'dense' if ns.dense else 'sparse'} file)")
        elsewhere = folder / "elsewhere"
        elsewhere.mkdir()
        lt = measure("layertap", src, folder / "lt.onnx", ns.timeout)
        moved = measure("layertap", src, elsewhere / "lt.onnx", ns.timeout)
        copy = measure("copy", src, elsewhere / "copy.data", ns.timeout)
        for p in elsewhere.iterdir():  # the disk space back before the rival runs
            p.unlink()
        ox = measure("onnx", src, folder / "extract.onnx", ns.timeout)
        print(f"{'tool':<46}{'wall s':>10}{'peak RSS MB':>14}  error")
        for name, r in (("layertap add_outputs (DST beside SRC)", lt), ("layertap add_outputs (DST in another folder)", moved),
                        ("plain copy of the data (shutil.copyfile)", copy), ("onnx.utils.extract_model", ox)):
            wall = f"{r['wall_s']:.2f}" if r["wall_s"] is not None else "-"
            peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "-"
            print(f"{name:<46}{wall:>10}{peak:>14}  {r['error'] or ''}")
        if moved["wall_s"] and copy["wall_s"]:
            print(f"add_outputs into another folder / plain copy of the data: {moved['wall_s'] / copy['wall_s']:.2f}x "
                  "(goal <= 1x)")
        if lt["wall_s"] and ox["wall_s"] and lt["peak_mb"] and ox["peak_mb"]:
            print(f"ratio (extract_model / add_outputs): time {ox['wall_s'] / lt['wall_s']:.1f}x, "
                  f"memory {ox['peak_mb'] / lt['peak_mb']:.1f}x")
        ok = all(r["error"] is None and r["wall_s"] <= 10 and r["peak_mb"] <= 400 for r in (lt, moved))
        print("goal (<= 10 s, <= 400 MB):", "met" if ok else "NOT met")
        return 0 if ok else 1
    finally:
        if not ns.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
