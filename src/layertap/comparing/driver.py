"""The one compare driver: a reference side and a candidate side, sample by sample, in batches.

A *reference* (:class:`Reference`: a hooked PyTorch model, :mod:`.torch_ref`; an ONNX file
in ONNX Runtime, :mod:`.onnx_ref`) plans each sample: the module calls to compare, the
candidate tensors answering them (:class:`~.align.Item`), and contiguous batches of them
(:func:`plan_batches`), each one run of the candidate within the memory budget. The
*candidate* (:class:`Candidate`: :class:`~.onnx_side.OrtSide`) runs a batch's tensors on a
sample's feed. The driver pairs them into rows (:class:`~.align.RowBuilder`), adds each
call's local error (:mod:`.local`), merges the samples (:func:`~.merging.merge_samples`) and
writes the notes (:func:`run_notes`). Another runtime is another side; the driver stays.

Order of runs: a sample whose tensors fit one batch runs at once and its reference values
go; otherwise (or when the reference computes its values per batch) batch ``b`` of every
sample runs before batch ``b + 1``, so each batch's session is built once for all samples.

Overlap (:meth:`Driver._pipeline`): each run of the candidate (with the reference's ONNX run
of the same batch) goes on a worker thread while the caller's thread judges the batch before;
both sides' sessions build at once, beside the weight check. ONNX Runtime and numpy's large
operations let go of the GIL, so over many samples the statistics cost little time of their
own: resnet50 float32 vs float16 over 16 samples went from 1.31-1.43 s to 1.17-1.28 s on two
cores (``benchmarks/bench_compare.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from ..errors import LayertapError, unknown_name
from ..metrics import Criterion
from ..runtimes.ort_kernels import nchwc_block_size
from .align import Item, RowBuilder, blame_rewritten, pack_batches
from .background import Background
from .ideal import fail_differing_weights, weigh_limits
from .local_errors import LocalInputs, local_errors
from .merging import merge_samples
from .nchwc import unblock
from .rows import CompareReport, CompareRow
from .torch_side import ArrayStore
from .weight_check import WeightCheck

#: a first divergence at most this many times over the rule may be ORT's rounding (see :func:`could_be_rounding`)
ROUNDING_EXCESS = 10.0



class Progress(Protocol):
    """What ``compare`` reports its steps to (the CLI passes a terminal progress bar)."""

    def step(self, description: str, total: int = 1) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class Silent:
    """A :class:`Progress` that shows nothing."""

    def step(self, description: str, total: int = 1) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass
class Sample:
    """One sample's plan: items, their row builder (reference values in ``builder.store``),
    batches, the candidate's feed, the rows made so far (one list per batch), and each call run alone at the
    candidate's format (``local_ideal``)."""

    items: list[Item]
    builder: RowBuilder
    batches: list[list[Item]]
    feed: dict[str, np.ndarray]
    ref_feed: dict[str, np.ndarray] | None = None
    rows: list[list[CompareRow]] = field(default_factory=list)
    local_ideal: ArrayStore | None = None  # each call run alone at the candidate's format (local=True, a PyTorch reference)


