"""Sweep (correctness, not timing): each torchvision model x both exporters, the file compared
with itself run by OpenVINO (``lt.compare(f, x, f, cand_runtime="openvino")``).

* ``--ov-precision f32``: every compared row should pass (goal: 0 FAIL).
* ``--ov-precision bf16`` (what OpenVINO picks by itself on CPUs with AMX or AVX512-BF16): the
  first divergence layertap reports, and the first row whose error exceeds what bf16 rounding
  explains.

What bf16 rounding explains, row by row: the same file with every floating-point tensor entering
every node (activations, weights, biases) rounded to bfloat16 (``Cast`` to bfloat16 and back, in
ONNX Runtime: round to nearest even, 8 significant bits) and everything else computed in float32,
compared with the plain file (``lt.compare``, same input). OpenVINO's bf16 mode rounds at fewer
points than that (it keeps accumulations, biases and fused element-wise steps in float32), so its
error at a row should not exceed this emulation's. A row is **beyond rounding** when its
OpenVINO error exceeds twice the emulation's at the same row (both ``rel_err``: max abs error /
max |ref|; the factor 2 leaves room for rounding errors that add up in another order) and it
fails layertap's tolerance. The last column: ``yes`` when that row is layertap's first divergence,
``rounding only`` when no row is beyond rounding (the first divergence is bf16's rounding
exceeding the default tolerance), ``no: ROW`` when another row is the first beyond rounding.
``ratio``: the largest OpenVINO / emulation error ratio over the failing rows, and its row.

``--fault SCALE`` checks that the criterion finds a real error among bf16's: a copy of the file
with the weight of the Conv halfway through multiplied by SCALE runs in OpenVINO at bf16, and
the first row beyond rounding should be that Conv's (``exact``).

Run:
    .venv/bin/python benchmarks/sweep_openvino.py [--models resnet18,vit_b_16] [--size 64] [--fault 1.02]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

MODELS = ("resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16",
          "regnet_y_400mf", "densenet121", "shufflenet_v2_x0_5", "squeezenet1_0")
FACTOR = 2.0  # a row is beyond bf16 rounding above FACTOR x the emulation's error


def _model(name: str, size: int):
    import torchvision

    kw = {"image_size": size} if name.startswith("vit_") else {}
    return getattr(torchvision.models, name)(weights=None, **kw).eval()


def bf16_emulation(src: Path) -> Path:
    """A copy of ``src`` whose every node rounds each floating-point input to bfloat16 first.

    Each ``Cast`` pair belongs to the node it feeds: its name extends that node's name and it
    carries the node's metadata, so layertap places it in the same module as the node.
    """
    import onnx
    from onnx import TensorProto, helper

    model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info, *g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    nodes = []
    for k, node in enumerate(g.node):
        for i, name in enumerate(node.input):
            if not name or types.get(name) != TensorProto.FLOAT or node.op_type in ("Shape", "Size"):
                continue
            stem = f"{node.name or f'node{k}'}_bf16_{i}"
            casts = [helper.make_node("Cast", [name], [stem + "_b"], name=stem + "_to", to=TensorProto.BFLOAT16),
                     helper.make_node("Cast", [stem + "_b"], [stem + "_f"], name=stem + "_back", to=TensorProto.FLOAT)]
            for c in casts:
                c.metadata_props.extend(node.metadata_props)
            nodes += casts
            node.input[i] = stem + "_f"
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    out = src.with_name(src.stem + "_bf16emu.onnx")
    onnx.save(model, str(out))
    return out


def beyond_rounding(ov_report, emu_report) -> tuple[str | None, float, str]:
    """The first failing row of ``ov_report`` whose rel error exceeds FACTOR x the emulation's at
    the same row, and the largest ratio over the failing rows, with its row (a row within
    layertap's tolerance is never beyond rounding, however small the emulation's error there)."""
    emu = {r.name: r.rel_err for r in emu_report.rows if r.ok is not None and r.rel_err is not None}
    first, worst, where = None, 0.0, ""
    for row in ov_report.rows:
        if row.ok is not False or row.rel_err is None or row.name not in emu:
            continue
        ratio = row.rel_err / max(emu[row.name], 1e-12)
        if ratio > worst:
            worst, where = ratio, row.name
        if first is None and ratio > FACTOR:
            first = row.name
    return first, worst, where


def sweep_one(src: Path, xn: np.ndarray, fault: float | None = None) -> str:
    """One table line: f32 FAIL rows / compared rows, output errors, the first divergence at
    bf16 and the first row beyond bf16 rounding; with ``fault``, the fault check's result."""
    import layertap as lt

    f32 = lt.compare(src, {"x": xn}, src, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="f32"))
    ov = lt.compare(src, {"x": xn}, src, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"))
    emu = lt.compare(src, {"x": xn}, bf16_emulation(src))
    first = ov.first_divergence_row
    beyond, worst, where = beyond_rounding(ov, emu)
    c = f32.counts()
    shown = f"{first.name} {first.rel_err:.1e} (emu {_rel(emu, first.name)})" if first else "none"
    if first is None:
        verdict = "no divergence"
    elif beyond is None:
        verdict = "rounding only"
    else:
        verdict = "yes" if beyond == first.name else f"no: {beyond}"
    fails = [r.name for r in f32.rows if r.ok is False][:3]
    return (f"{c['FAIL']:3d}/{c['pass'] + c['FAIL']:<4d} {f32.rows[-1].rel_err:8.1e} | {ov.rows[-1].rel_err:8.1e} "
            f"{emu.rows[-1].rel_err:8.1e} | {shown:42s} | {worst:5.2f} {where:24s} | {verdict}"
            f"{' | f32 FAIL: ' + ', '.join(fails) if fails else ''}{' | ' + faulty(src, xn, emu, fault) if fault else ''}")


def faulty(src: Path, xn: np.ndarray, emu, scale: float) -> str:
    """The criterion's power: the weight of the Conv halfway through the file times ``scale`` in
    a copy run by OpenVINO at bf16; ``exact`` when the first row beyond rounding is that Conv's."""
    import onnx
    from onnx import numpy_helper

    import layertap as lt

    model = onnx.load(str(src))
    weights = {i.name: i for i in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv" and n.input[1] in weights]
    node = convs[len(convs) // 2]
    w = weights[node.input[1]]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(scale), w.name))
    bad = src.with_name(src.stem + "_fault.onnx")
    onnx.save(model, str(bad))
    report = lt.compare(src, {"x": xn}, bad, runtime_options=lt.RuntimeOptions(cand_runtime="openvino", ov_precision="bf16"),
                        criterion=lt.Criterion(allow_different_weights=True))
    beyond, worst, where = beyond_rounding(report, emu)
    row = next((r for r in report.rows if r.name == beyond), None)
    hit = "exact" if row is not None and node.output[0] in row.onnx else f"perturbed {node.output[0]}"
    return f"fault x{scale} -> beyond rounding {beyond} ({hit}; ratio {worst:.2f} at {where})"


def _rel(report, name: str) -> str:
    row = next((r for r in report.rows if r.name == name), None)
    return f"{row.rel_err:.1e}" if row is not None and row.rel_err is not None else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--fault", type=float, default=None, metavar="SCALE",
                    help="also check the criterion finds a Conv weight times SCALE (e.g. 1.02) in a copy")
    ns = ap.parse_args()
    import openvino as ov
    import torch

    core = ov.Core()
    print(f"OpenVINO {ov.get_version()}, CPU default INFERENCE_PRECISION_HINT: "
          f"{core.get_property('CPU', 'INFERENCE_PRECISION_HINT').to_string()}; input 1x3x{ns.size}x{ns.size}")
    print(f"{'model':20s} {'exporter':11s} f32 FAIL  out rel | bf16 out  emu out | "
          f"{'first divergence at bf16 (rel err)':42s} | ratio at {'row':21s}| first divergence beyond rounding?")
    x = torch.randn(1, 3, ns.size, ns.size, generator=torch.Generator().manual_seed(0))
    xn = np.ascontiguousarray(x.numpy())
    for name in ns.models.split(","):
        torch.manual_seed(0)
        model = _model(name, ns.size)
        for exporter in ("dynamo", "torchscript"):
            t0 = time.perf_counter()
            # each file and its copies (the emulation, the fault) go as soon as their line is printed
            with tempfile.TemporaryDirectory(prefix="sweep-openvino-") as work:
                src = Path(work) / f"{name}_{exporter}.onnx"
                with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    torch.onnx.export(model, (x,), str(src), dynamo=exporter == "dynamo", input_names=["x"])
                line = sweep_one(src, xn, ns.fault)
            print(f"{name:20s} {exporter:11s} {line} [{time.perf_counter() - t0:.0f} s]", flush=True)

if __name__ == "__main__":
    main()
