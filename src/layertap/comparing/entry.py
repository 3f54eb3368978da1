"""``lt.compare``: PyTorch vs ONNX Runtime, module by module.

The PyTorch model runs once with hooks on every module; each module call's
output is moved to numpy as soon as the call returns. The ONNX file's
counterpart of each call (from :class:`~layertap.onnxfile.scopes.ScopeMap`)
is exposed as an extra graph output of an in-memory copy of the graph (the
file is never written) and fetched from ONNX Runtime. Both sides are aligned
by ``(module path, call index)`` and compared in PyTorch execution order.

Error statistic: :mod:`layertap.metrics` (per module call, over
every element compared: ``max|onnx - torch| <= atol + rtol * max|torch|``).

Alignment rules:

* Rows come in the order PyTorch module calls *return* (children before their
  parent), so the first failing row is the deepest, earliest module whose
  output differs: that is ``first_divergence``.
* A call aligns with the ONNX call of the same index. When the two sides
  count a different number of calls for a module, its calls are listed as
  ``no counterpart`` rather than guessed.
* A module whose output is a tuple/list/dict is flattened; its ONNX tensors
  pair with the PyTorch tensors by position when count and shapes agree,
  otherwise each ONNX tensor pairs with the first unused PyTorch tensor of the
  same shape. Shapes that only differ by size-1 dimensions are compared after
  reshaping.
* A module folded into another (a Conv whose BatchNorm the exporter fused
  into it) is ``absorbed``: it is never a failure. The fused ONNX value is
  compared where PyTorch computes the same value, the BatchNorm's output.
  When the file's scopes do not say so, a failing call whose ONNX value
  matches the output of one of the next sibling modules is recognised as such
  a fusion too.
* The model's own result is the last row, named ``output``.

Memory stays bounded: PyTorch values beyond ``memory_budget`` bytes spill to
a temporary folder, and ONNX Runtime runs in batches, each session exposing
only the tensors that fit the budget (ORT keeps every exposed output of a run
alive, fetched or not), so each batch's arrays are compared and dropped before
the next run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, unknown_name
from ..metrics import DEFAULT_ATOL, DEFAULT_MIN_COSINE, DEFAULT_MIN_SQNR_DB, DEFAULT_RTOL, METRICS, Criterion
from .align import Item, RowBuilder, blame_rewritten, call_counts, plan_items, split_batches
from .nchwc import blocked_tensors
from .onnx_side import OrtRunner, ScopeView, check_feed_shapes, check_same_model, feed_from_args
from .rows import NO_COUNTERPART, CompareReport, CompareRow
from .samples import merge_samples
from .torch_side import ArrayStore, run_torch
from .weights import check_model_weights

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of intermediates held at once, per side

FUSION_NOTE = (
    "exposing intermediate tensors as ONNX Runtime outputs can stop ORT from fusing the nodes that "
    "produce them, so this run may differ slightly from a plain run of the file; compare with "
    "ort_optimizations=False (--no-ort-opt) to rule ORT's graph optimisations out"
)
#: a first divergence at most this many times over the rule may be ORT's rounding (see :func:`could_be_rounding`)
ROUNDING_EXCESS = 10.0


class Progress(Protocol):
    """What ``compare`` reports its steps to (the CLI passes a terminal progress bar)."""

    def step(self, description: str, total: int = 1) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class _Silent:
    def step(self, description: str, total: int = 1) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


# ---------------------------------------------------------------------------
# public entry
# ---------------------------------------------------------------------------
def _module_filter(model: Any, modules: Sequence[str] | str | None) -> tuple[Callable[[str], bool], bool]:
    """``modules`` entries select a module and everything under it."""
    if modules is None:
        return (lambda p: True), True
    if isinstance(modules, str):
        modules = [modules]
    known = [p for p, _ in model.named_modules()]
    known_set = set(known)
    prefixes: list[str] = []
    for m in modules:
        if m not in known_set:
            raise LayertapError(unknown_name("module", m, [k for k in known if k], hint="run 'layertap layers MODEL' to list them"))
        prefixes.append(m)
    include_root = "" in prefixes

    def wanted(path: str) -> bool:
        return include_root or any(path == p or path.startswith(p + ".") for p in prefixes)

    return wanted, include_root


def compare(
    ref: Any,
    args: Any = None,
    cand: str | os.PathLike | None = None,
    *,
    samples: int | Sequence[Any] | None = None,
    providers: Sequence[str] | str | None = None,
    cand_providers: Sequence[str] | str | None = None,
    metric: str = "rel",
    local: bool = False,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    min_cosine: float = DEFAULT_MIN_COSINE,
    min_sqnr_db: float = DEFAULT_MIN_SQNR_DB,
    check_finite: bool = False,
    modules: Sequence[str] | None = None,
    kwargs: dict | None = None,
    method: str | Callable[..., Any] = "forward",
    ort_optimizations: bool = True,
    ref_ort_optimizations: bool | None = None,
    batch_outputs: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    seed: int = 0,
    progress: Progress | None = None,
    onnx_path: str | os.PathLike | None = None,
    allow_different_weights: bool = False,
) -> CompareReport:
    """Compare a reference with an ONNX candidate layer by layer in ONNX Runtime.

    Args:
        ref: the ``nn.Module`` the candidate was exported from (eval mode), or
            the path of a reference ONNX file (then torch is never imported).
        args: one sample: the positional arguments (a tensor/array or a tuple
            of them; a dict of named inputs for an ONNX reference). ``None``
            with an ONNX reference: random data from its input shapes.
        cand: the candidate ONNX file (a float16/int8 conversion, an optimised
            copy, another exporter's file, or ``ref`` itself run another way);
            read only, never modified. ``onnx_path`` is its former name.
        samples: several samples: a list/iterable of samples like ``args``, or
            ``N`` for N seeded random samples shaped like ``args`` (or like the
            reference file's inputs). Rows then hold each call's worst sample.
        providers, cand_providers: ORT execution providers of the reference
            (an ONNX file; refused with a PyTorch reference) and of the candidate,
            e.g. ``["CUDA"]``; default CPU.
        metric: what decides pass/fail: ``rel`` (``max_abs <= atol + rtol *
            max|ref|``), ``cosine`` (``>= min_cosine``) or ``sqnr`` (``>= min_sqnr_db``).
        local: also run each compared call's candidate nodes on the reference's
            own inputs; ``local_rel`` is the error the call makes by itself.
        check_finite: a candidate value that is NaN/inf fails its row (the
            report's ``first_nonfinite`` names the first one either way).
        modules: compare only these modules and their submodules.
        kwargs: keyword arguments for the PyTorch method.
        method: the PyTorch method the file was exported from: a name or a
            callable ``fn(model, *args, **kwargs)``, as for ``lt.export``.
        ort_optimizations: ORT graph optimisations for the candidate;
            ``ref_ort_optimizations`` for an ONNX reference (default: the same).
        batch_outputs: at most this many ONNX tensors per ORT run.
        memory_budget: bytes of intermediates held at once on each side.
        seed: seed of random samples.
        progress: receives the steps (``step``/``advance``); ``None``: silent.
        allow_different_weights: compare even when most parameters found on both sides by
            name differ (another checkpoint); the report says so. Without it that raises
            :class:`~layertap.comparing.weights.DifferentWeightsError`. A few differing
            parameters never stop the comparison: each is named on its module's row (``weights``).

    Returns:
        A :class:`CompareReport`: ``.ok``, ``.rows`` (one per module call, in
        execution order), ``.first_divergence``, ``.first_divergence_counts``.

    Example:
        >>> import torch, layertap as lt
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        >>> x = torch.randn(2, 4)
        >>> import tempfile, os; path = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> torch.onnx.export(model, (x,), path, dynamo=False)
        >>> report = lt.compare(model, x, path, samples=3)
        >>> report.ok, report.first_divergence, report.samples
        (True, None, 3)
        >>> lt.compare(path, None, path, ref_ort_optimizations=False).ok
        True
    """
    cand = cand if cand is not None else onnx_path
    if cand is None:
        raise LayertapError("compare needs a candidate ONNX file (the third argument)")
    criterion = _criterion(metric, rtol, atol, min_cosine, min_sqnr_db, check_finite)
    _check_options(rtol, atol, batch_outputs, memory_budget)
    from ..onnxfile.ort import resolve_providers

    onnx_ref = isinstance(ref, (str, os.PathLike))
    if providers is not None and not onnx_ref:
        raise LayertapError(
            "--providers (providers=) picks the execution providers of an ONNX reference, and REF here is a PyTorch "
            "model; give the candidate's providers with --cand-providers (cand_providers=)"
        )
    ref_providers, c_providers = resolve_providers(providers), resolve_providers(cand_providers)
    if onnx_ref:
        from pathlib import Path

        from .onnx_ref import compare_onnx

        given, n_random = _onnx_samples(args, samples)
        return compare_onnx(
            Path(ref), Path(cand), given, n_random, criterion=criterion, providers=ref_providers,
            cand_providers=c_providers,
            ref_optimize=ort_optimizations if ref_ort_optimizations is None else ref_ort_optimizations,
            cand_optimize=ort_optimizations, modules=modules, batch_outputs=batch_outputs,
            memory_budget=memory_budget, random=_random_from_file(seed), local=local, progress=progress,
            allow_different_weights=allow_different_weights,
        )
    return _compare_torch(
        ref, args, cand, samples=samples, criterion=criterion, providers=c_providers, local=local,
        modules=modules, kwargs=kwargs, method=method, ort_optimizations=ort_optimizations,
        batch_outputs=batch_outputs, memory_budget=memory_budget, seed=seed, progress=progress,
        allow_different_weights=allow_different_weights,
    )


def _criterion(metric: Any, rtol: Any, atol: Any, min_cosine: Any, min_sqnr_db: Any, check_finite: bool) -> Criterion:
    if metric not in METRICS:
        raise LayertapError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    if not isinstance(min_cosine, (int, float)) or not -1 <= min_cosine <= 1:
        raise LayertapError(f"min_cosine must be a number in [-1, 1], got {min_cosine!r}")
    if not isinstance(min_sqnr_db, (int, float)):
        raise LayertapError(f"min_sqnr_db must be a number of dB, got {min_sqnr_db!r}")
    return Criterion(metric, float(rtol), float(atol), float(min_cosine), float(min_sqnr_db), bool(check_finite))


def _onnx_samples(args: Any, samples: Any) -> tuple[list[Any], int]:
    """Samples for an ONNX reference, and how many more to draw at random from its input shapes."""
    given = [] if args is None else [args if isinstance(args, (dict, list, tuple)) else [args]]
    if isinstance(samples, int) and not isinstance(samples, bool):
        if samples < 1:
            raise LayertapError(f"samples must be a positive number, got {samples!r}")
        return given, samples - len(given)
    if samples is not None:
        given = [s if isinstance(s, (dict, list, tuple)) else [s] for s in samples]
        if not given:
            raise LayertapError("samples is empty: give at least one sample")
        return given, 0
    return given, 0 if given else 1


def _random_from_file(seed: int) -> Callable[[list[tuple[str, str]], dict[str, tuple], int], list[Any]]:
    """Draws random samples from the reference file's inputs (symbolic sizes 1), seeds after ``seed``."""

    def draw(inputs: list[tuple[str, str]], shapes: dict[str, tuple], n: int) -> list[Any]:
        from .samples import random_samples

        names = [name for name, _ in inputs]
        missing = [name for name in names if name not in shapes]
        if missing:
            raise InputSpecError(f"input {missing[0]!r} has no declared shape; pass the inputs (--input SHAPE)")
        dims = [tuple(d if isinstance(d, int) and d > 0 else 1 for d in shapes[name]) for name in names]
        return random_samples(n, dims, [dt or "float32" for _, dt in inputs], names, seed + 1)

    return draw


def _torch_samples(args: Any, kwargs: dict, samples: Any, seed: int) -> list[tuple[tuple, dict]]:
    """``(args, kwargs)`` per sample for a PyTorch reference."""
    first = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    if samples is None:
        return [(first, kwargs)]
    if isinstance(samples, int) and not isinstance(samples, bool):
        if samples < 1:
            raise LayertapError(f"samples must be a positive number, got {samples!r}")
        return [(first, kwargs)] + [(_like(first, seed + i), kwargs) for i in range(1, samples)]
    out = []
    for s in samples:
        if isinstance(s, dict):
            out.append(((), {**kwargs, **s}))
        else:
            out.append((tuple(s) if isinstance(s, (tuple, list)) else (s,), kwargs))
    if not out:
        raise LayertapError("samples is empty: give at least one sample")
    return out


def _like(args: tuple, seed: int) -> tuple:
    """Random tensors shaped and typed like ``args`` (integers within the range ``args`` uses)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out.append(torch.randn(a.shape, generator=g, dtype=a.dtype))
        elif isinstance(a, torch.Tensor) and a.dtype != torch.bool:
            high = int(a.max()) + 1 if a.numel() else 1
            out.append(torch.randint(0, max(high, 1), a.shape, generator=g, dtype=a.dtype))
        else:
            out.append(a)
    return tuple(out)


def _compare_torch(
    model: Any, args: Any, onnx_path: str | os.PathLike, *, samples: Any, criterion: Criterion, providers: list[str],
    local: bool, modules: Sequence[str] | None, kwargs: dict | None, method: str | Callable[..., Any], ort_optimizations: bool,
    batch_outputs: int | None, memory_budget: int, seed: int, progress: Progress | None,
    allow_different_weights: bool = False,
) -> CompareReport:
    """PyTorch reference: one hooked forward per sample, the candidate's tensors in ORT batches."""
    from ..onnxfile.metadata import own_outputs
    from ..onnxfile.modelfile import read_model
    from ..onnxfile.scopes import ScopeMap
    from ..pytorch.taps import bound_method

    bound_method(model, method)  # a non-module or an unknown method fails before any work
    runs = _torch_samples(args, dict(kwargs or {}), samples, seed)
    # The shared loader: graph only (weights stay on disk for ORT) and the
    # external-data safety checks every ONNX command applies.
    onnx_file = read_model(onnx_path)
    view = ScopeView(ScopeMap.from_model(onnx_file.model), {p for p, _ in model.named_modules() if p})
    check_same_model(view, model, onnx_path)
    wanted, include_root = _module_filter(model, modules)
    runner = OrtRunner(onnx_file.model, onnx_file.folder, ort_optimizations, providers)
    proto = runner.proto  # the graph with the weights held once by the runner; the loaded proto goes
    del onnx_file
    weights = check_model_weights(model, view, runner.source).enforce(allow_different_weights)
    # Inputs first: a wrong number or shape of arguments should not cost a forward.
    feeds = [feed_from_args(runner.input_names(), a, k) for a, k in runs]
    for feed in feeds:
        check_feed_shapes(feed, runner.input_shapes())
    prog = progress if progress is not None else _Silent()
    blocked = blocked_tensors(proto.graph)
    held = _TorchSamples(runner, local, prog)
    try:
        for (a, k), feed in zip(runs, feeds):
            store = held.new_store(memory_budget)
            prog.step("PyTorch forward")
            calls, root = run_torch(model, a, k, method, store, wanted)
            prog.advance()
            items = [_refuse_blocked(it, blocked) for it in plan_items(calls, root, view, own_outputs(proto), include_root)
                     if wanted(it.mc.path) or it.mc is root]
            builder = RowBuilder(items, store, criterion, call_counts(calls))
            held.add(_TorchSample(items, builder, split_batches(items, store, batch_outputs, memory_budget), feed))
        held.finish()
    finally:
        held.close()
    per_sample, spilled = [blame_rewritten(rows) for rows in held.rows], held.spilled
    rows, firsts = merge_samples(per_sample, criterion)
    first = next((r for r in rows if r.ok is False), None)
    weights.annotate(rows)
    return CompareReport(
        rows,
        weights.notes() + _notes(model, view, runner, spilled, len(runs), rounding=could_be_rounding(first, criterion)) + (
            [NCHWC_NOTE] if blocked else []),
        criterion=criterion,
        onnx_path=str(onnx_path),
        ort_optimizations=ort_optimizations,
        ort_runs=runner.runs,
        samples=len(runs),
        first_divergence_counts=firsts,
        local=local,
        weights=weights,
    )


def _check_options(rtol: Any, atol: Any, batch_outputs: Any, memory_budget: Any) -> None:
    """User errors in the numeric options, as one-line messages."""
    if not (isinstance(rtol, (int, float)) and rtol >= 0 and isinstance(atol, (int, float)) and atol >= 0):
        raise LayertapError(f"tolerances must be numbers >= 0, got rtol={rtol!r}, atol={atol!r}")
    if batch_outputs is not None and (not isinstance(batch_outputs, int) or batch_outputs < 1):
        raise LayertapError(f"batch_outputs must be a positive integer, got {batch_outputs!r}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise LayertapError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")


#: said when a PyTorch reference meets a file with ORT's NCHWc kernels
NCHWC_NOTE = ("the file holds ONNX Runtime's NCHWc kernels (saved at ORT_ENABLE_ALL), whose tensors are in a blocked "
              "layout: compare it with the file it was optimised from as the reference (compare SRC.onnx THIS.onnx), "
              "or save it at ORT_ENABLE_EXTENDED")


def _refuse_blocked(item: Item, blocked: set[str]) -> Item:
    """A call answered by a tensor in ORT's NCHWc layout is not compared with PyTorch's NCHW value."""
    if item.status is None and blocked.intersection(item.tensors):
        item.status, item.tensors, item.unverified = NO_COUNTERPART, (), None
        item.note = "its ONNX tensor is in ONNX Runtime's blocked NCHWc layout (a file saved at ORT_ENABLE_ALL)"
    return item


@dataclass
class _TorchSample:
    """One sample's PyTorch values (in ``builder.store``), rows to build, and ORT batches."""

    items: list[Item]
    builder: RowBuilder
    batches: list[list[Item]]
    feed: dict[str, np.ndarray]
    rows: list[list[CompareRow]] = field(default_factory=list)


class _TorchSamples:
    """Runs the candidate for the samples of a PyTorch reference, one ORT session per batch for all.

    A sample whose exposed tensors fit one batch is compared at once and its
    values dropped (the session stays for the next sample). One that needs
    several batches keeps its values (within what is left of the memory
    budget, the rest on disk) until every sample has run: then batch ``b`` of
    every sample runs before batch ``b + 1``, so each batch's session is built
    once, not once per sample.
    """

    def __init__(self, runner: OrtRunner, local: bool, prog: Progress) -> None:
        self.runner, self.local, self.prog = runner, local, prog
        self.stores: list[ArrayStore] = []
        self.samples: list[_TorchSample] = []
        self.spilled = 0
        self._parts: Any = None  # the candidate's part graphs for --local (LocalGraph)

    def new_store(self, budget: int) -> ArrayStore:
        """A store for the next sample's values, with what the samples still held leave of ``budget``."""
        store = ArrayStore(max(0, budget - sum(st.held for st in self.stores)))
        self.stores.append(store)
        return store

    def add(self, sample: _TorchSample) -> None:
        self.samples.append(sample)
        if len(sample.batches) <= 1:
            self.prog.step("ONNX Runtime and compare", total=len(sample.items))
            for batch in sample.batches:
                self._run(sample, batch)
            self._release(sample)

    def finish(self) -> None:
        pending = [s for s in self.samples if len(s.batches) > 1]
        if pending:
            self.prog.step("ONNX Runtime and compare", total=sum(len(s.items) for s in pending))
        for b in range(max((len(s.batches) for s in pending), default=0)):
            for sample in pending:
                if b < len(sample.batches):
                    self._run(sample, sample.batches[b])
        for sample in pending:
            self._release(sample)

    @property
    def rows(self) -> list[list[CompareRow]]:
        return [[r for batch in s.rows for r in batch] for s in self.samples]

    def _run(self, sample: _TorchSample, batch: list[Item]) -> None:
        """One ORT run for one batch of one sample; --local for the same batch (its part graph stays small)."""
        names = list(dict.fromkeys(n for it in batch for n in it.tensors))
        values = self.runner.run(names, sample.feed) if names else {}
        rows = []
        for it in batch:
            rows.append(sample.builder.row(it, values))
            self.prog.advance()
        del values
        if self.local:
            from .local import LocalGraph, local_errors_torch

            if self._parts is None:  # one for all batches and samples: its last session is reused
                self._parts = LocalGraph(self.runner.source, self.runner.optimize, self.runner.providers)
            local_errors_torch(self._parts, batch, rows, sample.builder, sample.feed)
        sample.rows.append(rows)

    def _release(self, sample: _TorchSample) -> None:
        store = sample.builder.store
        self.spilled = max(self.spilled, store.spilled)
        store.close()
        if store in self.stores:
            self.stores.remove(store)

    def close(self) -> None:
        for store in self.stores:
            self.spilled = max(self.spilled, store.spilled)
            store.close()
        self.stores.clear()
        self.runner.close()


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


def _notes(model: Any, view: ScopeView, runner: OrtRunner, spilled: int, n_samples: int, *, rounding: bool) -> list[str]:
    """What the reader needs to know to trust (or doubt) the rows.

    The ORT fusion caveat only matters to explain a failing row whose error could be rounding.
    """
    notes = []
    if not runner.optimize:
        notes.append("ONNX Runtime ran with graph optimisations disabled (ORT_DISABLE_ALL)")
    elif rounding:
        notes.append(FUSION_NOTE)
    if getattr(model, "training", False):
        notes.append("the model is in training mode (dropout, batch statistics): call model.eval() before comparing")
    if view.source == "none":
        notes.append(
            "the ONNX file carries no module scopes (not from torch.onnx.export), so only the model output is compared"
        )
    if view.prefix:
        notes.append(f"the file's module scopes carry the prefix '{view.prefix}.' (exported through a wrapper); stripped")
    if runner.runs > n_samples:
        notes.append(f"ONNX Runtime ran {runner.runs} times, exposing the intermediates in batches to bound memory")
    if spilled:
        notes.append(f"{spilled / 2**20:.0f} MiB of PyTorch values were held on disk (memory_budget)")
    if runner.providers != ["CPUExecutionProvider"]:
        notes.append(f"ONNX Runtime ran on {', '.join(runner.providers)}")
    if n_samples > 1:
        notes.append(f"{n_samples} samples; each row shows its worst sample (worst_sample); "
                     f"{runner.sessions} ORT session(s) for all of them")
    return notes