class Candidate(Protocol):
    """A side that runs a sample exposing chosen tensors (:class:`~.onnx_side.OrtSide`)."""

    blocked: set[str]  # tensors held in a layout of the runtime's own (read back by the reference's shape)

    @property
    def runs(self) -> int: ...

    @property
    def sessions(self) -> int: ...

    def prepare(self, names: list[str]) -> None:
        """Build what a run exposing ``names`` needs (a session), ahead of :meth:`run`."""

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on ``feed`` handing out the tensors ``names``."""

    def local_graph(self, scopes: Any = None) -> Any:
        """Its nodes run call by call on the reference's values (:class:`~.local.LocalGraph`);
        ``scopes``: its ScopeMap, when the reference already read it."""

    def notes(self, label: str | None, rounding: bool) -> list[str]:
        """How it ran, for the report (``label``: next to another run of the same kind)."""

    def describe(self) -> Any:
        """What ran it (:class:`~layertap.runtimes.RuntimeInfo`: runtime, version, device, precision)."""

    def close(self) -> None: ...


class Reference(Protocol):
    """A side whose module calls are the rows: plans samples, hands out its values per batch."""

    n_samples: int
    #: True: a sample's values are computed once and held (in its store) until its batches ran;
    #: False: :meth:`values` computes them per batch
    holds_values: bool
    #: the candidate's ScopeMap the plan read (None: none was read); the report carries it
    cand_scopes: Any

    @property
    def own_runs(self) -> Sequence[Candidate]:
        """The runtime sides the reference runs on itself (their runs and sessions count with the candidate's)."""

    def sample(self, index: int, budget: int) -> Sample:
        """Plan sample ``index`` (a reference that holds its values computes them now, in a
        store of ``budget`` bytes)."""

    def prepare(self, batch: list[Item], parts: Any) -> None:
        """Build what :meth:`values` of ``batch`` runs (a session), ahead of it."""

    def values(self, sample: Sample, batch: list[Item], parts: Any) -> dict[str, np.ndarray]:
        """The reference's tensors of ``batch`` by name (none when they wait in the sample's store);
        ``parts`` (the candidate's local graph, or None) asks also for those feeding its calls."""

    def ideal_values(self, sample: Sample, batch: list[Item]) -> dict[str, np.ndarray]:
        """An ideal run's tensors of ``batch`` by the reference's names (judged at the candidate's
        precision; none without one, or when they wait in the sample's ideal store)."""

    def local_inputs(self, sample: Sample, batch: list[Item], ref_values: dict[str, np.ndarray],
                     cand_values: dict[str, np.ndarray]) -> LocalInputs:
        """For ``local=True``: a row's (reference value, candidate tensor, ideal part's value) triples, a candidate
        tensor's reference value, the candidate tensors whose nodes make a row's call, and the reference's own
        parts at the candidate's format where it runs them per batch (:data:`~.local_errors.Alone`, else ``None``)."""

    def start_weight_check(self) -> None:
        """Start the weight check of the two sides on its worker thread (once; it may have started already)."""

    def checked_weights(self, beside: Callable[[], Any] | None = None) -> WeightCheck:
        """The weight check of the two sides, which may run on a worker thread while ``beside()``
        runs in the caller's; raises :class:`~.weights.DifferentWeightsError` for another checkpoint."""

    def notes(self, candidate: Candidate, rounding: bool) -> list[str]: ...

    def close(self) -> None: ...


def module_filter(modules: Sequence[str] | str | None, known: Sequence[str] | None = None) -> tuple[Callable[[str], bool], bool]:
    """Which module paths to compare: each of ``modules`` selects a module and everything under it.

    Returns the filter and whether the root (``""``) was asked for. ``known`` (the model's
    module paths) turns an unknown name into a :class:`LayertapError` naming close matches.

    Example:
        >>> wanted, root = module_filter(["layer1"])
        >>> wanted("layer1.0.conv1"), wanted("layer10"), root
        (True, False, False)
    """
    if modules is None:
        return (lambda p: True), True
    prefixes = [modules] if isinstance(modules, str) else list(modules)
    if known is not None:
        known_set = set(known)
        for m in prefixes:
            if m not in known_set:
                raise LayertapError(unknown_name("module", m, [k for k in known if k], hint="run 'layertap layers MODEL' to list them"))
    include_root = "" in prefixes

    def wanted(path: str) -> bool:
        return include_root or any(path == p or path.startswith(p + ".") for p in prefixes)

    return wanted, include_root


def plan_batches(items: list[Item], cost: Callable[[Item], tuple[int, int]], max_tensors: int | None,
                 budget: int) -> list[list[Item]]:
    """Contiguous batches of ``items``, each one candidate run: at most ``max_tensors`` tensors and
    ``budget`` bytes by ``cost(item) -> (tensors, bytes)`` (the reference's estimate); a single call
    over the budget gets a run of its own (:func:`~.align.pack_batches`)."""
    return pack_batches(items, cost, max_tensors, budget)


@dataclass
class Job:
    """One candidate run of one batch of one sample, then its rows.

    ``step``: a progress step of this many rows starts with it; ``release``: its sample's
    values go once its rows are made (the sample's last batch, run at once)."""

    sample: Sample
    batch: list[Item]
    step: int = 0
    release: bool = False


class Driver:
    """Runs the candidate for every sample of a reference (see the module doc for the order).

    Each job's runs (the reference's ONNX tensors, the candidate's) go on a worker thread while
    the caller's thread makes the rows of the job before (:meth:`_pipeline`): ONNX Runtime runs
    and numpy's statistics let go of the GIL, so on two cores the statistics cost little time of
    their own. Jobs are planned in the caller's thread between runs (a PyTorch forward never
    shares the cores with a candidate run).
    """

    def __init__(self, reference: Reference, candidate: Candidate, local: bool, progress: Progress | None) -> None:
        self.ref, self.cand, self.local = reference, candidate, local
        self.prog = progress if progress is not None else Silent()
        self.samples: list[Sample] = []
        self.stores: list[ArrayStore] = []
        self.spilled = 0
        self._parts: Any = None  # the candidate's part graphs for local errors, one for all batches
        self._inflight: Background[Any] | None = None
        self._shown: Job | None = None  # the job whose progress step is on screen

    def run(self, memory_budget: int) -> list[list[CompareRow]]:
        """Every sample's rows (each in the reference's call order, rewritten calls blamed)."""
        try:
            if self.local:
                self._parts = self.cand.local_graph(self.ref.cand_scopes)
            self._pipeline(self._jobs(memory_budget), memory_budget)
            for sample in self.samples:
                self._release(sample)
        finally:
            self.close()
        rtol = self.ref_criterion().rtol
        return [weigh_limits(blame_rewritten([r for batch in s.rows for r in batch]), rtol) for s in self.samples]

    def ref_criterion(self) -> Criterion:
        """The rule the rows were judged by (the first sample's builder holds it)."""
        return self.samples[0].builder.criterion if self.samples else Criterion()

    def _jobs(self, memory_budget: int) -> Iterator[Job]:
        """The jobs in run order (see the module doc); samples are planned as the jobs reach them."""
        pending: list[Sample] = []
        for index in range(self.ref.n_samples):
            sample = self.ref.sample(index, max(0, memory_budget - sum(st.held for st in self.stores)))
            self._shown = None  # planning a sample may show steps of its own (a PyTorch forward)
            self.stores.append(sample.builder.store)
            self.stores += [st for st in (sample.builder.ideal, sample.local_ideal) if st is not None]
            self.samples.append(sample)
            if not (self.ref.holds_values and len(sample.batches) <= 1):
                pending.append(sample)
            elif sample.batches:
                yield Job(sample, sample.batches[0], step=len(sample.items), release=True)
            else:
                self._release(sample)
        total = sum(len(s.items) for s in pending)
        for b in range(max((len(s.batches) for s in pending), default=0)):
            for sample in pending:
                if b < len(sample.batches):
                    yield Job(sample, sample.batches[b], step=total)
                    total = 0

    def _pipeline(self, jobs: Iterator[Job], memory_budget: int) -> None:
        """Each job's runs on a worker thread, beside the rows of the job before.

        The next job's runs start only after this one's values arrived (a decode step's feed is
        the run before's cache), and only while they take at most half of ``memory_budget``
        (two jobs' values are held at once); otherwise rows are made before the next runs."""
        done: tuple[Job, Values] | None = None
        for job in jobs:
            if done is not None and done[1].nbytes * 2 > memory_budget:
                self._judge(*done)
                done = None
            if done is None:
                self._show(job)  # nothing to judge meanwhile: the step is this job's runs
            self._inflight = Background(functools.partial(self._fetch, job), name="layertap-compare-runs")
            if done is not None:
                self._judge(*done)
            values = self._inflight.result()
            self._inflight = None
            done = (job, values)
        if done is not None:
            self._judge(*done)

    def _fetch(self, job: Job) -> Values:
        """A job's runs: the reference's values (none when they wait in the sample's store), the candidate's.

        The two sides' sessions build at once (each build is one thread's work), beside the
        weight check, and run after both are built (a run takes every core); another checkpoint
        is refused before the candidate runs."""
        sample, batch = job.sample, job.batch
        names = list(dict.fromkeys(n for it in batch for n in it.tensors))
        self.ref.start_weight_check()
        built = Background(lambda: self.cand.prepare(names), name="layertap-session-build") if names else None
        try:
            self.ref.prepare(batch, self._parts)
        finally:
            if built is not None:
                built.wait()  # a failed reference build leaves no build behind
        self.ref.checked_weights(beside=built.result if built is not None else None)
        ref_values = self.ref.values(sample, batch, self._parts)
        values = self.cand.run(names, sample.feed) if names else {}
        ideal = self.ref.ideal_values(sample, batch)  # an ideal run may go on beside the two runs above
        if self.cand.blocked and ref_values:
            unblock_values(values, batch, ref_values, self.cand.blocked)
        return Values(ref_values, values, ideal)

    def _judge(self, job: Job, fetched: Values) -> None:
        """A job's rows (and local errors), in the caller's thread."""
        sample, batch = job.sample, job.batch
        ref_values, values = fetched.ref, fetched.cand
        self._show(job)
        rows = self._rows(sample, batch, fetched)
        if self.local:
            pairs_of, ref_of, tensors_of, alone = self.ref.local_inputs(sample, batch, ref_values, values)
            local_errors(self._parts, batch, rows, pairs_of, ref_of, tensors_of, sample.builder.criterion,
                         sample.builder.judging, alone)
        sample.rows.append(rows)
        if job.release:
            self._release(sample)

    def _show(self, job: Job) -> None:
        """Start the job's progress step, unless it is on screen already."""
        if job.step and self._shown is not job:
            self.prog.step(f"{self.cand.describe().runtime} and compare", total=job.step)
            self._shown = job

    def _rows(self, sample: Sample, batch: list[Item], fetched: Values) -> list[CompareRow]:
        """Rows of a batch; reference values computed for it stay in the store only for their own row."""
        store, ideal, streamed = sample.builder.store, sample.builder.ideal, not self.ref.holds_values
        rows = []
        for it in batch:
            if streamed and it.status is None:
                store.put(it.mc.key, [fetched.ref[t] for t in it.ref_tensors])
                if ideal is not None and all(t in fetched.ideal for t in it.ref_tensors):
                    ideal.put(it.mc.key, [fetched.ideal[t] for t in it.ref_tensors])
            rows.append(sample.builder.row(it, fetched.cand))
            if streamed:
                store.drop(it.mc.key)
                if ideal is not None and ideal.has(it.mc.key):
                    ideal.drop(it.mc.key)
            self.prog.advance()
        sample.builder.forget_values()
        return rows

    def _release(self, sample: Sample) -> None:
        for store in (sample.builder.store, sample.builder.ideal, sample.local_ideal):
            if store is None:
                continue
            self.spilled = max(self.spilled, store.spilled)
            store.close()
            if store in self.stores:
                self.stores.remove(store)

    def close(self) -> None:
        try:
            if self._inflight is not None:
                self._inflight.wait()  # its runs use the sessions closed below
                self._inflight = None
        finally:  # a second interrupt while waiting still removes the values held on disk
            for store in self.stores:
                self.spilled = max(self.spilled, store.spilled)
                store.close()
            self.stores.clear()
            self.ref.close()
            self.cand.close()


@dataclass
class Values:
    """One job's values: the reference's, the candidate's and an ideal run's, by tensor name."""

    ref: dict[str, np.ndarray]
    cand: dict[str, np.ndarray]
    ideal: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(getattr(a, "nbytes", 0) for values in (self.ref, self.cand, self.ideal) for a in values.values())


def unblock_values(values: dict[str, np.ndarray], batch: list[Item], ref_values: dict[str, np.ndarray],
                   blocked: set[str]) -> None:
    """Candidate tensors in ORT's NCHWc layout, in place as NCHW shaped like the reference tensor they answer."""
    block = nchwc_block_size() or 0
    done: set[str] = set()
    for it in batch:
        for r, c in zip(it.ref_tensors, it.tensors):
            if c in blocked and c not in done and c in values and r in ref_values:
                values[c] = unblock(values[c], ref_values[r].shape, block)
                done.add(c)


def compare_sides(ref: Reference, cand: Candidate, *, criterion: Criterion,
                  local: bool, memory_budget: int, progress: Progress | None, judging: Any = None, **fields: Any) -> CompareReport:
    """Run the two sides (:class:`Driver`) and make the report; ``fields`` go to :class:`CompareReport`."""
    driver = Driver(ref, cand, local, progress)
    # a reference whose samples are steps of one run (decode steps) keeps every sample's rows
    merge = getattr(ref, "merge_rows", merge_samples)
    rows, firsts = merge(driver.run(memory_budget), criterion)
    weights = ref.checked_weights()
    first = next((r for r in rows if r.ok is False), None)
    weights.annotate(rows)
    if judging is not None and judging.decides:
        fail_differing_weights(rows, judging.precision)
    notes = run_notes(ref, cand, driver.spilled, rounding=judging is None and could_be_rounding(first, criterion))
    lost = judging.lost_note() if judging is not None else None
    notes += [lost] if lost else []
    return CompareReport(
        rows, weights.notes() + notes, criterion=criterion, ort_runs=sum(side.runs for side in (cand, *ref.own_runs)),
        judging=judging,
        samples=1 if merge is not merge_samples else ref.n_samples, first_divergence_counts=firsts, local=local, weights=weights,
        scope_map=ref.cand_scopes, **fields,
    )


def run_notes(reference: Reference, candidate: Candidate, spilled: int, *, rounding: bool) -> list[str]:
    """What the reader needs to know to trust (or doubt) the rows: each side's own notes, then
    how the runs went (batches, values on disk, samples).

    The ORT fusion caveat only matters to explain a failing row whose error could be rounding.
    """
    n = reference.n_samples
    notes = reference.notes(candidate, rounding)
    runtime = candidate.describe().runtime
    if candidate.runs > n:
        notes.append(f"{runtime} ran {candidate.runs} times, exposing the intermediates in batches to bound memory")
    if spilled:
        size = f"{spilled / 2**20:.0f} MiB" if spilled >= 2**20 else f"{spilled / 2**10:.0f} KiB"
        notes.append(f"{size} of reference values were held on disk (memory_budget)")
    if n > 1 and not hasattr(reference, "merge_rows"):
        notes.append(f"{n} samples; each row shows its worst sample (worst_sample); "
                     f"{sum(side.sessions for side in (candidate, *reference.own_runs))} "
                     f"{'ORT ' if runtime == 'ONNX Runtime' else ''}session(s) for all of them")
    return notes


def could_be_rounding(first: CompareRow | None, criterion: Criterion) -> bool:
    """Whether the first divergence is small enough to be ORT's rounding: its error at most
    :data:`ROUNDING_EXCESS` (10) times what the rule allows (:meth:`Criterion.excess`), with
    finite candidate values. A fused kernel or an unfused pair of float32 nodes differ by a few
    float32 roundings, which an accumulated chain can lift past a tight tolerance by a small
    factor, never by orders of magnitude; a larger error is a real difference in the file.

    Example:
        >>> row = CompareRow("fc", "fc", 0, "Linear", [1], 0.002, 0.002, "FAIL", False, ref_max=1.0)
        >>> could_be_rounding(row, Criterion()), could_be_rounding(None, Criterion())
        (True, False)
        >>> could_be_rounding(CompareRow("fc", "fc", 0, "Linear", [1], 0.1, 0.1, "FAIL", False, ref_max=1.0), Criterion())
        False
    """
    if first is None or first.finite is False:
        return False
    return criterion.excess(first.max_abs, first.ref_max, first.cosine, first.sqnr_db) <= ROUNDING_EXCESS
