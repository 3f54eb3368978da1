"""Sweep (correctness, not timing): verdicts judged at the candidate's precision, against the fixed rule.

A corpus of reduced-precision candidates, healthy and with a fault injected at a known module, each
compared with its float32 reference (the PyTorch model, and the float32 file), with default options
(judged at the candidate's precision) and with ``precision="fp32"`` (the fixed rule, rtol 1e-3; rtol
2^-6 for OpenVINO at bfloat16, what compare used before). Per model:

* candidates: a float16 conversion (onnxconverter-common, ``keep_io_types``, ``max_finite_val=65504``),
  a static int8 QDQ file (``quantize_static``, per-channel, calibrated on 32 realistic samples, after
  ``quant_pre_process``), and the float32 file run by OpenVINO at bfloat16;
* faults, in the candidate file, each at a module the sweep records: a wrong op (an activation made an
  ``Identity``, an ``Add`` a ``Sub``), a weight changed by 5% and by 2% (a quantised weight's scale), and
  for int8 a quantiser's scale 10x too small;
* models: torchvision resnet18, mobilenet_v3_small, densenet121, efficientnet_b0 and timm deit_tiny,
  convnext_atto with random weights (BatchNorm statistics gathered on random inputs, so activations sit
  at a trained model's scale), and the trained CREPE tiny, MTCNN RNet and ONet of the test suite (their
  weights: ``make trained``), on realistic inputs (tone frames, face crops).

Printed: a line per run (healthy: passes or not; fault: where the first divergence is named, and whether
that is the module the fault sits in) and the totals: healthy runs flagged, faults named at their module,
new rule and old. Needs OpenVINO on a CPU that runs bfloat16 for the bf16 part (else it is left out).

Run:
    .venv/bin/python benchmarks/sweep_precision.py [--models resnet18,onet] [--kinds fp16,int8,bf16] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the trained architectures, their realistic inputs, the fault injectors

ZOO = {"resnet18": ("torchvision", 224), "mobilenet_v3_small": ("torchvision", 224), "densenet121": ("torchvision", 128),
       "efficientnet_b0": ("torchvision", 160), "deit_tiny_patch16_224": ("timm", 224), "convnext_atto": ("timm", 128)}
TRAINED = {"crepe_tiny": (1, 1024), "onet": (1, 3, 48, 48), "rnet": (1, 3, 24, 24)}
ACTIVATIONS = ("Relu", "Sigmoid", "HardSwish", "Erf", "PRelu", "Add")


def _model(name: str):
    import torch

    if name in TRAINED:
        import _trained

        return getattr(_trained, name)().eval()
    family, size = ZOO[name]
    torch.manual_seed(0)
    if family == "timm":
        import timm

        model = timm.create_model(name, pretrained=False)
    else:
        import torchvision

        model = getattr(torchvision.models, name)()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches below
    with torch.no_grad():
        model.train()
        g = torch.Generator().manual_seed(123)
        for _ in range(4 if norms else 0):
            model(torch.randn(8, 3, size, size, generator=g))
    return model.eval()


def _samples(name: str, n: int, seed: int) -> list[np.ndarray]:
    import _trained

    if name == "crepe_tiny":
        return [_trained.tone_frames(1, seed=seed + i) for i in range(n)]
    if name in TRAINED:
        return [_trained.face_crops(1, size=TRAINED[name][-1], seed=seed + i) for i in range(n)]
    size = ZOO[name][1]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, size, size)).astype(np.float32) for _ in range(n)]


def _files(name: str, model, folder: Path) -> dict[str, Path]:
    import onnx
    import torch
    from onnxconverter_common import float16
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32, pre = folder / f"{name}.onnx", folder / f"{name}-pre.onnx"
    torch.onnx.export(model, (torch.from_numpy(_samples(name, 1, 100)[0]),), str(fp32), dynamo=False, input_names=["x"],
                      opset_version=17)
    fp16 = folder / f"{name}-fp16.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True, max_finite_val=65504.0), str(fp16))
    quant_pre_process(str(fp32), str(pre))
    calib = iter([{"x": s} for s in _samples(name, 32, 1000)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(calib, None)

    int8 = folder / f"{name}-int8.onnx"
    quantize_static(str(pre), str(int8), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return {"fp32": fp32, "fp16": fp16, "int8": int8, "bf16": fp32}


def _inject(src: Path, dst: Path, fault: str) -> str | None:
    """Write the fault into a copy; returns the output tensor of the node it sits in (None: none fits)."""
    import onnx

    from _faults import replace_op, scale_weight, shrink_scale

    model = onnx.load(str(src), load_external_data=False)
    nodes = list(model.graph.node)
    inits = {i.name for i in model.graph.initializer}
    if fault == "wrong_op":
        for op in ACTIVATIONS:
            found = [n for n in nodes if n.op_type == op and not any(i in inits for i in n.input[1:])]
            if found:
                node = found[len(found) // 2]
                replace_op(src, dst, node.output[0], "Sub" if op == "Add" else "Identity")
                return node.output[0]
        return None
    if fault.startswith("weight"):
        convs = [n for n in nodes if n.op_type in ("Conv", "MatMul", "Gemm") and len(n.input) > 1]
        if not convs:
            return None
        node = convs[len(convs) // 2]
        scale_weight(src, dst, node.output[0], 1.05 if fault == "weight5" else 1.02)
        return node.output[0]
    quantised = [n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    if not quantised:
        return None
    q = quantised[len(quantised) // 2]
    shrink_scale(src, dst, q.input[0], 0.1)
    return q.input[0]


def _where(path: Path, tensor: str) -> tuple[str | None, set[str]]:
    """The module call whose value the faulty node computes, and the tensors standing for its output."""
    import onnx

    from layertap.onnxfile.scopemap import ScopeMap, stand_ins

    model = onnx.load(str(path), load_external_data=False)
    index = next(i for i, n in enumerate(model.graph.node) if tensor in n.output)
    smap = ScopeMap.from_model(model)
    owner = smap.owner(index) if smap.source != "none" else None
    names = {tensor, *model.graph.node[index].output}
    through = stand_ins(model.graph)
    return (owner[0] if owner else None), names | {through[t] for t in names if t in through}


def _run(model, name: str, kind: str, cand: Path, fp32: Path, by: str, precision: str):
    import torch

    import layertap as lt

    extra = {"allow_different_weights": True, "precision": precision}
    if kind == "bf16":
        extra.update({"runtime" if by == "model" else "cand_runtime": "openvino", "ov_precision": "bf16"})
    if precision == "fp32" and kind == "bf16":
        extra["rtol"] = 2.0**-6  # what compare judged a bfloat16 run at before
    samples = _samples(name, 2, 7)
    with contextlib.redirect_stderr(io.StringIO()):
        if by == "model":
            tensors = [torch.from_numpy(s) for s in samples]
            return lt.compare(model, tensors[0], cand, samples=tensors, **extra)
        return lt.compare(fp32, None, cand, samples=[{"x": s} for s in samples], **extra)


def _right(report, owner: str | None, outs: set[str]) -> bool:
    first = report.first_divergence_row
    if first is None:
        return False
    plain = owner.split(".", 1)[1] if owner and owner.startswith(("_fn.", "model.")) else owner
    return bool(set(first.onnx) & outs) or (plain is not None and first.path == plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join([*ZOO, *TRAINED]))
    parser.add_argument("--kinds", default="fp16,int8,bf16")
    parser.add_argument("--keep", default=None, help="write the corpus here (default: a temporary folder)")
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    kinds = a.kinds.split(",")
    if "bf16" in kinds and not _bf16_here():
        print("OpenVINO does not run bfloat16 here: the bf16 part is left out")
        kinds.remove("bf16")
    totals = {k: [0, 0] for k in ("healthy runs", "flagged (new)", "flagged (old)", "faults", "right (new)", "right (old)")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in a.models.split(","):
            model = _model(name)
            files = _files(name, model, folder)
            for kind in kinds:
                for fault in (None, "wrong_op", "weight5", "weight2", *(("clip",) if kind == "int8" else ())):
                    cand, owner, outs = files[kind], None, set()
                    if fault is not None:
                        cand = folder / f"{name}-{kind}-{fault}.onnx"
                        tensor = _inject(files[kind], cand, fault)
                        if tensor is None:
                            continue
                        owner, outs = _where(cand, tensor)
                    for by in ("model", "file"):
                        new = _run(model, name, kind, cand, files["fp32"], by, "auto")
                        old = _run(model, name, kind, cand, files["fp32"], by, "fp32")
                        _count(totals, fault, new, old, owner, outs)
                        verdict = (f"new {'ok' if new.ok else 'FLAGGED ' + str(new.first_divergence)}, "
                                   f"old {'ok' if old.ok else 'flagged'}" if fault is None else
                                   f"new {new.first_divergence} ({'right' if _right(new, owner, outs) else 'not ' + str(owner)}), "
                                   f"old {old.first_divergence} ({'right' if _right(old, owner, outs) else 'not right'})")
                        print(f"{name:22s} {kind:5s} {fault or 'healthy':9s} vs {by:5s}: {verdict}", flush=True)
    h, f = totals["healthy runs"][0], totals["faults"][0]
    print(f"healthy runs flagged: {totals['flagged (new)'][0]} of {h} judged at precision, "
          f"{totals['flagged (old)'][0]} of {h} by the fixed rule")
    print(f"faults named at their module: {totals['right (new)'][0]} of {f} judged at precision, "
          f"{totals['right (old)'][0]} of {f} by the fixed rule")


def _count(totals: dict, fault: str | None, new, old, owner: str | None, outs: set[str]) -> None:
    if fault is None:
        totals["healthy runs"][0] += 1
        totals["flagged (new)"][0] += not new.ok
        totals["flagged (old)"][0] += not old.ok
    else:
        totals["faults"][0] += 1
        totals["right (new)"][0] += _right(new, owner, outs)
        totals["right (old)"][0] += _right(old, owner, outs)


def _bf16_here() -> bool:
    try:
        from layertap.runtimes import open_runtime

        return open_runtime("openvino", ov_precision="bf16").describe().precision == "bfloat16"
    except Exception:  # noqa: BLE001 - no OpenVINO, or it refuses bf16 on this CPU
        return False


if __name__ == "__main__":
    main()
