"""Benchmark ``lt.compare`` on resnet50 (random weights).

Measures, each in a fresh process so that peak memory (``ru_maxrss``) is
the work's own:

* baseline: one PyTorch forward plus one ONNX Runtime run of the untapped
  file (session already built; best of ``--repeat``), and
* compare: ``lt.compare(model, x, file)`` end to end, as a user calls it
  (graph load, scope mapping, PyTorch run with every module hooked, ORT
  session(s) with every counterpart exposed, statistics); best of ``--repeat``.

Goal: compare <= 4x the baseline.

Run:
    .venv/bin/python benchmarks/bench_compare.py [--batch 1] [--size 224] [--repeat 3] [--budget-mb N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _model(seed: int = 0):
    import torch
    import torchvision

    torch.manual_seed(seed)
    return torchvision.models.resnet50(weights=None).eval()


def _input(batch: int, size: int):
    import torch

    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_baseline(path: str, batch: int, size: int, repeat: int) -> dict:
    import onnxruntime as ort
    import torch

    model, x = _model(), _input(batch, size)
    rss_loaded = _rss_mb()
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    t_session = time.perf_counter() - t0
    feed = {sess.get_inputs()[0].name: x.numpy()}
    best_pt = best_ort = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            model(x)
        best_pt = min(best_pt, time.perf_counter() - t0)
        t0 = time.perf_counter()
        sess.run(None, feed)
        best_ort = min(best_ort, time.perf_counter() - t0)
    return {"torch_s": best_pt, "ort_s": best_ort, "ort_session_s": t_session,
            "rss_loaded_mb": rss_loaded, "peak_rss_mb": _rss_mb()}


def child_compare(path: str, batch: int, size: int, repeat: int, budget_mb: int | None = None) -> dict:
    import layertap as lt

    model, x = _model(), _input(batch, size)
    rss_loaded = _rss_mb()
    times = []
    report = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        opts = {"memory_budget": budget_mb << 20} if budget_mb else {}
        report = lt.compare(model, x, path, **opts)
        times.append(time.perf_counter() - t0)
    c = report.counts()
    return {"compare_s": min(times), "compare_first_s": times[0], "ok": report.ok, "rows": len(report.rows),
            "counts": c, "ort_runs": report.ort_runs, "rss_loaded_mb": rss_loaded, "peak_rss_mb": _rss_mb()}


def _run_child(mode: str, path: Path, ns: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--onnx", str(path),
           "--batch", str(ns.batch), "--size", str(ns.size), "--repeat", str(ns.repeat)]
    if ns.budget_mb:
        cmd += ["--budget-mb", str(ns.budget_mb)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget-mb", type=int, default=None, help="lt.compare memory_budget in MiB (default: its 1 GiB)")
    p.add_argument("--child", choices=("baseline", "compare"))
    p.add_argument("--onnx")
    ns = p.parse_args()
    if ns.child:
        if ns.child == "baseline":
            result = child_baseline(ns.onnx, ns.batch, ns.size, ns.repeat)
        else:
            result = child_compare(ns.onnx, ns.batch, ns.size, ns.repeat, ns.budget_mb)
        print(json.dumps(result))
        return

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as d:
        path = Path(d) / "resnet50.onnx"
        t0 = time.perf_counter()
        torch.onnx.export(_model(), (_input(ns.batch, ns.size),), str(path), dynamo=True, input_names=["x"])
        print(f"export (not timed below): {time.perf_counter() - t0:.1f} s")
        base = _run_child("baseline", path, ns)
        cmp_ = _run_child("compare", path, ns)
    one = base["torch_s"] + base["ort_s"]
    budget = f", memory_budget {ns.budget_mb} MiB" if ns.budget_mb else ""
    print(f"resnet50, input {ns.batch}x3x{ns.size}x{ns.size}, {os.cpu_count()} CPU(s), best of {ns.repeat}{budget}")
    print(f"  PyTorch forward           {base['torch_s'] * 1e3:8.1f} ms")
    print(f"  ORT run (untapped)        {base['ort_s'] * 1e3:8.1f} ms   (session build {base['ort_session_s'] * 1e3:.0f} ms, not counted)")
    print(f"  baseline (sum)            {one * 1e3:8.1f} ms")
    print(f"  lt.compare                {cmp_['compare_s'] * 1e3:8.1f} ms   (first call {cmp_['compare_first_s'] * 1e3:.0f} ms)"
          f" -> {cmp_['compare_s'] / one:.2f}x baseline (goal <= 4x)")
    print(f"  rows {cmp_['rows']} {cmp_['counts']}, ORT runs {cmp_['ort_runs']}, ok={cmp_['ok']}")
    print(f"  peak RSS: baseline {base['peak_rss_mb']:.0f} MB (model+inputs loaded {base['rss_loaded_mb']:.0f} MB), "
          f"compare {cmp_['peak_rss_mb']:.0f} MB (model+inputs loaded {cmp_['rss_loaded_mb']:.0f} MB)")


if __name__ == "__main__":
    main()
