"""``lt.fix(model, to="int8", out="m.pte")`` / ``layertap fix MODEL --to int8 --runtime executorch``: the fewest
modules kept float32 in an int8 ExecuTorch program (XNNPACK quantizer, pt2e; kept modules excluded by a
quantizer filter) that meet the target, each set lowered and run in ExecuTorch's runtime for real.

The search is fix's own (:func:`.search.search`: grow ranked groups, then prune to a minimal set); here
:class:`ProgramTrials` lowers and runs the sets, and the ranking comes from comparing the plain int8
program with the model module by module (:mod:`layertap.comparing.program_side`, judged at int8): modules
ranked by how much error they add (``rel_err`` growth over the row before), each with the calls folded
into it (a Conv absorbed into its BatchNorm). FIXED.pte is the chosen set exported as ``lt.export`` writes
programs (verified, with its sidecar and calibration samples).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..comparing import compare
from ..errors import LayertapError, unknown_name
from ..exporting.executorch import export_program, publish_program
from ..files.writes import atomic_write_bytes
from ..options import Model, SampleOptions
from ..pytorch.example_inputs import positional_samples
from ..pytorch.lowering import Recipe, as_args, lower, tapped_wrapper
from ..pytorch.reference import example_call, load
from ..pytorch.values import random_like
from ..runtimes.executorch import ProgramEngine, Sidecar
from ..samples.drawn import given_samples
from .configs import Target
from .search import FixStep, StepLog, run_latency, search


class ProgramTrials(StepLog):
    """Lowers and runs sets of modules kept float32 (what :func:`.search.search` drives); each program runs
    every sample in ExecuTorch, against the model's float outputs."""

    def __init__(self, model: Any, method: Any, samples: list[tuple], calibration: list[tuple], target: Target,
                 folder: Path, on_step: Callable[[FixStep], None] | None = None) -> None:
        super().__init__(target, on_step)
        self.tapped = tapped_wrapper(model, method, [], samples[0], None)
        self.samples, self.calibration, self.folder = samples, calibration, folder
        with torch.no_grad():
            self.refs = [[v.detach().numpy().copy() for v in self.tapped.wrapper(*s)] for s in samples]

    def _measure(self, n: int, kept: Sequence[str], action: str, changed: Sequence[str]) -> FixStep:
        path = self.folder / f"step{n}.pte"
        recipe = Recipe("xnnpack", "int8", self.calibration, list(kept))
        # with its record and calibration beside it, as lt.export writes it: compare lowers it again
        publish_program(path, lower(self.tapped.wrapper, self.tapped.example, recipe).buffer, self.sidecar(recipe), recipe)
        engine = ProgramEngine(path)
        names = [i.name for i in engine.get_inputs()]
        feeds = [{nm: t.numpy() for nm, t in zip(names, s)} for s in self.samples]
        outs = [list(engine.run(None, f).values()) for f in feeds]
        metric = self.target.measure(self.refs, outs)
        self.files[n] = path
        return FixStep(n, action, list(changed), list(kept), len(kept), metric, self.target.met(metric),
                       path.stat().st_size, run_latency(engine, feeds[0]))

    def sidecar(self, recipe: Recipe) -> Sidecar:
        """The record written beside each program tried."""
        names = [f"input_{i}" for i in range(len(self.tapped.example))]
        return Sidecar(Sidecar.input_records(names, self.tapped.example), self.tapped.records(), recipe.record())


def rank_program(report: Any, modules: set[str]) -> list[list[str]]:
    """Groups of modules to keep float32, most harmful first: each compared leaf module by how much its
    row's error grows over the row before (what it adds), with the calls folded into it.

    Example:
        >>> from types import SimpleNamespace as R
        >>> rows = [R(path="a", status="absorbed", fused_into="b", rel_err=None),
        ...         R(path="b", status="pass", fused_into=None, rel_err=0.01),
        ...         R(path="c", status="pass", fused_into=None, rel_err=0.2)]
        >>> rank_program(R(rows=rows), {"a", "b", "c"})
        [['c'], ['b', 'a']]
    """
    folded: dict[str, list[str]] = {}
    for r in report.rows:
        if r.status == "absorbed" and r.fused_into:
            folded.setdefault(r.fused_into, []).append(r.path)
    growth: dict[str, float] = {}
    before = 0.0
    for r in report.rows:
        if r.rel_err is None or not r.path:
            continue
        if r.path in modules:
            growth[r.path] = max(growth.get(r.path, -math.inf), r.rel_err - before)
        before = r.rel_err
    order = sorted(growth, key=lambda p: -growth[p])
    return [[p, *folded.get(p, [])] for p in order]


