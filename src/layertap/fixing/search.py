"""The search of ``layertap fix``: which modules to keep in float32 so a conversion meets its target.

Rank the modules of the plain conversion's comparison (values outside float16's range first,
then the error each module makes by itself, ``local_rel``), keep ranked groups in float32 (1,
1, 2, 4, ... groups at a time) until the target holds, then drop every kept module whose
removal still meets it, so the set is minimal. A trial the converter or ONNX Runtime refuses is a
failed step (logged, never chosen), not the end of the search. Every set is converted and run for real
(:class:`Trials`); nothing is estimated. The units are module paths, or the ONNX nodes of a file
without module scopes (:mod:`.units`); "module" below stands for either. Never imports torch.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

import numpy as np

from ..errors import LayertapError, one_line
from ..onnxfile.tensor_types import constant_tensor
from ..runtimes import open_runtime
from .configs import Target
from .convert import Converter
from .units import Units

if TYPE_CHECKING:  # pragma: no cover
    import onnx

FP16_MAX = 65504.0
LATENCY_RUNS = 5
# pruning tries each kept module alone only for a small set: one conversion each, and a set found by
# pruning that large rarely has a single member that does the work by itself
ALONE_TRIES = 8
# the relative error rounding a value to the format makes (half a step of 8-bit levels over the value's
# range; float16's unit roundoff): the error a model's input enters with, so the first compared row's growth
# is measured as every other row's is, not against nothing
INPUT_ROUNDING = {"fp16": 2.0**-11, "int8": 1 / 255}


@dataclass
class FixStep:
    """One set of modules kept in float32, converted and run: the output metric over every
    sample, whether it meets the target, the file's size and its ONNX Runtime latency."""

    step: int
    action: str  # plain, keep (--keep), add, drop (a pruning try), alone (one kept), naive
    changed: list[str]
    kept: list[str]
    nodes: int
    metric: float
    ok: bool
    size: int | None
    latency_ms: float
    chosen: bool = False  # the set FIXED.onnx holds
    error: str | None = None  # the conversion failed, or ONNX Runtime refused its file: this step was not measured

    @property
    def n_kept(self) -> int:
        return len(self.kept)

    @property
    def verdict(self) -> str:
        """``met``, ``-`` (measured, not met) or ``failed`` (not measured: see ``error``)."""
        return "failed" if self.error else "met" if self.ok else "-"


def constants_beyond(model: "onnx.ModelProto", modules: Units) -> set[str]:
    """The units that read a constant holding a finite value beyond float16's range (an initializer or a
    ``Constant``, directly or through the nodes computing on it): the converter clamps it, whatever the
    comparison of the plain conversion shows (a paddle2onnx BatchNormalization's variance of 9.8e7).
    Values of 1e30 and more stand for infinity (masks) and are left out.

    Example:
        >>> import numpy as np, onnx.helper as h, onnx.numpy_helper as nh
        >>> from .units import NodeUnits
        >>> g = h.make_graph([h.make_node("Constant", [], ["v"], name="c", value=nh.from_array(np.array([9.8e7], np.float32))),
        ...                   h.make_node("Div", ["x", "v"], ["y"], name="div")], "g",
        ...                  [h.make_tensor_value_info("x", 1, [1])], [h.make_tensor_value_info("y", 1, [1])])
        >>> m = h.make_model(g)
        >>> constants_beyond(m, NodeUnits(m))
        {'div'}
    """
    from onnx import numpy_helper

    values: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type in (1, 11)}
    for node in model.graph.node:
        tensor = constant_tensor(node)
        if tensor is not None and tensor.data_type in (1, 11):
            values[node.output[0]] = numpy_helper.to_array(tensor)

    def beyond(a: np.ndarray) -> bool:
        mag = np.abs(a[np.isfinite(a)]) if a.size else a
        return bool(np.any((mag > FP16_MAX) & (mag < 1e30)))

    over = {t for t, a in values.items() if beyond(np.asarray(a))}
    return {p for p in modules.modules() if modules.constants_read(p) & over} if over else set()


