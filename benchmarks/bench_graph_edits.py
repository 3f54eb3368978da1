"""Benchmark: what one IR for every graph edit would cost, on resnet50 (weights random).

Files read from disk are edited as the protobuf ``read_model`` gives (``onnxfile/``); only the
exporter's own IR is edited with onnx-ir (``exporting/_onnxedit.py``). Editing files with onnx-ir
instead would convert each graph to the IR and back; this prints that round trip beside the
``lt.compare`` it would be added to (the file against itself, which builds its sessions from the
graph read once). Run::

    .venv/bin/python benchmarks/bench_graph_edits.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings


def best_ms(fn, repeat: int) -> float:
    """The fastest of ``repeat`` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()

    import onnx
    import onnx_ir as ir
    import torch
    import torchvision

    import layertap as lt
    from layertap.onnxfile.modelfile import read_model

    folder = tempfile.mkdtemp(prefix="bench-edits-")
    path = os.path.join(folder, "r50.onnx")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torchvision.models.resnet50().eval(), (torch.randn(1, 3, 224, 224),), path, dynamo=False)
    graph_only = read_model(path).model
    full = onnx.load(path)

    def round_trip(model: onnx.ModelProto) -> None:
        ir.serde.serialize_model(ir.serde.deserialize_model(model))

    graph_ms = best_ms(lambda: round_trip(graph_only), opts.repeat)
    full_ms = best_ms(lambda: round_trip(full), opts.repeat)
    lt.compare(path, None, path, runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False))  # warm-up: imports, first sessions
    compare_ms = best_ms(lambda: lt.compare(path, None, path, runtime_options=lt.RuntimeOptions(ref_ort_optimizations=False)), opts.repeat)
    print(f"resnet50, {len(graph_only.graph.node)} nodes, best of {opts.repeat}")
    print(f"  protobuf -> onnx-ir -> protobuf, graph only   {graph_ms:8.1f} ms")
    print(f"  protobuf -> onnx-ir -> protobuf, with weights {full_ms:8.1f} ms")
    print(f"  lt.compare(file, None, file)                  {compare_ms:8.1f} ms")
    print(f"one round trip per file read = {2 * graph_ms / compare_ms:.0%} of that comparison (two files)")


if __name__ == "__main__":
    main()
