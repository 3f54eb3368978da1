"""``layertap demo``: the main jobs on a built-in default (torchvision resnet18).

The demo is a list of steps (:data:`STEPS`); each takes the shared
:class:`DemoContext` and prints what it did. Later features add their own
step (export, add-outputs, compare) by appending to the list.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..console import rule, stdout_console
from .base import Tool

MODEL = "torchvision:resnet18"
SEED = 0
# Taps that show the selector grammar: a block output, the second call of a
# reused module, a deep conv, and a module's input under an alias.
TAPS = ["layer1", "layer2.0.relu#1", "layer4.0.conv1", "pooled=fc:input"]


@dataclasses.dataclass
class DemoContext:
    """What the steps share: the console, a work folder, the model and its inputs."""

    console: Any
    workdir: Path
    model: Any = None
    info: Any = None
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    written: list[Path] = dataclasses.field(default_factory=list)
    scratch: dict = dataclasses.field(default_factory=dict)

    step: int = 0

    def heading(self, text: str) -> None:
        self.step += 1
        rule(self.console, f"[bold]{self.step}. {text}")

    def show(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


def step_build(ctx: DemoContext) -> None:
    """Build resnet18 with seeded random weights and its default input."""
    from ...pytorch.models import describe_inputs, load_model, make_inputs

    ctx.heading(f"model: {MODEL}")
    ctx.model, ctx.info = load_model(MODEL, seed=SEED)
    ctx.args, ctx.kwargs = make_inputs(ctx.info, model=ctx.model, seed=SEED)
    ctx.show(f"{ctx.info.describe()}, seed {SEED}; input {describe_inputs(ctx.args, ctx.kwargs)}")
    ctx.show(f"$ layertap layers {MODEL}")


def step_layers(ctx: DemoContext) -> None:
    """The layers table, trimmed to the top levels plus one block in full."""
    from ...pytorch.layers import LayersTable, layers

    ctx.heading("layers: every module call, its tap name and output shape")
    table = layers(ctx.model, *ctx.args, **ctx.kwargs)
    keep = [r for r in table.rows if r.depth <= 2 or r.path.startswith("layer2.0.")]
    trimmed = LayersTable(keep, notes=[
        f"showing {len(keep)} of {len(table.rows)} rows (top levels, and layer2.0 in full: "
        "its relu runs twice, so its calls are layer2.0.relu#0 and #1)",
    ])
    ctx.console.print(trimmed)
    for line in trimmed.footer():
        ctx.show(line)
    ctx.scratch["layers"] = table


def step_extract(ctx: DemoContext) -> None:
    """Capture a few taps and save them to an .npz file."""
    import numpy as np
    import torch

    from ...files import save_arrays
    from ...pytorch.taps import extract
    from .extract import to_numpy

    ctx.heading("extract: tapped tensors to a file")
    out = ctx.workdir / "resnet18_taps.npz"
    ctx.show(f"$ layertap extract {MODEL} " + " ".join(f"--tap {t}" for t in TAPS) + f" -o {out.name}")
    values = extract(ctx.model, *ctx.args, taps=TAPS, **ctx.kwargs)
    arrays, _ = to_numpy(values)
    save_arrays(out, arrays)
    ctx.written.append(out)
    with np.load(out) as saved:
        for name in saved.files:
            a = saved[name]
            ctx.show(f"  {name:18s} {'x'.join(map(str, a.shape)):14s} mean {a.mean():+.4f}  std {a.std():.4f}")
    # An independent check: layer4.0.conv1 applied by hand to layer4's input.
    with torch.no_grad():
        x = extract(ctx.model, *ctx.args, taps=["layer4:input"])["layer4:input"]
        by_hand = ctx.model.layer4[0].conv1(x)
    same = torch.allclose(values["layer4.0.conv1"], by_hand)
    ctx.show(f"layer4.0.conv1 equals conv1 applied by hand to layer4's input: {same}")
    ctx.show(f"wrote {out}")


def step_stop_early(ctx: DemoContext) -> None:
    """``stop_early``: capture layer2 without computing layer3, layer4 and fc."""
    import torch

    from ...pytorch.taps import extract

    ctx.heading("stop early: later layers are never computed")

    def best_of(fn: Callable[[], Any], n: int = 3) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    with torch.no_grad():
        full = best_of(lambda: ctx.model(*ctx.args, **ctx.kwargs))
    early = extract(ctx.model, *ctx.args, taps=["layer2"], stop_early=True, **ctx.kwargs)
    t_early = best_of(lambda: extract(ctx.model, *ctx.args, taps=["layer2"], stop_early=True, **ctx.kwargs))
    ctx.show(f"keys: {list(early)} (no 'output': the forward stopped after layer2)")
    ctx.show(f"time: {t_early * 1e3:.1f} ms vs {full * 1e3:.1f} ms for the full forward ({t_early / full:.2f}x)")


def step_existing_onnx(ctx: DemoContext) -> None:
    """An ONNX file made without layertap: expose ``layer3.1`` by module path and run it."""
    import warnings

    import torch

    from ...onnxfile.outputs import add_outputs
    from ...onnxfile.runner import run

    ctx.heading("existing ONNX file: expose a module's output by its PyTorch path")
    src, dst = ctx.workdir / "plain.onnx", ctx.workdir / "plain_tapped.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(ctx.model, ctx.args, str(src), dynamo=False, input_names=["x"], output_names=["output"])
    ctx.show(f"$ layertap add-outputs {src.name} -o {dst.name} --module layer3.1")
    added = add_outputs(src, dst, modules=["layer3.1"])
    ctx.written += [src, dst]
    ctx.show(f"$ layertap run {dst.name}")
    values = run(dst)
    for name in ["output", *added]:
        ctx.show(f"  {name}: shape {list(values[name].shape)}, mean {values[name].mean():.4g}")


def step_compare(ctx: DemoContext) -> None:
    """PyTorch vs ONNX Runtime layer by layer, then a file with one conv's weights changed."""
    import warnings

    import onnx
    import torch
    from onnx import numpy_helper

    from ...bridge.compare import CompareReport, compare

    ctx.heading("compare: PyTorch vs ONNX Runtime, module by module")
    src = ctx.workdir / "plain.onnx"
    if not src.is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(ctx.model, ctx.args, str(src), dynamo=False, input_names=["x"], output_names=["output"])
        ctx.written.append(src)
    ctx.show(f"$ layertap compare {MODEL} {src.name}")
    report = compare(ctx.model, ctx.args, src, kwargs=ctx.kwargs)
    keep = [r for r in report.rows if r.path.count(".") == 0 or r.path.startswith("layer3.0.")]
    trimmed = CompareReport(keep, report.notes, rtol=report.rtol, atol=report.atol)
    ctx.console.print(trimmed)
    ctx.show(f"showing {len(keep)} of {len(report.rows)} rows (top level, and layer3.0 in full); "
             "convs folded into their BatchNorm are 'absorbed' and compared at the BatchNorm")
    ctx.show(report.footer()[-1])
    # The same file with layer3.0.conv1's (folded) weights scaled by 1.1.
    bad = ctx.workdir / "plain_broken.onnx"
    proto = onnx.load(str(src))
    conv = next(n for n in proto.graph.node if n.name == "/layer3/layer3.0/conv1/Conv")
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.1, init.name))
    onnx.save(proto, str(bad))
    plot = ctx.workdir / "compare_broken.png"
    ctx.show(f"$ layertap compare {MODEL} {bad.name} --plot {plot.name}   # layer3.0.conv1 weights x1.1")
    broken = compare(ctx.model, ctx.args, bad, kwargs=ctx.kwargs)
    broken.plot(plot)
    ctx.written += [bad, plot]
    ctx.show(broken.footer()[-1] + f" (exit status {0 if broken.ok else 1})")