def _scores(report: Any, to: str, modules: Units, constants: Collection[str] = ()) -> dict[str, tuple[bool, float, float]]:
    """Innermost compared unit -> (values its format cannot carry: outside float16's range, or a limit the
    comparison named; how much the format's own error grows there; its worst error: ``local_rel``, else
    the row's ``rel_err``). The growth is the row's format error (an ideal run at the format against the
    reference) over the largest one of the rows compared before it: what keeping it in float32 can repair."""
    score: dict[str, tuple[bool, float, float]] = {}
    before = INPUT_ROUNDING.get(to, 0.0)  # the largest format error of the rows so far
    for r in report.rows:
        unit = modules.unit_of(r.path) if r.path and r.ok is not None else None
        fmt = getattr(r, "format_rel", None)
        gain = 0.0 if fmt is None else fmt / max(before, 1e-9)
        if fmt is not None and r.ok is not None:
            before = max(before, fmt)
        if unit is None:
            continue
        out = (to == "fp16" and (r.finite is False or (r.ref_max or 0.0) > FP16_MAX or unit in constants)) \
            or bool(getattr(r, "limit", None))
        err = _own_error(r)
        err = math.inf if err is None or math.isnan(err) else err
        old = score.get(unit, (False, 0.0, 0.0))
        score[unit] = (old[0] or out, max(old[1], gain), max(old[2], err))
    return {p: score[p] for p in modules.innermost(score)}


def _own_error(row: Any) -> float:
    """The error a unit makes by itself: its local split (what the format costs it alone and what the file adds
    there, together), else ``local_rel``, else the row's ``rel_err``."""
    fmt, impl = getattr(row, "local_format_rel", None), getattr(row, "local_impl_rel", None)
    if fmt is not None and impl is not None:
        return fmt + impl
    return row.local_rel if row.local_rel is not None else (row.rel_err or 0.0)


def out_of_range(report: Any, to: str, modules: Units, constants: Collection[str] = ()) -> list[str]:
    """The modules a float16 search keeps from its first set: those whose reference values leave
    float16's range (or are not finite in the candidate), with the modules that read them, so the
    values are not cast to float16 in between. (ONNX Runtime's CPU provider computes many float16
    operators in float32 and drops the casts between them, so an overflow there can stay hidden in
    the outputs.) :func:`beyond_range` names those every set keeps; the search prunes the others.
    ``constants``: the units that read a constant beyond float16's range (:func:`constants_beyond`)."""
    score = _scores(report, to, modules, constants)
    found = [p for p in sorted(score, key=lambda p: modules.order[p]) if score[p][0]]
    return list(dict.fromkeys(m for p in found for m in [p, *modules.readers(p)]))


def beyond_range(report: Any, to: str, modules: Units, constants: Collection[str] = ()) -> list[str]:
    """The modules of :func:`out_of_range` whose own reference values, or the constants they read, leave
    float16's range: every acceptable float16 set keeps them, since float16 cannot hold those values
    whatever the runtime does. Their readers, and the modules whose values are only not finite in the
    candidate (after an overflow), are kept from the start and pruned like the others: real runs decide those."""
    if to != "fp16":
        return []
    leaves = _scores(report, to, modules, constants)
    units = ((modules.unit_of(r.path) if r.path else None, r) for r in report.rows)
    beyond = {u for u, r in units if u in leaves and (r.ref_max or 0.0) > FP16_MAX} | set(constants)
    return sorted(beyond, key=lambda p: modules.order[p])


def rank(report: Any, to: str, modules: Units, constants: Collection[str] = ()) -> list[list[str]]:
    """Groups of modules to keep, most harmful first: a module whose values leave float16's range or
    that the format cannot carry (with its readers), then by ``local_rel`` (else the row's error), then
    by how much the format's own error grows there (a comparison judged at the candidate's precision
    carries it); for int8 each module comes with the modules that write its
    inputs. Only the innermost modules compared are ranked, and those that read a constant beyond float16's
    range (``constants``)."""
    score = _scores(report, to, modules, constants)
    for p in constants:  # a unit the comparison has no row of can still read such a constant
        score.setdefault(p, (True, 0.0, math.inf))
    # the error a unit makes by itself leads, the growth of the format's own error breaks ties (a PReLU's
    # local error is 0): in the other order the first rows always lead (all their format error is their
    # own) and sets came out larger (benchmarks/bench_fix.py --trained, 18 searches on trained models:
    # 41 units kept in 215 conversions, against 46 in 245)
    leaves = sorted(score, key=lambda p: (not score[p][0], -score[p][2], -score[p][1], modules.order[p]))
    # every unit is a candidate: those no compared row stands for (a model input's readers) come last
    leaves += [p for p in modules.innermost(modules.modules()) if p not in score]
    if to == "int8":  # QDQ rounds a tensor between its producer and its reader: keep both sides of it
        return [list(dict.fromkeys([p, *modules.writers(p)])) for p in leaves]
    return [list(dict.fromkeys([p] + (modules.readers(p) if score.get(p, (False,))[0] else []))) for p in leaves]


