"""A PyTorch model against a candidate that names its module values: a program a ``"program"`` runtime made
(:class:`~layertap.runtimes.plugins.TappedProgram`), module by module, through the one driver (:mod:`.driver`).

Such a candidate hands out only its outputs, so its module rows come from the model lowered again by the
program's recipe with a tap at every module that returns one tensor (each call ``PATH#k``): :class:`MappedSide`
runs that tapped program beside the program itself, and the model's output row is the program's own.
Tapping must not change what it measures: the tapped program's outputs are compared with the program's on
every sample, and the report says how far they differ. A program from elsewhere (no record) is compared by
its outputs alone, and the report says which options give module rows.

A program below float32 is judged at its format (:class:`~.judging.Judging`): its ideal run is the runtime's
recipe in float arithmetic (``TappedProgram.ideal``), the analogue of a QDQ file run with its optimisations
off; a row fails when the program departs from that run by more than the format explains.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import LayertapError
from ..metrics import Criterion
from ..runtimes.plugins import ProgramPlugin, TappedProgram
from .align import Item, RowBuilder, call_counts
from .driver import Sample, Silent, compare_sides, module_filter, plan_batches
from .judging import judging as precision_rule
from .rows import ABSORBED, NO_COUNTERPART
from .torch_side import ArrayStore, run_torch, to_numpy
from .weight_check import WeightCheck, check_recorded

#: said of a row whose module returns no single tensor
NOT_ONE_TENSOR = "its output is not floating tensors (one, or a tuple of them), and a program hands out tensors only"


class MappedSide:
    """The candidate: the program (its outputs) and, where it could be lowered again, the tapped program (the
    module rows). A :class:`~.driver.Candidate`."""

    blocked: set[str] = set()

    def __init__(self, program: TappedProgram) -> None:
        self.program = program
        self.path, self.engine, self.tapped, self.own = program.path, program.engine, program.tapped, program.own
        self.name = program.name
        self.runtime = program.runtime
        #: per sample run: (max abs, max |value|) between the tapped program's outputs and the program's
        self.tap_effect: list[tuple[float, float]] = []
        self.runs = 0

    @property
    def sessions(self) -> int:
        return 1 + (self.tapped is not None)

    def prepare(self, names: list[str]) -> None:
        pass  # both programs were loaded once

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run of the program (the model's outputs) and of the tapped program (the module rows)."""
        values = self.engine.run(None, feed)
        self.runs += 1  # the tapped program runs beside it, once per sample too
        if self.tapped is not None:
            tapped = self.tapped.run(None, feed)
            diffs = [(float(np.abs(tapped[n] - values[n]).max(initial=0.0)), float(np.abs(values[n]).max(initial=0.0)))
                     for n in self.own if n in tapped]
            self.tap_effect.append((max((d for d, _ in diffs), default=0.0), max((m for _, m in diffs), default=0.0)))
            values = {**tapped, **values}
        return {n: values[n] for n in names if n in values}

    def local_graph(self, scopes: Any = None) -> Any:
        return self.runtime.open_part(None, None)  # type: ignore[arg-type]  # refused by the runtime, with why

    def describe(self) -> Any:
        return self.runtime.describe()

    def notes(self, label: str | None, rounding: bool) -> list[str]:
        settings = self.runtime.settings()
        ran = self.describe().text() + (f", {settings}" if settings else "")
        notes = [f"the candidate {self.name} ran in {ran}", *self.program.notes]
        if self.tapped is None:
            return [*notes, self.program.untapped]
        notes.append(self.program.rows_from or "module rows come from the candidate made again with a tap at every "
                     "module (it hands out only its outputs); the output row is the candidate's own")
        if self.program.rows_from and self.program.untapped:
            notes.append(self.program.untapped)
        if self.program.versus is not None:
            cand, ideal, ref = self.program.versus
            notes.append(f"the reference is the model run in {ref}; each row sets {cand}'s error against it beside "
                         f"{ideal}'s own error there")
        if self.tap_effect:
            worst, top = max(self.tap_effect)
            rel = worst / top if top else 0.0
            notes.append("tapping changed nothing: the tapped program's outputs equal the program's" if worst == 0 else
                         f"the tapped program's outputs differ from the program's by max abs {worst:.3g} (rel {rel:.3g}): "
                         "taps keep values as outputs, which can stop the backend fusing ops across them")
        return notes

    def close(self) -> None:
        pass


