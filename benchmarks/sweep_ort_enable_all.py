"""Sweep (correctness, not timing): ``lt.compare`` of an export against the copy ONNX Runtime
saves at its default level (``ORT_ENABLE_ALL``: NCHWc kernels on x86), over torchvision models
and both exporters.

For each model and exporter it prints, for the faithful copy, the row counts and how many
compared rows were read through a blocked NCHWc tensor (any FAIL there is a false alarm),
then multiplies the weight of the NCHWc Conv halfway through the copy by 1.05 and prints
the first divergence, ``exact`` when that row is the perturbed node's own tensor.
``atol=0``: random-weight models have activations far below the default atol deep inside.

Run:
    .venv/bin/python benchmarks/sweep_ort_enable_all.py [--models resnet18,googlenet] [--size 64]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np

MODELS = ("resnet18", "mobilenet_v2", "densenet121", "efficientnet_b0", "regnet_y_400mf", "convnext_tiny",
          "shufflenet_v2_x0_5", "squeezenet1_0", "googlenet", "mnasnet0_5", "resnext50_32x4d")


def _model(name: str):
    import torchvision

    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    return getattr(torchvision.models, name)(weights=None, **kw).eval()


def _optimised(src: Path) -> Path:
    import onnxruntime as ort

    out = src.with_name(src.stem + "_all.onnx")
    so = ort.SessionOptions()  # the default level: ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return out


def _perturbed(path: Path) -> tuple[Path, str]:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    convs = [n for n in m.graph.node if n.domain == "com.microsoft.nchwc" and n.op_type == "Conv"]
    node = convs[len(convs) // 2]
    init = next(i for i in m.graph.initializer if i.name == node.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.05, init.name))
    out = path.with_name(path.stem + "_bad.onnx")
    onnx.save(m, str(out))
    return out, node.output[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--size", type=int, default=64)
    ns = ap.parse_args()
    import torch

    import layertap as lt
    from layertap.runtimes.ort_kernels import nchwc_block_size

    print(f"NCHWc block size here: {nchwc_block_size()}")
    work = Path(tempfile.mkdtemp(prefix="sweep-nchwc-"))
    x = torch.randn(1, 3, ns.size, ns.size, generator=torch.Generator().manual_seed(0))
    xn = np.ascontiguousarray(x.numpy())
    for name in ns.models.split(","):
        torch.manual_seed(0)
        model = _model(name)
        for exporter in ("dynamo", "torchscript"):
            src = work / f"{name}_{exporter}.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (x,), str(src), dynamo=exporter == "dynamo", input_names=["x"])
            full = _optimised(src)
            report = lt.compare(src, xn, full, atol=0.0)
            blocked = sum(any(t.startswith("reorder_token") for t in r.onnx) for r in report.rows if r.ok)
            fails = [r.name for r in report.rows if r.ok is False]
            bad, tensor = _perturbed(full)
            faulty = lt.compare(src, xn, bad, atol=0.0)
            row = faulty.first_divergence_row
            where = "exact" if row is not None and tensor in row.onnx else f"onnx={row.onnx if row else None}"
            print(f"{name:20s} {exporter:11s} {report.counts()} through NCHWc {blocked:3d}, false FAIL {fails[:3] or 0}; "
                  f"fault -> {faulty.first_divergence} ({where})", flush=True)


if __name__ == "__main__":
    main()
