"""``layertap demo``: the main jobs on a built-in default (torchvision resnet18).

The demo is a list of steps (:data:`STEPS`); each takes the shared
:class:`DemoContext`. A ``$ layertap ...`` line is followed by what that very
command prints: the demo runs it in-process (:meth:`DemoContext.command`) in
the work folder and shows its output, with long tables shortened by an
explicit ``[... N lines not shown ...]`` marker. Lines starting with ``>>>``
are Python, run on the same model.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shlex
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ...errors import LayertapError
from ..args import Args
from ..console import rule, stdout_console
from ..main import main
from .base import Tool

MODEL = "torchvision:resnet18"
SEED = 0
# Taps that show the selector grammar: a block output, the second call of a
# reused module, a deep conv, and a module's input under an alias.
TAPS = ["layer1", "layer2.0.relu#1", "layer4.0.conv1", "pooled=fc:input"]
TIMING_ROUNDS = 7


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
    step: int = 0

    def heading(self, text: str) -> None:
        self.step += 1
        rule(self.console, f"[bold]{self.step}. {text}")

    def show(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def command(self, argv: Sequence[str], head: int | None = None, tail: int = 0) -> int:
        """Show ``$ layertap ARGV``, run it in-process, show what it printed; return its exit status.

        With ``head``, only the first ``head`` and last ``tail`` lines of its
        output are shown, with a marker saying how many were left out.
        """
        self.show("$ layertap " + " ".join(_quote(a) for a in argv))
        with _captured(self.console) as (out, err):
            status = main(list(argv))
        lines = out.getvalue().splitlines() + err.getvalue().splitlines()
        if head is not None and len(lines) > head + tail + 1:
            hidden = len(lines) - head - tail
            lines = [*lines[:head], f"[... {hidden} lines not shown ...]", *lines[len(lines) - tail:]]
        for line in lines:
            self.show(line)
        if status:
            self.show(f"(exit status {status})")
        return status


@contextlib.contextmanager
def _captured(console: Any) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """stdout/stderr of an in-process command, its tables laid out at the demo console's width."""
    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("COLUMNS")
    if console.is_terminal:
        os.environ["COLUMNS"] = str(console.width)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _quote(arg: str) -> str:
    return shlex.quote(arg)


def step_build(ctx: DemoContext) -> None:
    """Build resnet18 with seeded random weights (the same ones ``torchvision:resnet18`` gives every command)."""
    from ...pytorch.example_inputs import describe_inputs, make_inputs
    from ...pytorch.models import load_model

    ctx.heading(f"model: {MODEL}")
    ctx.model, ctx.info = load_model(MODEL, seed=SEED)
    ctx.args, ctx.kwargs = make_inputs(ctx.info, model=ctx.model, seed=SEED)
    ctx.show(f"{ctx.info.describe()}, seed {SEED}; default input {describe_inputs(ctx.args, ctx.kwargs)}")


def step_layers(ctx: DemoContext) -> None:
    """The layers table: every module call, its tap name and output shape."""
    ctx.heading("layers: every module call, its tap name and output shape")
    ctx.command(["layers", MODEL], head=24, tail=3)
    ctx.show("layer2.0's relu runs twice, so its calls are the taps layer2.0.relu#0 and layer2.0.relu#1")


def step_extract(ctx: DemoContext) -> None:
    """Capture a few taps, save them to an .npz file, check one by hand."""
    import numpy as np
    import torch

    from ...pytorch.taps import extract

    ctx.heading("extract: tapped tensors to a file")
    out = ctx.workdir / "resnet18_taps.npz"
    ctx.command(["extract", MODEL, *[a for t in TAPS for a in ("--tap", t)], "-o", out.name])
    ctx.written.append(out)
    # An independent check: layer4.0.conv1 applied by hand to layer4's input.
    ctx.show(">>> x = lt.extract(model, x, taps=['layer4:input'])['layer4:input']; model.layer4[0].conv1(x)")
    with torch.no_grad():
        x = extract(ctx.model, *ctx.args, taps=["layer4:input"])["layer4:input"]
        by_hand = ctx.model.layer4[0].conv1(x).numpy()
    with np.load(out) as saved:
        same = np.allclose(saved["layer4.0.conv1"], by_hand)
    ctx.show(f"layer4.0.conv1 in {out.name} equals conv1 applied by hand to layer4's input: {same}")