class MappedReference:
    """The PyTorch model as the reference of a program (a :class:`~.driver.Reference`): one hooked forward
    per sample; each module call paired with the tapped program's output of the same path and call."""

    holds_values = True
    own_runs: tuple = ()
    cand_scopes = None

    def __init__(self, model: Any, runs: list[tuple[tuple, dict]], cand: MappedSide, names: dict[tuple[str, int], tuple[str, ...]],
                 *, method: Any, criterion: Criterion, modules: Sequence[str] | None, batch_outputs: int | None,
                 memory_budget: int, progress: Any, judging: Any = None, ideal: Any = None,
                 allow_different_weights: bool = False) -> None:
        self.model, self.runs_args, self.cand, self.names, self.method = model, runs, cand, names, method
        self.n_samples, self.criterion, self.judging, self.ideal = len(runs), criterion, judging, ideal
        self.batch_outputs, self.budget, self.prog = batch_outputs, memory_budget, progress
        self.allow_different_weights = allow_different_weights
        self.wanted, self.include_root = module_filter(modules, [p for p, _ in model.named_modules()])
        inputs = [i.name for i in cand.engine.get_inputs()]
        # the tensors of each call, positional then keyword (as the candidate's inputs are named and lowered)
        self.feeds = [{n: to_numpy(t) for n, t in zip(inputs, [v for v in (*a, *k.values()) if hasattr(v, "detach")])}
                      for a, k in runs]
        self._stores: list[ArrayStore] = []

    def sample(self, index: int, budget: int) -> Sample:
        store = ArrayStore(budget)
        self._stores.append(store)
        prog = self.prog if self.prog is not None else Silent()
        prog.step("PyTorch forward")
        a, k = self.runs_args[index]
        model = self.model
        if self.cand.program.reference is not None:  # a reference more precise than the model as given
            model, a, k = self.cand.program.reference(a, k)
        calls, root = run_torch(model, a, k, self.method, store, self.wanted)
        prog.advance()
        items, counts = [], call_counts(calls)
        for mc in calls:
            if not self.wanted(mc.path):
                continue
            names = self.names.get((mc.path, mc.call), ())
            item = Item(mc, tuple(names), ordered=True)
            if mc.path in self.cand.program.row_notes:
                item.note = self.cand.program.row_notes[mc.path]
            if not names:
                self._without_value(item, counts)
            items.append(item)
        items.append(Item(root, tuple(self.cand.own)))
        ideal = self._ideal_store(index, items, budget) if self.ideal is not None else None
        builder = RowBuilder(items, store, self.criterion, counts, judging=self.judging, ideal=ideal)

        def cost(item: Item) -> tuple[int, int]:
            return len(item.tensors), store.nbytes(item.mc.key) if item.tensors else 0

        return Sample(items, builder, plan_batches(items, cost, self.batch_outputs, self.budget), self.feeds[index])

    def _without_value(self, item: Item, counts: dict[str, int]) -> None:
        """A call the candidate holds no value of: absorbed where the program fused it into another module's op,
        else no counterpart, with why."""
        program, key = self.cand.program, (item.mc.path, item.mc.call)
        holder = program.absorbed.get(key)
        if holder is not None:
            item.status, (item.fused_into, item.fused_call) = ABSORBED, holder
            shown = f"{holder[0]}#{holder[1]}" if counts.get(holder[0], 1) > 1 else holder[0]
            by, unit = program.fused_by
            item.note = f"{by} fused it into {shown}'s {unit}; compared there"
            return
        item.status = NO_COUNTERPART
        item.note = item.mc.note or program.missing.get(key) or program.unmatched or (
            NOT_ONE_TENSOR if self.cand.tapped is not None else "the program carries no taps layertap recorded")

    def _ideal_store(self, index: int, items: list[Item], budget: int) -> ArrayStore:
        """The ideal run of one sample (the quantised model in PyTorch), keyed as the reference's store."""
        store = ArrayStore(budget)
        self._stores.append(store)
        values = self.ideal(*self.runs_args[index])
        if self.cand.program.versus is None:  # a quantizer's ideal run folds modules; an eager one folds none
            absorb_folded(items, values)
        for it in items:
            if it.tensors and all(t in values for t in it.tensors):
                store.put(it.mc.key, [values[t] for t in it.tensors])
        return store

    def prepare(self, batch: list[Item], parts: Any) -> None:
        pass

    def values(self, sample: Sample, batch: list[Item], parts: Any) -> dict[str, np.ndarray]:
        return {}

    def ideal_values(self, sample: Sample, batch: list[Item]) -> dict[str, np.ndarray]:
        return {}

    def local_inputs(self, sample: Sample, batch: list[Item], ref_values: Any, cand_values: Any) -> Any:
        raise LayertapError(f"--local (local=True) is not available for {self.cand.describe().runtime} programs")

    def start_weight_check(self) -> None:
        pass

    def checked_weights(self, beside: Callable[[], Any] | None = None) -> WeightCheck:
        """The model's parameters against the record the program carries of those it was lowered from (none
        recorded: nothing matched) and, where its runtime reads them, against the weights inside the program;
        raises :class:`~.weight_check.DifferentWeightsError` for another checkpoint."""
        if beside is not None:
            beside()
        record, held = self.cand.program.weights, self.cand.program.held_weights
        if not record and held is None:
            return WeightCheck(cand="program")
        from ..pytorch.lowering import weight_record

        return check_recorded(record or {}, weight_record(self.model), held() if held is not None else None).enforce(
            self.allow_different_weights)

    def notes(self, candidate: Any, rounding: bool) -> list[str]:
        notes = candidate.notes(None, rounding)
        if getattr(self.model, "training", False):
            notes.append("the model is in training mode (dropout, batch statistics): call model.eval() before comparing")
        return notes

    def close(self) -> None:
        for store in self._stores:
            store.close()


