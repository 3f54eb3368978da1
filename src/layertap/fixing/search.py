"""The search of ``layertap fix``: which modules to keep in float32 so a conversion meets its target.

Rank the modules of the plain conversion's comparison (values outside float16's range first,
then the error each module makes by itself, ``local_rel``), keep ranked groups in float32 (1,
1, 2, 4, ... groups at a time) until the target holds, then drop every kept module whose
removal still meets it, so the set is minimal. Every set is converted and run for real
(:class:`Trials`); nothing is estimated. The units are module paths, or the ONNX nodes of a file
without module scopes (:mod:`.units`); "module" below stands for either. Never imports torch.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import LayertapError, one_line
from .configs import Target
from .convert import Converter
from .units import Units

if TYPE_CHECKING:  # pragma: no cover
    import onnx

FP16_MAX = 65504.0
LATENCY_RUNS = 5


@dataclass
class FixStep:
    """One set of modules kept in float32, converted and run: the output metric over every
    sample, whether it meets the target, the file's size and its ONNX Runtime latency."""

    step: int
    action: str  # plain, keep (--keep), add, drop (a pruning try), naive
    changed: list[str]
    kept: list[str]
    nodes: int
    metric: float
    ok: bool
    size: int
    latency_ms: float
    chosen: bool = False  # the set FIXED.onnx holds

    @property
    def n_kept(self) -> int:
        return len(self.kept)


def _scores(report: Any, to: str, modules: Units) -> dict[str, tuple[bool, float, float]]:
    """Innermost compared unit -> (values its format cannot carry: outside float16's range, or a limit the
    comparison named; how much the format's own error grows there; its worst error: ``local_rel``, else
    the row's ``rel_err``). The growth is the row's format error (an ideal run at the format against the
    reference) over the largest one of the rows compared before it: what keeping it in float32 can repair."""
    score: dict[str, tuple[bool, float, float]] = {}
    before = 0.0  # the largest format error of the rows so far
    for r in report.rows:
        unit = modules.unit_of(r.path) if r.path and r.ok is not None else None
        fmt = getattr(r, "format_rel", None)
        gain = 0.0 if fmt is None else (fmt / before if before > 0 else (math.inf if fmt > 0 else 0.0))
        if fmt is not None and r.ok is not None:
            before = max(before, fmt)
        if unit is None:
            continue
        out = (to == "fp16" and (r.finite is False or (r.ref_max or 0.0) > FP16_MAX)) or bool(getattr(r, "limit", None))
        err = r.local_rel if r.local_rel is not None else (r.rel_err or 0.0)
        err = math.inf if err is None or math.isnan(err) else err
        old = score.get(unit, (False, 0.0, 0.0))
        score[unit] = (old[0] or out, max(old[1], gain if math.isfinite(gain) else 0.0), max(old[2], err))
    return {p: score[p] for p in modules.innermost(score)}


def out_of_range(report: Any, to: str, modules: Units) -> list[str]:
    """The modules a float16 search keeps from its first set: those whose reference values leave
    float16's range (or are not finite in the candidate), with the modules that read them, so the
    values are not cast to float16 in between. (ONNX Runtime's CPU provider computes many float16
    operators in float32 and drops the casts between them, so an overflow there can stay hidden in
    the outputs.) :func:`beyond_range` names those every set keeps; the search prunes the others."""
    score = _scores(report, to, modules)
    found = [p for p in sorted(score, key=lambda p: modules.order[p]) if score[p][0]]
    return list(dict.fromkeys(m for p in found for m in [p, *modules.readers(p)]))


def beyond_range(report: Any, to: str, modules: Units) -> list[str]:
    """The modules of :func:`out_of_range` whose own reference values leave float16's range: every
    acceptable float16 set keeps them, since float16 cannot hold those values whatever the runtime
    does. Their readers, and the modules whose values are only not finite in the candidate (after
    an overflow), are kept from the start and pruned like the others: real runs decide those."""
    if to != "fp16":
        return []
    leaves = _scores(report, to, modules)
    units = ((modules.unit_of(r.path) if r.path else None, r) for r in report.rows)
    beyond = {u for u, r in units if u in leaves and (r.ref_max or 0.0) > FP16_MAX}
    return sorted(beyond, key=lambda p: modules.order[p])


def rank(report: Any, to: str, modules: Units) -> list[list[str]]:
    """Groups of modules to keep, most harmful first: a module whose values leave float16's range or
    that the format cannot carry (with its readers), then by how much the format's own error grows
    there (what float32 can repair; a comparison judged at the candidate's precision carries it), then by
    ``local_rel`` (else the row's error); for int8 each module comes with the modules that write its
    inputs. Only the innermost modules compared are ranked."""
    score = _scores(report, to, modules)
    leaves = sorted(score, key=lambda p: (not score[p][0], -round(score[p][1], 1), -score[p][2], modules.order[p]))
    if to == "int8":  # QDQ rounds a tensor between its producer and its reader: keep both sides of it
        return [list(dict.fromkeys([p, *modules.writers(p)])) for p in leaves]
    return [list(dict.fromkeys([p] + (modules.readers(p) if score[p][0] else []))) for p in leaves]