def step_stop_early(ctx: DemoContext) -> None:
    """``stop_early``: capture layer2 without computing layer3, layer4 and fc; timed robustly."""
    import torch

    from ...pytorch.taps import extract

    ctx.heading("stop early: later layers are never computed")
    ctx.show(">>> lt.extract(model, x, taps=['layer2'], stop_early=True)")
    early = extract(ctx.model, *ctx.args, taps=["layer2"], stop_early=True, **ctx.kwargs)
    ctx.show(f"keys: {list(early)} (no 'output': the forward stopped after layer2)")
    with torch.no_grad():
        times = interleaved_medians({
            "full": lambda: ctx.model(*ctx.args, **ctx.kwargs),
            "early": lambda: extract(ctx.model, *ctx.args, taps=["layer2"], stop_early=True, **ctx.kwargs),
        }, rounds=TIMING_ROUNDS)
    ctx.show(
        f"time: {times['early'] * 1e3:.1f} ms with stop_early vs {times['full'] * 1e3:.1f} ms for a plain forward "
        f"({times['early'] / times['full']:.2f}x); medians of {TIMING_ROUNDS} interleaved runs after a warm-up, "
        f"batch 1, {torch.get_num_threads()} threads, no_grad"
    )


def interleaved_medians(fns: dict[str, Callable[[], Any]], rounds: int = 7, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each function, over ``rounds`` interleaved rounds after ``warmup`` ones.

    Interleaving spreads a busy machine's slow spells over all functions alike.

    Example:
        >>> sorted(interleaved_medians({"a": lambda: None, "b": lambda: None}, rounds=3))
        ['a', 'b']
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def step_export(ctx: DemoContext) -> None:
    """Export with the taps as named outputs and show the ONNX Runtime check."""
    ctx.heading("export: taps become named ONNX outputs, verified in ONNX Runtime")
    out = ctx.workdir / "resnet18_taps.onnx"
    ctx.command(["export", MODEL, "-o", out.name, *[a for t in TAPS for a in ("--tap", t)]])
    ctx.written.append(out)


def _plain_onnx(ctx: DemoContext) -> Path:
    """resnet18 exported by plain ``torch.onnx.export`` (no layertap), once."""
    import torch

    src = ctx.workdir / "plain.onnx"
    if not src.is_file():
        ctx.show(">>> torch.onnx.export(model, x, 'plain.onnx', dynamo=False)   # a file made without layertap")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(ctx.model, ctx.args, str(src), dynamo=False, input_names=["x"], output_names=["output"])
        ctx.written.append(src)
    return src


def step_existing_onnx(ctx: DemoContext) -> None:
    """An ONNX file made without layertap: expose ``layer3.1`` by module path and run it."""
    ctx.heading("existing ONNX file: expose a module's output by its PyTorch path")
    src, dst = _plain_onnx(ctx), ctx.workdir / "plain_tapped.onnx"
    ctx.command(["add-outputs", src.name, "-o", dst.name, "--module", "layer3.1"])
    ctx.command(["run", dst.name])
    ctx.written.append(dst)


def step_compare(ctx: DemoContext) -> None:
    """PyTorch vs ONNX Runtime layer by layer, then a file with one conv's weights changed."""
    import onnx
    from onnx import numpy_helper

    ctx.heading("compare: PyTorch vs ONNX Runtime, module by module")
    src = _plain_onnx(ctx)
    ctx.command(["compare", MODEL, src.name], head=16, tail=3)
    # The same file with layer3.0.conv1's (folded) weights scaled by 1.1.
    bad = ctx.workdir / "plain_broken.onnx"
    proto = onnx.load(str(src))
    conv = next(n for n in proto.graph.node if n.name == "/layer3/layer3.0/conv1/Conv")
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.1, init.name))
    onnx.save(proto, str(bad))
    ctx.show(f">>> # {bad.name}: {src.name} with layer3.0.conv1's weights x1.1")
    plot = ctx.workdir / "compare_broken.png"
    ctx.command(["compare", MODEL, bad.name, "--plot", plot.name], head=8, tail=6)
    ctx.written += [bad, plot]


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
    examples = (
        "layertap demo",
        "layertap demo --out demo-files  # keep the files it writes",
    )

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", metavar="DIR", help="folder for the files the demo writes (created if needed; "
                                                         "default: a temporary folder, removed at the end)")
        parser.add_argument("--keep", action="store_true", help="keep the temporary folder (without --out)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> tuple[str | None, bool]:
        """``(--out, whether to remove the work folder at the end)``."""
        return ns.out, ns.out is None and not ns.keep

    def run(self, args: Args) -> int:
        out, remove = args.own
        workdir = _workdir(out)
        ctx = DemoContext(console=stdout_console(), workdir=workdir)
        here = Path.cwd()
        try:
            os.chdir(workdir)  # the commands shown write short relative names
            for step in STEPS:
                step(ctx)
        finally:
            os.chdir(here)
            if remove:
                shutil.rmtree(workdir, ignore_errors=True)
        rule(ctx.console, "[bold]done")
        if remove:
            ctx.show(f"removed the temporary folder {workdir} (--keep or --out DIR keeps the files)")
        else:
            ctx.show(f"files written to {workdir}: " + ", ".join(p.name for p in ctx.written))
        return 0


def _workdir(out: str | None) -> Path:
    if out is None:
        return Path(tempfile.mkdtemp(prefix="layertap-demo-"))
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LayertapError(f"cannot create the --out folder '{path}': {e.strerror or e}") from None
    return path.resolve()