def fix_program(ref: Any, args: Any, *, out: str | os.PathLike | None, target: Target, sampling: SampleOptions,
                calib: Any, keep: Sequence[str], max_float: int | None, config_out: str | os.PathLike | None,
                on_step: Callable[[FixStep], None] | None) -> tuple[list[FixStep], list[str], str]:
    """The search for an int8 ExecuTorch program (see the module doc): the steps (the chosen one marked), notes,
    and the tool that quantised (for :class:`~layertap.fixing.fix.FixReport`)."""
    if out is not None and not str(out).lower().endswith(".pte"):
        raise LayertapError("an int8 ExecuTorch program is written to a .pte: give -o FIXED.pte")
    loaded = load(ref)
    args, kwargs, sampling = example_call(loaded, args, sampling)
    if kwargs:
        raise LayertapError("ExecuTorch programs take positional tensors; give the inputs without names")
    if sampling.inputs is not None:
        n_in = len(as_args(args)) if args is not None else 1
        given, n_random = positional_samples(sampling.inputs, [None] * n_in, limit=sampling.limit), 0
    elif args is None:  # the samples were drawn (or given) as a list
        drawn = sampling.samples
        given, n_random = (list(drawn) if drawn is not None and not isinstance(drawn, int) else []), 0
    else:
        given, n_random = given_samples(as_args(args), sampling.samples if sampling.samples is not None else 8)
    samples = [as_args(s) for s in given]
    samples += [tuple(random_like(samples[0], sampling.seed + i)) for i in range(len(samples), len(samples) + n_random)]
    calibration = _calibration(calib, samples)
    model, method = loaded.module, loaded.method
    known = {p for p, _ in model.named_modules() if p}
    unknown = [k for k in keep if k not in known]
    if unknown:
        raise LayertapError(unknown_name("module", unknown[0], sorted(known)))
    with tempfile.TemporaryDirectory(prefix="layertap-fix-") as tmp:
        trials = ProgramTrials(model, method, samples, calibration, target, Path(tmp), on_step)
        plain = trials.trial(list(keep), "keep" if keep else "plain", list(keep))
        notes: list[str] = []
        if not plain.ok:
            report = compare(Model(model, method=method), samples[0], trials.files[plain.step], samples=samples[:2])
            leaves = {p for p, m in model.named_modules() if p and not any(True for _ in m.children())}
            groups = rank_program(report, leaves)
            search(trials, groups, list(keep), max_float)
        best = trials.best()
        best.chosen = True
        if out is not None:
            exported = export_program(model, samples[0], out, method=method,
                                      recipe=Recipe("xnnpack", "int8", calibration, best.kept))
            notes.extend(exported.notes)
        if config_out is not None:
            _write_configs(Path(config_out), best.kept)
    return trials.steps, notes, "ExecuTorch XNNPACK quantizer (pt2e)"


def _calibration(calib: Any, samples: list[tuple]) -> list[tuple]:
    """``calib`` as the model's positional arguments (a path: as ``export --calib`` reads it); default the samples."""
    if calib is None:
        return samples
    if isinstance(calib, (str, os.PathLike)):
        return positional_samples(calib, [None] * len(samples[0]))
    return [as_args(s) for s in calib]


def _write_configs(folder: Path, kept: Sequence[str]) -> None:
    """The kept set: ``modules.json`` (module paths) and ``executorch_xnnpack.json`` (the quantizer recipe)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "modules.json", (json.dumps(list(kept), indent=1) + "\n").encode())
    recipe = {"quantizer": "executorch.backends.xnnpack.quantizer.xnnpack_quantizer.XNNPACKQuantizer",
              "global": "get_symmetric_quantization_config(is_per_channel=True)",
              "keep_float32_modules": list(kept),
              "how": "quantizer.set_filter_function(lambda node: not any(module_name_filter(m)(node) for m in "
                     "keep_float32_modules)) with torchao.quantization.pt2e.quantizer.utils.get_module_name_filter"}
    atomic_write_bytes(folder / "executorch_xnnpack.json", (json.dumps(recipe, indent=1) + "\n").encode())