def step_export(ctx: DemoContext) -> None:
    """Export with the taps as named outputs and show the ONNX Runtime check."""
    from ...bridge.export import export

    ctx.heading("export: taps become named ONNX outputs, verified in ONNX Runtime")
    out = ctx.workdir / "resnet18_taps.onnx"
    ctx.show(f"$ layertap export {MODEL} -o {out.name} " + " ".join(f"--tap {t}" for t in TAPS))
    report = export(ctx.model, ctx.args, out, TAPS, kwargs=ctx.kwargs)
    ctx.written.append(out)
    ctx.console.print(report)
    for line in report.footer():
        ctx.show(line)


# The tour, in the order a user meets the features; new features add a step here.
STEPS: list[Callable[[DemoContext], None]] = [
    step_build,
    step_layers,
    step_extract,
    step_stop_early,
    step_export,
    step_existing_onnx,
    step_compare,
]


class DemoTool(Tool):
    name = "demo"
    help = "show layertap end to end on torchvision resnet18 (random weights)"

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", metavar="DIR", help="folder for the files the demo writes (default: a new temporary folder)")

    def run(self, ns: argparse.Namespace) -> int:


        console = stdout_console()
        if ns.out:
            workdir = Path(ns.out)
            if not workdir.is_dir():
                from ...errors import LayertapError

                raise LayertapError(f"--out folder '{workdir}' does not exist; create it first")
        else:
            workdir = Path(tempfile.mkdtemp(prefix="layertap-demo-"))
        ctx = DemoContext(console=console, workdir=workdir)
        for step in STEPS:
            step(ctx)
        rule(ctx.console, "[bold]done")
        ctx.show(f"files written to {workdir}:")
        for path in ctx.written:
            ctx.show(f"  {path.name}")
        return 0