def absorb_folded(items: list[Item], values: dict[str, np.ndarray]) -> None:
    """Calls the quantizer folded into the next one (a Conv into its BatchNorm: pt2e folds them, so the Conv's
    tap holds the BatchNorm's value) become ``absorbed`` there, as an ONNX file's folds do: their value is
    compared at the module that holds it."""

    for it, nxt in zip(items, items[1:]):
        if it.status is not None or not it.tensors or not nxt.tensors or "" in (it.mc.path, nxt.mc.path):
            continue
        if it.mc.path.startswith(nxt.mc.path + "."):  # a block returning its last child's value: no fold
            continue
        a, b = values.get(it.tensors[0]), values.get(nxt.tensors[0])
        if a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b):
            it.status, it.tensors, it.fused_into = ABSORBED, (), nxt.mc.path
            it.note = f"the int8 quantizer folded it into {nxt.mc.path}; compared there"


def compare_mapped(runtime: ProgramPlugin, model: Any, path: Any, runs: list[tuple[tuple, dict]], plan: Any,
                   method: Any) -> Any:
    """The report of a PyTorch model against the program at ``path`` that ``runtime`` runs, by the one driver."""
    with tempfile.TemporaryDirectory(prefix="layertap-program-") as work:
        source = Path(path) if isinstance(path, (str, os.PathLike)) else path
        program = runtime.tapped(model, method, source, runs, Path(work), module_filter(plan.modules)[0])
        side = MappedSide(program)
        formats = program.formats
        judged = None if formats is None or plan.criterion.precision == "fp32" else \
            precision_rule(formats, plan.criterion, plan.chosen)
        if judged is not None and program.versus is not None:
            judged = dataclasses.replace(judged, versus=program.versus)
        reference = MappedReference(model, runs, side, program.names, method=method, progress=plan.progress,
                                    judging=judged, ideal=program.ideal if judged is not None else None,
                                    criterion=plan.criterion, modules=plan.modules, batch_outputs=plan.batch_outputs,
                                    memory_budget=plan.memory_budget,
                                    allow_different_weights=plan.allow_different_weights)
        info = side.describe().to_dict()
        return compare_sides(reference, side, onnx_path=program.name if program.shown else str(path),
                             ort_optimizations=True,
                             runtimes={"candidate": info}, judging=judged, criterion=plan.criterion,
                             local=False, memory_budget=plan.memory_budget, progress=plan.progress)
