"""Cost of taps in an export: resnet50 with 5 block-level taps vs untapped.

Measures, side by side in one process (medians):

* ONNX Runtime CPU latency of the tapped file / the untapped file
  (goal <= 1.10x; both exported by plain ``torch.onnx.export`` vs ``lt.export``
  with the same exporter),
* export time of ``lt.export(..., verify=False)`` with the 5 taps / plain
  ``torch.onnx.export`` of the same model with the same dynamic batch
  (``Dim.DYNAMIC`` for dynamo, a ``dynamic_axes`` batch for TorchScript);
  goal <= 1.15x (verification excluded).

Run:
    .venv/bin/python benchmarks/bench_export.py [--exporter dynamo|torchscript] [--repeats N] [--no-latency]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch
import torchvision

import layertap as lt

TAPS = ["layer1", "layer2", "layer3", "layer4", "avgpool"]


def plain_export(model, x, path, exporter: str) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(model, (x,), path, dynamo=True, verbose=False, input_names=["x"],
                              dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})


def latency(path: str, x: np.ndarray, repeats: int, threads: int) -> list[float]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for _ in range(3):
        sess.run(names, {"x": x})
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(names, {"x": x})
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    ap.add_argument("--repeats", type=int, default=20, help="ORT runs per file per round")
    ap.add_argument("--exports", type=int, default=3, help="exports per variant (median)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--no-latency", action="store_true", help="only the export-time row")
    args = ap.parse_args()
    threads = max(1, min(4, os.cpu_count() or 1))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    work = tempfile.mkdtemp(prefix="bench_export.")
    plain_path = os.path.join(work, "plain.onnx")
    tapped_path = os.path.join(work, "tapped.onnx")

    t_plain, t_tapped = [], []
    for _ in range(args.exports):  # alternate, so drift hits both alike
        t = time.perf_counter()
        plain_export(model, x, plain_path, args.exporter)
        t_plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        lt.export(model, x, tapped_path, taps=TAPS, exporter=args.exporter, verify=False)
        t_tapped.append(time.perf_counter() - t)

    ep, et = statistics.median(t_plain), statistics.median(t_tapped)
    print(f"resnet50, batch {args.batch}x3x{args.size}x{args.size}, {args.exporter} exporter, "
          f"{threads} threads, taps: {', '.join(TAPS)}")
    print(f"export time   plain    {ep:8.2f} s    lt.export {et:8.2f} s    ratio {et / ep:.3f}x  (goal <= 1.15x, "
          f"same dynamic batch, verify off; {args.exports} exports each, median)")
    if args.no_latency:
        return
    report = lt.export(model, x[:2], os.path.join(work, "verified.onnx"), taps=TAPS, exporter=args.exporter)
    xn = x.numpy()
    lat_plain, lat_tapped = [], []
    for _ in range(3):  # interleaved rounds
        lat_plain += latency(plain_path, xn, args.repeats, threads)
        lat_tapped += latency(tapped_path, xn, args.repeats, threads)

    mp, mt = statistics.median(lat_plain), statistics.median(lat_tapped)
    print(f"verification of the tapped export: {'all passed' if report.ok else 'FAILED'}; "
          f"worst max abs err {max(r.max_abs for r in report.rows):.3g}")
    print(f"ORT latency   untapped {mp * 1e3:8.1f} ms   tapped {mt * 1e3:8.1f} ms   ratio {mt / mp:.3f}x  (goal <= 1.10x)")


if __name__ == "__main__":
    main()