class Trials:
    """Converts and runs sets of kept modules; remembers each step and the best file.

    ``feeds``: one dict per sample (input name -> array); the float32 model's outputs on them
    are the reference. Files live in ``folder`` (a temporary folder the caller removes).
    """

    def __init__(self, model: "onnx.ModelProto", converter: Converter, modules: Units, feeds: list[dict[str, Any]],
                 target: Target, folder: Path, on_step: Callable[[FixStep], None] | None = None) -> None:
        self.model, self.converter, self.modules, self.feeds = model, converter, modules, feeds
        self.target, self.folder, self.on_step = target, Path(folder), on_step
        self.steps: list[FixStep] = []
        self.required: set[str] = set()  # modules every acceptable set keeps (values beyond float16's range)
        self.files: dict[int, Path] = {}
        self._seen: dict[frozenset, FixStep] = {}
        # saved once under a name of its own: the caller's files share the folder (an exported REF is
        # its reference.onnx)
        import onnx

        self.float32 = self.folder / "float32.onnx"
        onnx.save(model, str(self.float32))
        self.refs = _run_all(_session(self.float32), feeds)

    def baseline(self) -> FixStep:
        """The float32 model itself, run as the steps are (size and latency to compare with)."""
        path = self.float32
        ms = _latency(_session(path), self.feeds[0])
        return FixStep(0, "float32", [], [], 0, self.target.measure(self.refs, self.refs), True, path.stat().st_size, ms)

    def trial(self, kept: Sequence[str], action: str, changed: Sequence[str] = ()) -> FixStep:
        """Convert with ``kept`` in float32, run every sample, measure; a set tried before is not redone."""
        key = frozenset(kept)
        if key in self._seen:
            return self._seen[key]
        nodes = self.modules.names(kept)
        n = len(self.steps)
        path = self.converter.convert(self.model, nodes, self.folder / f"step{n}.onnx")
        sess = self._load(path)
        metric = self.target.measure(self.refs, _run_all(sess, self.feeds))
        step = FixStep(n, action, list(changed), list(kept), len(nodes), metric, self._ok(metric, kept),
                       path.stat().st_size, _latency(sess, self.feeds[0]))
        self.steps.append(step)
        self._seen[key] = step
        self.files[n] = path
        self._drop_files()
        if self.on_step is not None:
            self.on_step(step)
        return step

    def _load(self, path: Path) -> Any:
        """A session on a converted file; one ONNX Runtime refuses is the converter's failure (one line)."""
        try:
            return _session(path)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            raise LayertapError(f"{self.converter.tool} made a file ONNX Runtime cannot load: {one_line(e)}") from None

    def require(self, paths: Sequence[str]) -> None:
        """Every acceptable set keeps ``paths``: steps without them do not meet the target."""
        self.required = set(paths)
        for s in self.steps:
            s.ok = self._ok(s.metric, s.kept)

    def _ok(self, metric: float, kept: Sequence[str]) -> bool:
        return self.target.met(metric) and self.required <= set(kept)

    def best(self) -> FixStep:
        """The set FIXED.onnx gets: the smallest one that meets the target, else the closest one."""
        met = [s for s in self.steps if s.ok]
        if met:
            return min(met, key=lambda s: (s.n_kept, s.nodes, s.step))
        best = self.steps[0]
        for s in self.steps[1:]:
            if self.target.better(s.metric, best.metric):
                best = s
        return best

    def _drop_files(self) -> None:
        """Keep only the best file so far (disk stays at two converted models)."""
        keep = self.best().step
        for n in [n for n in self.files if n != keep and n != len(self.steps) - 1]:
            self.files.pop(n).unlink(missing_ok=True)


def search(trials: Trials, groups: list[list[str]], forced: Sequence[str], max_float: int | None,
           naive: bool = False, start: Sequence[str] = ()) -> FixStep:
    """Grow then prune (see the module doc); ``naive``: one module at a time in graph order, no
    ranking and no pruning (what the ranking is measured against). ``forced`` are in every set;
    ``start`` are kept from the first set on, then pruned like the modules the search adds.
    Returns the best step."""
    forced = list(forced)
    kept = list(dict.fromkeys([*forced, *start]))
    first = trials.trial(kept, "keep" if kept else "plain", kept)  # a set tried before is not redone
    if first.ok:
        return trials.best() if naive or kept == forced else _prune(trials, kept, forced)
    limit = max_float if max_float is not None else math.inf
    size, i = 1, 0
    while i < len(groups) and len(kept) < limit:
        take = groups[i:i + (1 if naive else size)]
        i += len(take)
        # a module two groups share (an int8 writer of two ranked modules) is added once
        added = list(dict.fromkeys(m for g in take for m in g if m not in kept))[: int(min(limit - len(kept), 1e9))]
        if not added:
            continue
        kept += added
        if trials.trial(kept, "naive" if naive else "add", added).ok:
            break
        size = size if naive or i < 2 else size * 2
    if naive or not trials.best().ok:
        return trials.best()
    return _prune(trials, trials.best().kept, forced)


def _prune(trials: Trials, kept: list[str], forced: Sequence[str]) -> FixStep:
    """Drop each kept module (least harmful first) whose removal still meets the target."""
    for m in reversed(list(kept)):
        if m in forced or m not in kept:
            continue
        rest = [k for k in kept if k != m]
        if trials.trial(rest, "drop", [m]).ok:
            kept = rest
    return trials.best()


def graph_order(modules: Units, groups: list[list[str]]) -> list[list[str]]:
    """The ranked modules, one at a time in graph order (the naive search's order)."""
    flat = {m for g in groups for m in g}
    return [[m] for m in sorted(flat, key=lambda p: modules.order[p])]


def _session(path: Path) -> Any:
    import onnxruntime as ort

    from ..onnxfile.ort import open_session

    def options() -> Any:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        return opts

    return open_session(os.fspath(path), options)


def _run_all(sess: Any, feeds: list[dict[str, Any]]) -> list[list[np.ndarray]]:
    return [[np.asarray(o) for o in sess.run(None, f)] for f in feeds]


def _latency(sess: Any, feed: dict[str, Any]) -> float:
    """Median milliseconds of one ONNX Runtime run on the first sample (after one warm-up run)."""
    sess.run(None, feed)
    times = []
    for _ in range(LATENCY_RUNS):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
