"""``lt.compare``: PyTorch vs ONNX Runtime, module by module.

The PyTorch model runs once with hooks on every module; each module call's
output is moved to numpy as soon as the call returns. The ONNX file's
counterpart of each call (from :class:`~layertap.onnxfile.scopes.ScopeMap`)
is exposed as an extra graph output of an in-memory copy of the graph (the
file is never written) and fetched from ONNX Runtime. Both sides are aligned
by ``(module path, call index)`` and compared in PyTorch execution order.

Error statistic: :mod:`layertap.bridge.tolerance` (per module call, over
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
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ...errors import LayertapError, unknown_name
from ..tolerance import DEFAULT_ATOL, DEFAULT_RTOL
from .align import Item, RowBuilder, call_counts, plan_items, split_batches
from .onnx_side import OrtRunner, ScopeView, check_feed_shapes, check_same_model, feed_from_args, model_outputs
from .report import CompareReport, CompareRow
from .torch_side import ArrayStore, run_torch

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of intermediates held at once, per side

FUSION_NOTE = (
    "exposing intermediate tensors as ONNX Runtime outputs can stop ORT from fusing the nodes that "
    "produce them, so this run may differ slightly from a plain run of the file; compare with "
    "ort_optimizations=False (--no-ort-opt) to rule ORT's graph optimisations out"
)


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
    model: Any,
    args: Any,
    onnx_path: str | os.PathLike,
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    modules: Sequence[str] | None = None,
    kwargs: dict | None = None,
    method: str = "forward",
    ort_optimizations: bool = True,
    batch_outputs: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: Progress | None = None,
) -> CompareReport:
    """Compare a PyTorch model with its ONNX file module by module in ONNX Runtime.

    Args:
        model: the ``nn.Module`` the file was exported from (eval mode).
        args: the positional arguments (a tensor or a tuple of them).
        onnx_path: the ONNX file; read only, never modified.
        rtol, atol: a call passes when ``max|onnx - torch| <= atol + rtol * max|torch|``.
        modules: compare only these modules and their submodules (default: all,
            plus the model's output).
        kwargs: keyword arguments for the method.
        method: the method the file was exported from (``forward`` by default).
        ort_optimizations: run ORT with its graph optimisations (default) or
            with ``ORT_DISABLE_ALL``; exposing intermediates can change which
            fusions ORT applies, so a divergence that disappears without them
            is ORT's, not the exporter's.
        batch_outputs: at most this many ONNX tensors per ORT run (default: as
            many as fit ``memory_budget``).
        memory_budget: bytes of intermediates held at once on each side.
        progress: receives the steps (``step``/``advance``), e.g. the CLI's
            :class:`layertap.cli.console.StepProgress`; ``None``: silent.

    Returns:
        A :class:`CompareReport`: ``.ok``, ``.rows`` (one per module call, in
        PyTorch execution order), ``.first_divergence`` (name or ``None``).

    Example:
        >>> import torch, torchvision, layertap as lt
        >>> model = torchvision.models.resnet18().eval()
        >>> x = torch.randn(1, 3, 64, 64)
        >>> torch.onnx.export(model, (x,), "r18.onnx", dynamo=True)          # doctest: +SKIP
        >>> report = lt.compare(model, x, "r18.onnx")                        # doctest: +SKIP
        >>> report.ok, report.first_divergence                               # doctest: +SKIP
        (True, None)
    """
    from ...onnxfile.modelfile import load_model
    from ...onnxfile.scopes import ScopeMap
    from ...pytorch.taps import bound_method

    _check_options(rtol, atol, batch_outputs, memory_budget)
    bound_method(model, method)  # a non-module or an unknown method fails before any work
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    # The shared loader: graph only (weights stay on disk for ORT) and the
    # external-data safety checks every ONNX command applies.
    onnx_file = load_model(onnx_path)
    proto = onnx_file.model
    view = ScopeView(ScopeMap.from_model(proto), {p for p, _ in model.named_modules() if p})
    check_same_model(view, model, onnx_path)
    wanted, include_root = _module_filter(model, modules)
    runner = OrtRunner(proto, onnx_file.folder, ort_optimizations)
    # Inputs first: a wrong number or shape of arguments should not cost a forward.
    feed = feed_from_args(runner.input_names(), args, kwargs)
    check_feed_shapes(feed, runner.input_shapes())

    store = ArrayStore(memory_budget)
    try:
        prog = progress if progress is not None else _Silent()
        prog.step("PyTorch forward")
        calls, root = run_torch(model, args, kwargs, method, store, wanted)
        prog.advance()
        items = [it for it in plan_items(calls, root, view, model_outputs(proto), include_root) if wanted(it.mc.path) or it.mc is root]
        builder = RowBuilder(items, store, float(rtol), float(atol), call_counts(calls))
        batches = split_batches(items, store, batch_outputs, memory_budget)
        prog.step("ONNX Runtime and compare", total=len(items))
        rows = _compare_batches(batches, builder, runner, feed, prog)
    finally:
        store.close()
    return CompareReport(
        rows,
        _notes(model, view, runner, store, failed=any(r.ok is False for r in rows)),
        rtol=float(rtol),
        atol=float(atol),
        onnx_path=str(onnx_path),
        ort_optimizations=ort_optimizations,
        ort_runs=runner.runs,
    )


def _check_options(rtol: Any, atol: Any, batch_outputs: Any, memory_budget: Any) -> None:
    """User errors in the numeric options, as one-line messages."""
    if not (isinstance(rtol, (int, float)) and rtol >= 0 and isinstance(atol, (int, float)) and atol >= 0):
        raise LayertapError(f"tolerances must be numbers >= 0, got rtol={rtol!r}, atol={atol!r}")
    if batch_outputs is not None and (not isinstance(batch_outputs, int) or batch_outputs < 1):
        raise LayertapError(f"batch_outputs must be a positive integer, got {batch_outputs!r}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise LayertapError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")


def _compare_batches(
    batches: list[list[Item]], builder: RowBuilder, runner: OrtRunner, feed: dict[str, np.ndarray], prog: Progress
) -> list[CompareRow]:
    """One ORT run per batch; each batch's arrays are compared and dropped before the next run."""
    rows: list[CompareRow] = []
    for batch in batches:
        names = list(dict.fromkeys(n for it in batch for n in it.tensors))
        values = runner.run(names, feed) if names else {}
        for it in batch:
            rows.append(builder.row(it, values))
            prog.advance()
        del values
    return rows


def _notes(model: Any, view: ScopeView, runner: OrtRunner, store: ArrayStore, *, failed: bool) -> list[str]:
    """What the reader needs to know to trust (or doubt) the rows.

    The ORT fusion caveat only matters to explain a failing row.
    """
    notes = []
    if not runner.optimize:
        notes.append("ONNX Runtime ran with graph optimisations disabled (ORT_DISABLE_ALL)")
    elif failed:
        notes.append(FUSION_NOTE)
    if getattr(model, "training", False):
        notes.append("the model is in training mode (dropout, batch statistics): call model.eval() before comparing")
    if view.source == "none":
        notes.append(
            "the ONNX file carries no module scopes (not from torch.onnx.export), so only the model output is compared"
        )
    if view.prefix:
        notes.append(f"the file's module scopes carry the prefix '{view.prefix}.' (exported through a wrapper); stripped")
    if runner.runs > 1:
        notes.append(f"ONNX Runtime ran {runner.runs} times, exposing the intermediates in batches to bound memory")
    if store.spilled:
        notes.append(f"{store.spilled / 2**20:.0f} MiB of PyTorch values were held on disk (memory_budget)")
    return notes

