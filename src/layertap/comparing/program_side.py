"""``lt.compare(model, args, "m.pte")``: a PyTorch model against an ExecuTorch program, module by module,
through the one driver (:mod:`.driver`).

A program hands out only its outputs, so its module rows come from the model lowered again by the
recipe recorded beside it (``m.pte.json``: backend, quantisation, the calibration samples kept in
``m.pte.calib.npz``, the modules kept float32) with a tap at every module that returns one tensor
(:func:`~layertap.exporting.executorch.module_taps`; each call ``PATH#k``): :class:`ProgramSide` runs that
tapped program in ExecuTorch's runtime beside the program itself, and the model's output row is the
program's own. Tapping must not change what it measures: the tapped program's outputs are compared
with the program's on every sample, and the report says how far they differ. A program from elsewhere
(no record) is compared by its outputs alone, and the report says which options give module rows.

An int8 program is judged at int8 (:class:`~.ideal.Judging`): its ideal run is the pt2e-quantised model
(fake-quant arithmetic in float, :func:`~layertap.exporting.executorch.quantize_int8`) run in PyTorch, the
analogue of a QDQ file run with its optimisations off; a row fails when the program departs from that
run by more than the format explains.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import LayertapError
from ..metrics import Criterion
from ..numformats import Format
from ..onnxfile.formats import TensorFormats
from ..runtimes.executorch import ExecuTorchRuntime, ProgramEngine, Sidecar, check_static_shape, sidecar_path
from .align import Item, RowBuilder, call_counts
from .driver import Sample, Silent, compare_sides, module_filter, plan_batches
from .ideal import judging as precision_rule
from .rows import ABSORBED, NO_COUNTERPART
from .torch_side import ArrayStore, run_torch, to_numpy
from .weight_check import WeightCheck

#: said of a row whose module returns no single tensor
NOT_ONE_TENSOR = "its output is not one floating tensor, and a program hands out tensors only"


class ProgramSide:
    """The candidate: the program (its outputs) and, where it carries layertap's record, the model lowered again
    by its recipe with a tap at every module (the module rows). A :class:`~.driver.Candidate`."""

    blocked: set[str] = set()

    def __init__(self, path: str | Path, engine: ProgramEngine, tapped: ProgramEngine | None, own: list[str]) -> None:
        self.path, self.engine, self.tapped, self.own = Path(path), engine, tapped, own
        recipe = engine.sidecar.recipe if engine.sidecar is not None else {}
        self.runtime = ExecuTorchRuntime(recipe.get("quantize") or "float32", recipe.get("backend"))
        #: per sample run: (max abs, max |value|) between the tapped program's outputs and the program's
        self.tap_effect: list[tuple[float, float]] = []

    @property
    def runs(self) -> int:
        return self.engine.runs  # the tapped program runs beside it, once per sample too

    @property
    def sessions(self) -> int:
        return 1 + (self.tapped is not None)

    def prepare(self, names: list[str]) -> None:
        pass  # both programs were loaded once

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run of the program (the model's outputs) and of the tapped program (the module rows)."""
        values = self.engine.run(None, feed)
        if self.tapped is not None:
            tapped = self.tapped.run(None, feed)
            diffs = [(float(np.abs(tapped[n] - values[n]).max(initial=0.0)), float(np.abs(values[n]).max(initial=0.0)))
                     for n in self.own if n in tapped]
            self.tap_effect.append((max((d for d, _ in diffs), default=0.0), max((m for _, m in diffs), default=0.0)))
            values = {**tapped, **values}
        return {n: values[n] for n in names if n in values}

    def local_graph(self, scopes: Any = None) -> Any:
        return self.runtime.open_part(None, None)  # refused: a program has no ONNX parts

    def describe(self) -> Any:
        return self.runtime.describe()

    def notes(self, label: str | None, rounding: bool) -> list[str]:
        settings = self.runtime.settings()
        ran = self.describe().text() + (f", {settings}" if settings else "")
        notes = [f"the candidate {self.path.name} ran in {ran}"]
        if self.tapped is None:
            notes.append("the program carries no layertap record (m.pte.json beside it), so only its outputs are "
                         "compared; export it with layertap export MODEL -o m.pte (lt.export(model, args, 'm.pte')) "
                         "for module rows")
            return notes
        notes.append("module rows come from the model lowered again by the program's recipe with a tap at every "
                     "module (ExecuTorch can hand out only a program's outputs); the output row is the program's own")
        if self.tap_effect:
            worst, top = max(self.tap_effect)
            rel = worst / top if top else 0.0
            notes.append("tapping changed nothing: the tapped program's outputs equal the program's" if worst == 0 else
                         f"the tapped program's outputs differ from the program's by max abs {worst:.3g} (rel {rel:.3g}): "
                         "taps keep values as outputs, which can stop the backend fusing ops across them")
        return notes

    def close(self) -> None:
        pass


