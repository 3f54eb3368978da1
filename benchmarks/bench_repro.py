"""Benchmark: ``lt.repro`` package size and time on a resnet50 block and a BERT layer.

Random weights, fixed seeds, no downloads. Each model is exported (weights as external data),
converted to float16 with onnxconverter-common (``keep_io_types=True``) and packaged with
``lt.repro(REF.onnx, inputs, FP16.onnx, module=...)``: the time includes the comparison that
finds the call's inputs, cutting both parts and running ``repro.py`` in a fresh interpreter.
``rtol=1e-4``: one float16 block's own error (~5e-4) is within the default 1e-3. Run::

    .venv/bin/python benchmarks/bench_repro.py [--only resnet50|bert] [--keep DIR]

Goal: a resnet50 block's package is a few MB (the float16 file alone is ~49 MB). Measured (2 shared cores):
resnet50 layer3.1 7.9 MB in 12.6 s; BERT (hidden 256, 4 layers) encoder.layer.1 4.8 MB in 5.6 s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


def resnet50(folder: Path) -> tuple[Path, Path, dict, str]:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    x = torch.randn(1, 3, 224, 224)
    ref = folder / "resnet50.onnx"
    torch.onnx.export(model, (x,), str(ref), dynamo=False, input_names=["x"], external_data=True)
    cand = folder / "resnet50-fp16.onnx"
    _fp16(ref, cand)
    return ref, cand, {"x": x.numpy()}, "layer3.1"


def bert(folder: Path) -> tuple[Path, Path, dict, str]:
    import torch
    from transformers import BertConfig, BertModel

    class Bert(BertModel):  # keyword arguments inside: the tracer passes positional ones
        def forward(self, input_ids, attention_mask):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.manual_seed(0)
    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    model = Bert(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ref = folder / "bert.onnx"
    torch.onnx.export(model, (ids, mask), str(ref), dynamo=False, input_names=["input_ids", "attention_mask"],
                      external_data=True)
    cand = folder / "bert-fp16.onnx"
    _fp16(ref, cand)
    return ref, cand, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, "encoder.layer.1"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def measure(name: str, build, folder: Path) -> dict:
    import layertap as lt

    ref, cand, feed, module = build(folder)
    t = time.perf_counter()
    report = lt.repro(ref, feed, cand, out=folder / f"{name}-repro", module=module, rtol=1e-4)
    wall = time.perf_counter() - t
    out = folder / f"{name}-repro"
    return {
        "model": name, "module": report.module, "reproduced": report.reproduced,
        "error": report.error, "ref_error": report.ref_error, "time_s": round(wall, 1),
        "package_mb": round(sum(p.stat().st_size for p in out.iterdir()) / 2**20, 2),
        "candidate_file_mb": round(_size(cand) / 2**20, 1), "files": report.files,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("resnet50", "bert"))
    p.add_argument("--keep", metavar="DIR", help="build in DIR and keep it")
    a = p.parse_args()
    folder = Path(a.keep or tempfile.mkdtemp(prefix="bench_repro_"))
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for name, build in (("resnet50", resnet50), ("bert", bert)):
        if a.only in (None, name):
            sub = folder / name
            sub.mkdir(exist_ok=True)
            results.append(measure(name, build, sub))
            print(json.dumps(results[-1]), flush=True)
    for r in results:
        print(f"{r['model']} {r['module']}: package {r['package_mb']} MB (candidate file {r['candidate_file_mb']} MB), "
              f"{r['time_s']} s, reproduced={r['reproduced']} (rel error {np.float64(r['error']):.3g})")
    if not a.keep:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