def rank_by_growth(report: Any, modules: set[str]) -> list[list[str]]:
    """Groups of modules to keep float32, most harmful first, from a comparison of a plain conversion with the
    model: each compared module of ``modules`` by how much its row's error grows over the row before (what it
    adds), with the calls folded into it (a Conv absorbed into its BatchNorm).

    Example:
        >>> from types import SimpleNamespace as R
        >>> rows = [R(path="a", status="absorbed", fused_into="b", rel_err=None),
        ...         R(path="b", status="pass", fused_into=None, rel_err=0.01),
        ...         R(path="c", status="pass", fused_into=None, rel_err=0.2)]
        >>> rank_by_growth(R(rows=rows), {"a", "b", "c"})
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


class StepLog:
    """The sets tried so far, each made and measured once, and who hears of each step: what every trial
    runner shares (:class:`Trials`: ONNX files in ONNX Runtime; ExecuTorch programs,
    :class:`~layertap.fixing.program_fix.ProgramTrials`). A runner says how a set is made and measured
    (:meth:`_measure`) and how many units it counts (:meth:`_units`)."""

    def __init__(self, target: Target, on_step: Callable[[FixStep], None] | None = None) -> None:
        self.target, self.on_step = target, on_step
        self.steps: list[FixStep] = []
        self.files: dict[int, Path] = {}
        self._seen: dict[frozenset, FixStep] = {}

    def trial(self, kept: Sequence[str], action: str, changed: Sequence[str] = ()) -> FixStep:
        """Make the set with ``kept`` in float32, run every sample, measure; a set tried before is not redone.
        A set the toolchain cannot make is a failed step, except the first: then it cannot take the model at all."""
        key = frozenset(kept)
        if key in self._seen:
            return self._seen[key]
        n = len(self.steps)
        try:
            step = self._measure(n, kept, action, changed)
        except LayertapError as e:
            if not self.steps:
                raise
            step = FixStep(n, action, list(changed), list(kept), self._units(kept), math.nan, False, None, math.nan,
                           error=str(e))
        self.steps.append(step)
        self._seen[key] = step
        if self.on_step is not None:
            self.on_step(step)
        return step

    def best(self) -> FixStep:
        """The set the output gets: the smallest one that meets the target, else the closest one."""
        return best_step(self.steps, self.target)

    def _measure(self, n: int, kept: Sequence[str], action: str, changed: Sequence[str]) -> FixStep:
        """Step ``n``: the set made and measured (its file in :attr:`files`); raises :class:`LayertapError`
        when the toolchain cannot make or run it."""
        raise NotImplementedError

    def _units(self, kept: Sequence[str]) -> int:
        """What a set of ``kept`` modules counts (:attr:`FixStep.nodes`)."""
        return len(kept)


class Trials(StepLog):
    """Converts and runs sets of kept modules; remembers each step and the best file.

    ``feeds``: one dict per sample (input name -> array); the float32 model's outputs on them
    are the reference. Files live in ``folder`` (a temporary folder the caller removes).
    """

    def __init__(self, model: "onnx.ModelProto", converter: Converter, modules: Units, feeds: list[dict[str, Any]],
                 target: Target, folder: Path, on_step: Callable[[FixStep], None] | None = None,
                 runtime: Any = None) -> None:
        super().__init__(target, on_step)
        self.model, self.converter, self.modules, self.feeds = model, converter, modules, feeds
        #: what runs every file (a :class:`~layertap.runtimes.Runtime`; default ONNX Runtime)
        self.runtime = runtime if runtime is not None else open_runtime()
        self.folder = Path(folder)
        self.required: set[str] = set()  # modules every acceptable set keeps (values beyond float16's range)
        # saved once under a name of its own: the caller's files share the folder (an exported REF is
        # its reference.onnx)
        import onnx

        self.float32 = self.folder / "float32.onnx"
        onnx.save(model, str(self.float32))
        self.refs = _run_all(self._session(self.float32), feeds)

    def baseline(self) -> FixStep:
        """The float32 model itself, run as the steps are (size and latency to compare with)."""
        path = self.float32
        ms = run_latency(self._session(path), self.feeds[0])
        return FixStep(0, "float32", [], [], 0, self.target.measure(self.refs, self.refs), True, path.stat().st_size, ms)

    def trial(self, kept: Sequence[str], action: str, changed: Sequence[str] = ()) -> FixStep:
        """:meth:`StepLog.trial`, then only the best file so far and the newest stay on disk."""
        step = super().trial(kept, action, changed)
        self._drop_files()
        return step

    def _measure(self, n: int, kept: Sequence[str], action: str, changed: Sequence[str]) -> FixStep:
        nodes = self.modules.names(kept)
        path = self.folder / f"step{n}.onnx"
        try:
            self.converter.convert(self.model, nodes, path)
            sess = self._load(path)
        except LayertapError:
            path.unlink(missing_ok=True)
            raise
        metric = self.target.measure(self.refs, _run_all(sess, self.feeds))
        self.files[n] = path
        return FixStep(n, action, list(changed), list(kept), len(nodes), metric, self._ok(metric, kept),
                       path.stat().st_size, run_latency(sess, self.feeds[0]))

    def _units(self, kept: Sequence[str]) -> int:
        return len(self.modules.names(kept))

    def _session(self, path: Path) -> Any:
        """An engine on a file as the runtime runs it by default (its latency is measured)."""
        return self.runtime.open_file(path, timing=True)

    def _load(self, path: Path) -> Any:
        """A session on a converted file; one the runtime refuses is the converter's failure (one line)."""
        try:
            return self._session(path)
        except Exception as e:  # noqa: BLE001 - a runtime raises its own exception types
            raise LayertapError(f"{self.converter.tool} made a file {self.runtime.describe().runtime} cannot load: "
                                f"{one_line(e)}") from None

    def require(self, paths: Sequence[str]) -> None:
        """Every acceptable set keeps ``paths``: steps without them do not meet the target."""
        self.required = set(paths)
        for s in self.steps:
            s.ok = self._ok(s.metric, s.kept)

    def _ok(self, metric: float, kept: Sequence[str]) -> bool:
        return self.target.met(metric) and self.required <= set(kept)

    def _drop_files(self) -> None:
        """Keep only the best file so far (disk stays at two converted models)."""
        keep = self.best().step
        for n in [n for n in self.files if n != keep and n != len(self.steps) - 1]:
            self.files.pop(n).unlink(missing_ok=True)


