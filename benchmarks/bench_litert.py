"""Benchmark LiteRT int8 checks, in one process (run it in the environment with ``layertap[litert]``:
``make test-litert`` builds ``.venv-litert``):

* the rival, AI Edge Quantizer's own ``validate``: the float ``.tflite`` against its ``static_wi8_ai8``
  quantisation, tensor by tensor, in LiteRT (time, tensors compared, the worst by its metric, named by
  TFLite tensor name);
* layertap: ``lt.compare(model, x, "m-int8.tflite")``, the PyTorch model against the int8 program, module by
  module and judged at int8 (time, rows, verdict, first divergence);
* with one module faulted (``layer3.0.conv1``'s output scaled by ``--factor`` while the program is converted,
  as a faulty toolchain would): what each of them names first. AI Edge Quantizer compares a program with its
  own quantisation, so a fault already in the float program is in both; layertap compares with PyTorch.

Run:
    .venv-litert/bin/python benchmarks/bench_litert.py [--model resnet18] [--size 64] [--samples 4]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FAULT = "layer3.0.conv1"


def validate(float_path: Path, samples: list[Any]) -> tuple[float, int, str]:
    """AI Edge Quantizer: quantise the float program (static_wi8_ai8, calibrated on ``samples``) and validate it
    against the float one; the seconds validate took, the tensors it compared, and its worst tensor."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import quantizer, recipe

    from layertap.pytorch.litert import quiet_converter

    name = Interpreter(model_path=str(float_path)).get_signature_runner().get_input_details()
    key = next(iter(name))
    data = {"serving_default": [{key: s.numpy()} for s in samples]}
    with quiet_converter():
        qt = quantizer.Quantizer(str(float_path), recipe.static_wi8_ai8())
        qt.quantize(qt.calibrate(data))
        start = time.perf_counter()
        result = qt.validate(test_data={"serving_default": data["serving_default"][:1]})
        seconds = time.perf_counter() - start
    found = result.get_signature_comparison_result("serving_default")
    tensors = {**found.intermediate_tensors, **found.output_tensors}
    worst = max(tensors.items(), key=lambda kv: max(kv[1].values()), default=("-", {}))
    where = worst[0].split("/")[-1]  # the location's last part: the module class and attribute it came from
    return seconds, len(tensors), f"{where} ({', '.join(f'{k} {v:.3g}' for k, v in worst[1].items())})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--factor", type=float, default=1.3, help="the fault: the module's output scaled by it")
    opts = parser.parse_args()

    import torch
    import torchvision

    import layertap as lt

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _faults import faulty_conversion  # the fault the tests inject

    torch.manual_seed(0)
    model = getattr(torchvision.models, opts.model)().eval()
    x = torch.randn(1, 3, opts.size, opts.size)
    samples = [x] + [torch.randn_like(x) for _ in range(opts.samples - 1)]
    int8 = lt.ExportOptions(quantize="int8", calibration=[(s,) for s in samples])
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        lt.export(model, x, work / "float.tflite")
        lt.export(model, x, work / "int8.tflite", export_options=int8)
        with faulty_conversion(FAULT, opts.factor):
            lt.export(model, x, work / "float-faulty.tflite")
            lt.export(model, x, work / "int8-faulty.tflite", export_options=int8)
        print(f"{opts.model} {opts.size}x{opts.size}, static int8, {opts.samples} calibration samples, fault: "
              f"{FAULT} x{opts.factor:g}")
        for label, suffix in (("healthy", ""), ("faulted", "-faulty")):
            seconds, n, worst = validate(work / f"float{suffix}.tflite", samples)
            print(f"  {label:>8}  AI Edge Quantizer validate, float vs int8:  {seconds:6.2f} s, {n} tensors, worst {worst}")
            for kind in ("float", "int8"):
                start = time.perf_counter()
                with faulty_conversion(FAULT, opts.factor) if suffix else contextlib.nullcontext():
                    report = lt.compare(model, x, work / f"{kind}{suffix}.tflite")
                seconds = time.perf_counter() - start
                print(f"  {label:>8}  layertap compare, PyTorch vs {kind:>5}:    {seconds:6.2f} s, {len(report.rows)} rows, "
                      f"ok={report.ok}, first divergence {report.first_divergence} (judged at {report.precision})")

if __name__ == "__main__":
    main()
