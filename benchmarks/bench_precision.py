"""Benchmark what judging at the candidate's precision adds to ``lt.compare``: resnet50 (random weights)
float32 against its float16 conversion (onnxconverter-common, ``keep_io_types=True``), layer by layer.

Side by side in one process, interleaved round by round (so the machine's drift hits both alike):

* today's compare: ``lt.compare(ref, x, fp16_file, precision="fp32")``: the fixed rule, no ideal run;
* judged at float16: ``lt.compare(ref, x, fp16_file)``: the same, plus the ideal float16 run (the
  reference's graph with a rounding after each float16 tensor, run in ONNX Runtime with optimisations
  off; for a PyTorch reference, its forward again with every operator rounded) and the two errors per row.

for an ONNX reference (the float32 file) and for a PyTorch reference (the model), over ``--samples``
samples; medians of ``--repeat`` rounds, and the ratio judged/today per round (its median). Goal: at most
1.3x for the float16 resnet50 pair (the ONNX reference).

Run:
    .venv/bin/python benchmarks/bench_precision.py [--size 224] [--samples 1] [--repeat 5] [--reference onnx|torch|both]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path


def _files(folder: Path, size: int):
    import onnx
    import torch
    import torchvision
    from onnxconverter_common import float16

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    fp32, fp16 = folder / "r50.onnx", folder / "r50-fp16.onnx"
    torch.onnx.export(model, (x,), str(fp32), dynamo=False, input_names=["x"], opset_version=17)
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True, max_finite_val=65504.0), str(fp16))
    return model, x, fp32, fp16


def _time(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference", choices=("onnx", "torch", "both"), default="both")
    a = parser.parse_args()
    import numpy as np

    import layertap as lt

    with tempfile.TemporaryDirectory() as tmp:
        model, x, fp32, fp16 = _files(Path(tmp), a.size)
        feeds = [{"x": np.random.default_rng(i).standard_normal((1, 3, a.size, a.size)).astype(np.float32)}
                 for i in range(a.samples)]
        tensors = [x] + [x * (1 + 0.1 * i) for i in range(1, a.samples)]
        cases = {
            "onnx": (lambda **k: lt.compare(fp32, None, fp16, samples=feeds, **k)),
            "torch": (lambda **k: lt.compare(model, tensors[0], fp16, samples=tensors, **k)),
        }
        for name, run in cases.items():
            if a.reference not in (name, "both"):
                continue
            run(precision="fp32")  # warm-up: imports, the probe, the first sessions
            run()
            today, judged, ratios = [], [], []
            report = None
            today_run = functools.partial(run, precision="fp32")
            for _ in range(a.repeat):
                t_today, _ = _time(today_run)
                t_judged, report = _time(run)
                today.append(t_today)
                judged.append(t_judged)
                ratios.append(t_judged / t_today)
            assert report is not None
            rows = sum(r.ok is not None for r in report.rows)
            print(f"{name} reference, resnet50 {a.size}x{a.size}, {a.samples} sample(s), {rows} compared rows, "
                  f"ok={report.ok} at {report.precision}")
            print(f"  today's compare (precision fp32): median {statistics.median(today):.3f} s "
                  f"(min {min(today):.3f}, max {max(today):.3f})")
            print(f"  judged at float16 (ideal run):    median {statistics.median(judged):.3f} s "
                  f"(min {min(judged):.3f}, max {max(judged):.3f})")
            print(f"  ratio judged/today: median {statistics.median(ratios):.2f}x (goal <= 1.3x for the ONNX reference)")


if __name__ == "__main__":
    main()