class ProgramReference:
    """The PyTorch model as the reference of a program (a :class:`~.driver.Reference`): one hooked forward
    per sample; each module call paired with the tapped program's output of the same path and call."""

    holds_values = True
    own_runs: tuple = ()
    cand_scopes = None

    def __init__(self, model: Any, runs: list[tuple[tuple, dict]], cand: ProgramSide, names: dict[tuple[str, int], str],
                 *, method: Any, criterion: Criterion, modules: Sequence[str] | None, batch_outputs: int | None,
                 memory_budget: int, progress: Any, judging: Any = None, ideal: Any = None) -> None:
        self.model, self.runs_args, self.cand, self.names, self.method = model, runs, cand, names, method
        self.n_samples, self.criterion, self.judging, self.ideal = len(runs), criterion, judging, ideal
        self.batch_outputs, self.budget, self.prog = batch_outputs, memory_budget, progress
        self.wanted, self.include_root = module_filter(modules, [p for p, _ in model.named_modules()])
        inputs = [i.name for i in cand.engine.get_inputs()]
        self.feeds = [{n: to_numpy(t) for n, t in zip(inputs, a)} for a, _ in runs]
        self._stores: list[ArrayStore] = []

    def sample(self, index: int, budget: int) -> Sample:
        store = ArrayStore(budget)
        self._stores.append(store)
        prog = self.prog if self.prog is not None else Silent()
        prog.step("PyTorch forward")
        a, k = self.runs_args[index]
        calls, root = run_torch(self.model, a, k, self.method, store, self.wanted)
        prog.advance()
        items = []
        for mc in calls:
            if not self.wanted(mc.path):
                continue
            name = self.names.get((mc.path, mc.call))
            item = Item(mc, (name,) if name else ())
            if not name:
                item.status = NO_COUNTERPART
                item.note = mc.note or (NOT_ONE_TENSOR if self.cand.tapped is not None else
                                        "the program carries no taps layertap recorded")
            items.append(item)
        items.append(Item(root, tuple(self.cand.own)))
        ideal = self._ideal_store(index, items, budget) if self.ideal is not None else None
        builder = RowBuilder(items, store, self.criterion, call_counts(calls), judging=self.judging, ideal=ideal)

        def cost(item: Item) -> tuple[int, int]:
            return len(item.tensors), store.nbytes(item.mc.key) if item.tensors else 0

        return Sample(items, builder, plan_batches(items, cost, self.batch_outputs, self.budget), self.feeds[index])

    def _ideal_store(self, index: int, items: list[Item], budget: int) -> ArrayStore:
        """The ideal run of one sample (the quantised model in PyTorch), keyed as the reference's store."""
        store = ArrayStore(budget)
        self._stores.append(store)
        values = self.ideal(self.runs_args[index][0])
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
        raise LayertapError("--local (local=True) is not available for ExecuTorch programs")

    def start_weight_check(self) -> None:
        pass

    def checked_weights(self, beside: Callable[[], Any] | None = None) -> WeightCheck:
        if beside is not None:
            beside()
        return WeightCheck(cand="program")

    def notes(self, candidate: Any, rounding: bool) -> list[str]:
        notes = candidate.notes(None, rounding)
        if getattr(self.model, "training", False):
            notes.append("the model is in training mode (dropout, batch statistics): call model.eval() before comparing")
        return notes

    def close(self) -> None:
        for store in self._stores:
            store.close()