def best_step(steps: Sequence[FixStep], target: Target) -> FixStep:
    """The smallest set that meets the target (fewest units, then nodes), else the closest one measured.

    Example:
        >>> a = FixStep(0, "plain", [], [], 0, 0.98, False, None, 1.0)
        >>> b = FixStep(1, "add", ["fc"], ["fc"], 1, 0.9995, True, None, 1.0)
        >>> best_step([a, b], Target.parse("cosine:0.999")).step
        1
    """
    met = [s for s in steps if s.ok]
    if met:
        return min(met, key=lambda s: (s.n_kept, s.nodes, s.step))
    ran = [s for s in steps if s.error is None] or list(steps)
    best = ran[0]
    for s in ran[1:]:
        if target.better(s.metric, best.metric):
            best = s
    return best


def search(trials: StepLog, groups: list[list[str]], forced: Sequence[str], max_float: int | None,
           naive: bool = False, start: Sequence[str] = ()) -> FixStep:
    """Grow then prune (see the module doc); ``naive``: one module at a time in graph order, no
    ranking and no pruning (what the ranking is measured against). ``forced`` are in every set;
    ``start`` are kept from the first set on, then pruned like the modules the search adds.
    The groups hold every unit (:func:`rank`), so when they run out the last set tried keeps them all:
    "no set meets the target" is a fact, not the end of a partial list.
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


def _prune(trials: StepLog, kept: list[str], forced: Sequence[str]) -> FixStep:
    """Drop each kept module (least harmful first) whose removal still meets the target; then, where more
    than one is left (and at most ``ALONE_TRIES``), try each alone (with the forced ones): keeping some modules in float32 can make the
    quantisation of their neighbours worse, so a smaller set than the one pruning reaches may meet it."""
    for m in reversed(list(kept)):
        if m in forced or m not in kept:
            continue
        rest = [k for k in kept if k != m]
        if trials.trial(rest, "drop", [m]).ok:
            kept = rest
    chosen = [k for k in kept if k not in forced]
    if 1 < len(chosen) <= ALONE_TRIES:
        for m in chosen:
            trials.trial([*forced, m], "alone", [m])
    return trials.best()


def graph_order(modules: Units, groups: list[list[str]]) -> list[list[str]]:
    """The ranked modules, one at a time in graph order (the naive search's order)."""
    flat = {m for g in groups for m in g}
    return [[m] for m in sorted(flat, key=lambda p: modules.order[p])]


def _run_all(sess: Any, feeds: list[dict[str, Any]]) -> list[list[np.ndarray]]:
    return [[np.asarray(o) for o in sess.run(None, f).values()] for f in feeds]


def run_latency(sess: Any, feed: dict[str, Any]) -> float:
    """Median milliseconds of one run of an engine (ONNX Runtime, ExecuTorch) on the first sample (after one warm-up run)."""
    sess.run(None, feed)
    times = []
    for _ in range(LATENCY_RUNS):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
