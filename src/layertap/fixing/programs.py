"""``lt.fix`` for a ``"program"`` runtime (``layertap fix MODEL --to int8 --runtime executorch -o FIXED.pte``): the
fewest modules kept float32 in a program the runtime lowers from the model that meet the target, each set
lowered by the runtime's plug-in (:meth:`~layertap.runtimes.plugins.ProgramPlugin.lower_kept`: its quantizer
with the kept modules filtered out) and run in its runtime for real.

The search is fix's own (:func:`.search.search`: grow ranked groups, then prune to a minimal set); here
:class:`ProgramTrials` lowers and runs the sets, and the ranking comes from comparing the plain program with
the model module by module (:func:`.search.rank_by_growth`). FIXED is the chosen set lowered again as the
trials lowered it (with its record), and ``--config-out`` holds the runtime's own recipe for the kept set.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..comparing import compare
from ..errors import LayertapError, unknown_name
from ..files.writes import atomic_write_bytes
from ..inputs import as_specs
from ..options import Model, RuntimeOptions, SampleOptions
from ..pytorch.lowering import as_args, tapped_wrapper
from ..pytorch.reference import load
from ..runtimes.plugins import ProgramPlugin
from ..samples.for_reference import samples_for
from .configs import Target
from .search import FixStep, StepLog, rank_by_growth, run_latency, search


class ProgramTrials(StepLog):
    """Lowers and runs sets of modules kept float32 (what :func:`.search.search` drives); each program runs
    every sample in its runtime, against the model's float outputs."""

    def __init__(self, runtime: ProgramPlugin, model: Any, method: Any, samples: list[tuple], calibration: list[tuple],
                 target: Target, folder: Path, on_step: Callable[[FixStep], None] | None = None, to: str = "int8") -> None:
        super().__init__(target, on_step)
        self.runtime, self.model, self.method, self.to = runtime, model, method, to
        #: per step, what compare takes as that set's candidate (the file written, or the module it runs)
        self.candidates: dict[int, Any] = {}
        self.samples, self.calibration, self.folder = samples, calibration, folder
        self.memo: dict[str, Any] = {}  # what the plug-in keeps for every set (its float export)
        wrapper = tapped_wrapper(model, method, [], samples[0], None).wrapper
        with torch.no_grad():
            self.refs = [[v.detach().numpy().copy() for v in wrapper(*s)] for s in samples]

    def _measure(self, n: int, kept: Sequence[str], action: str, changed: Sequence[str]) -> FixStep:
        path = self.folder / f"step{n}{_suffix(self.runtime)}"
        engine = self.runtime.lower_kept(self.model, self.method, self.samples, self.calibration, self.to, kept, path,
                                         self.memo)
        names = [i.name for i in engine.get_inputs()]
        feeds = [{nm: t.numpy() for nm, t in zip(names, s)} for s in self.samples]
        outs = [list(engine.run(None, f).values()) for f in feeds]
        metric = self.target.measure(self.refs, outs)
        self.files[n] = path
        self.candidates[n] = getattr(engine, "candidate", path)
        return FixStep(n, action, list(changed), list(kept), len(kept), metric, self.target.met(metric),
                       path.stat().st_size, run_latency(engine, feeds[0]))


def _suffix(runtime: ProgramPlugin) -> str:
    """The suffix of what a fix of ``runtime`` writes (its program's; compiled PyTorch: ``keep-eager.json``'s)."""
    return Path(getattr(runtime, "fix_out", f"FIXED{runtime.suffixes[0]}")).suffix


def fix_program(runtime: ProgramPlugin, ref: Any, args: Any, *, to: str = "int8", out: str | os.PathLike | None,
                target: Target, sampling: SampleOptions, calib: Any, keep: Sequence[str], max_float: int | None,
                config_out: str | os.PathLike | None, on_step: Callable[[FixStep], None] | None,
                settings: dict[str, Any] | None = None) -> tuple[list[FixStep], list[str], str]:
    """The search for a program of ``runtime`` at ``to`` (see the module doc): the steps (the chosen one marked),
    notes, and the tool that made it (for :class:`~layertap.fixing.fix.FixReport`); ``settings``: the runtime's
    own, for the ranking comparison."""
    suffix, name = _suffix(runtime), getattr(runtime, "fix_out", f"FIXED{runtime.suffixes[0]}")
    if out is not None and not str(out).lower().endswith(suffix):
        raise LayertapError(f"a fix in {runtime.title} writes a {suffix}: give -o {name}")
    loaded = load(ref)
    samples, calibration = _samples(runtime, loaded, args, sampling, calib)
    model, method = loaded.module, loaded.method
    known = {p for p, _ in model.named_modules() if p}
    unknown = [k for k in keep if k not in known]
    if unknown:
        raise LayertapError(unknown_name("module", unknown[0], sorted(known)))
    with tempfile.TemporaryDirectory(prefix="layertap-fix-") as tmp:
        trials = ProgramTrials(runtime, model, method, samples, calibration, target, Path(tmp), on_step, to)
        plain = trials.trial(list(keep), "keep" if keep else "plain", list(keep))
        notes: list[str] = []
        if not plain.ok:
            options = RuntimeOptions(cand_runtime=runtime.name, **(settings or {}))
            report = compare(Model(model, method=method), samples[0], trials.candidates[plain.step], samples=samples[:2],
                             runtime_options=options)
            leaves = {p for p, m in model.named_modules() if p and not any(True for _ in m.children())}
            groups = rank_by_growth(report, leaves)
            search(trials, groups, list(keep), max_float)
        best = trials.best()
        best.chosen = True
        if out is not None:  # lowered as the trial that measured it was
            runtime.lower_kept(model, method, samples, calibration, to, best.kept, Path(out), trials.memo)
        if config_out is not None:
            _write_configs(Path(config_out), best.kept, runtime)
    return trials.steps, notes, runtime.quantizer


def _samples(runtime: ProgramPlugin, loaded: Any, args: Any, sampling: SampleOptions, calib: Any
             ) -> tuple[list[tuple], list[tuple]]:
    """The samples (default 8) and the calibration samples (``calib``: a path read as ``export --calib`` reads
    it, or samples; default the samples) as the model's positional arguments, through
    :func:`~layertap.samples.for_reference.samples_for`."""
    n_in = 1 if args is None or as_specs(args) is not None else len(as_args(args))
    if sampling.samples is None and sampling.inputs is None:
        sampling = replace(sampling, samples=8)
    samples = samples_for(loaded, args, sampling, shapes_from=[None] * n_in)
    if any(s.kwargs for s in samples):
        raise LayertapError(f"{runtime.title} programs take positional tensors; give the inputs without names")
    runs = [s.args for s in samples]
    if calib is None:
        return runs, runs
    source = SampleOptions(inputs=calib) if isinstance(calib, (str, os.PathLike)) else SampleOptions(samples=list(calib))
    return runs, [s.args for s in samples_for(loaded, None, source, shapes_from=[None] * len(runs[0]))]


def _write_configs(folder: Path, kept: Sequence[str], runtime: ProgramPlugin) -> None:
    """The kept set: ``modules.json`` (module paths) and the runtime's own recipe for it (its quantizer's filter)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "modules.json", (json.dumps(list(kept), indent=1) + "\n").encode())
    name, recipe = runtime.kept_recipe(kept)
    atomic_write_bytes(folder / name, (json.dumps(recipe, indent=1) + "\n").encode())