def program_sides(model: Any, method: Any, path: str | Path, runs: list[tuple[tuple, dict]], work: Path,
                  modules: Sequence[str] | None) -> tuple[ProgramSide, dict[tuple[str, int], str], Any, Any]:
    """The candidate side of ``path``, the (module path, call) -> tapped output name map, the int8 program's
    formats (``None``: float32) and its ideal run (``None``: float32), lowering the model again in ``work``."""
    from ..pytorch.lowering import Recipe, lower, module_taps, read_calibration, tapped_wrapper

    engine = ProgramEngine(path)
    sidecar = engine.sidecar
    own = [n for n in engine.output_names() if sidecar is None or n not in set(sidecar.taps)]
    if sidecar is None:
        return ProgramSide(path, engine, None, own), {}, None, None
    for info, a in zip(engine.get_inputs(), runs[0][0]):
        shape = list(getattr(a, "shape", []))
        check_static_shape(info, shape, engine.path.name, f"give --input {'x'.join(str(d) for d in info.shape or [])}")
    recipe = sidecar.recipe
    wanted, _ = module_filter(modules)
    taps = module_taps(model, method, runs[0][0], runs[0][1], wanted)
    tapped_model = tapped_wrapper(model, method, taps, runs[0][0], runs[0][1])
    wrapper, example = tapped_model.wrapper, tapped_model.example
    plan = Recipe(recipe.get("backend", "xnnpack"), recipe.get("quantize"), read_calibration(path) or [tuple(example)],
                  recipe.get("keep_float", []))
    lowered = lower(wrapper, example, plan.check())
    tapped_path = work / "tapped.pte"
    tapped_path.write_bytes(lowered.buffer)
    records = tapped_model.records()
    for r in records:  # the model's outputs under the program's names
        r["name"] = own[0] if r["path"] is None and len(own) == 1 else r["name"]
    sidecar_path(tapped_path).write_text(Sidecar(sidecar.inputs, records, sidecar.recipe).text())
    tapped = ProgramEngine(tapped_path)
    names = {(r["path"], r["call"]): r["name"] for r in records if r["path"] is not None and r["call"] is not None}
    side = ProgramSide(path, engine, tapped, own)
    if lowered.quantized is None:
        return side, names, None, None
    kept = [r["name"] for r, s in zip(records, tapped_model.same) if s is None]

    def ideal(args: tuple) -> dict[str, np.ndarray]:
        import torch

        with torch.no_grad():
            got = dict(zip(kept, lowered.quantized(*args)))
        for r in records:  # repeats, from what they repeat
            if "same_as" in r:
                got[r["name"]] = got[r["same_as"]]
        return {n: to_numpy(v) for n, v in got.items() if hasattr(v, "detach")}

    return side, names, int8_formats(lowered.quantized, kept), ideal


def int8_formats(graph: Any, names: list[str]) -> Any:
    """The int8 format of each output of a quantised graph: the scale and zero point of the dequantize that
    makes it (outputs made otherwise: float32)."""
    from ..pytorch.lowering import value_source

    out = next(n for n in graph.graph.nodes if n.op == "output")
    tensors = {}
    for name, node in zip(names, out.args[0]):
        node = value_source(node)
        target = str(getattr(node, "target", ""))
        if "dequantize_per_tensor" in target and len(node.args) >= 5:
            scale, zero, qmin, qmax = node.args[1:5]
            if all(isinstance(v, (int, float)) for v in (scale, zero, qmin, qmax)):
                fmt = Format("int8", np.array(float(scale), np.float32), np.array(int(zero), np.int64), None,
                             int(qmin), int(qmax))
                tensors[name] = fmt
    return TensorFormats(tensors)


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


def compare_program(model: Any, path: str | Path, runs: list[tuple[tuple, dict]], plan: Any, method: Any) -> Any:
    """The report of a PyTorch model against the program at ``path``, by the one driver."""

    with tempfile.TemporaryDirectory(prefix="layertap-pte-") as work:
        side, names, formats, ideal = program_sides(model, method, path, runs, Path(work), plan.modules)
        at_fp32 = formats is None or plan.criterion.precision == "fp32"
        judged = None if at_fp32 else precision_rule(formats, plan.criterion, plan.chosen)
        reference = ProgramReference(model, runs, side, names, method=method, progress=plan.progress,
                                     judging=judged, ideal=ideal if judged is not None else None,
                                     criterion=plan.criterion, modules=plan.modules, batch_outputs=plan.batch_outputs,
                                     memory_budget=plan.memory_budget)
        info = side.describe().to_dict()
        return compare_sides(reference, side, onnx_path=str(path), ort_optimizations=True,
                             runtimes={"candidate": info}, judging=judged, criterion=plan.criterion,
                             local=False, memory_budget=plan.memory_budget, progress=plan.progress)
