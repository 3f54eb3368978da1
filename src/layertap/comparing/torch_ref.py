"""A PyTorch model as the reference of :mod:`.driver`: one hooked forward per sample, its
module calls planned against the candidate file's scopes (:func:`~.align.plan_items`).

The forward's values wait in the sample's :class:`~.torch_side.ArrayStore` (spilling to disk
beyond the budget) until the candidate's batches of that sample ran.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import one_line
from ..metrics import Criterion
from ..onnxfile.kvcache import check_config, kv_layout
from ..onnxfile.metadata import own_outputs
from ..onnxfile.scopemap import ScopeMap, is_fused_llm, skip_norm_inputs
from ..onnxfile.scopemap.lent import Exported, Lending, lend_scopes
from ..onnxfile.shapes import static_dims
from ..onnxfile.tensor_types import declared_types, inferred_types
from .align import Item, RowBuilder, absorbed_modules, call_counts, plan_items
from .driver import Sample, Silent, module_filter, plan_batches
from .ideal import TorchIdeal, in_torch_order, rounding_plan
from .judging import Judging
from .local_errors import LocalInputs, torch_ref_inputs
from .onnx_side import IF_BRANCHES, OrtSide, ScopeView, absorb_unexposable, check_feed_shapes, check_same_model, feed_from_args
from .rows import NO_COUNTERPART
from .torch_side import ArrayStore, run_torch
from .weight_check import PendingCheck, WeightCheck, check_model_weights

#: said when a PyTorch reference meets a file with ORT's NCHWc kernels
NCHWC_NOTE = ("the file holds ONNX Runtime's NCHWc kernels (saved at ORT_ENABLE_ALL), whose tensors are in a blocked "
              "layout: compare it with the file it was optimised from as the reference (compare SRC.onnx THIS.onnx), "
              "or save it at ORT_ENABLE_EXTENDED")


def _lend_scopes(model: Any, method: str | Callable[..., Any], runs: list[tuple[tuple, dict]],
                 proto: Any) -> Lending | None:
    """A file with no module scopes at all takes the model's own, from a fresh export (:mod:`~layertap.onnxfile.scopemap.lent`).

    ``None``: no sample to export with, nothing lent.
    """
    if not runs:
        return None
    from ..pytorch.exporter import dynamo_graph  # the exporter loads only for a file without scopes

    try:
        exported = Exported.of_model(dynamo_graph(model, runs[0][0], runs[0][1], method))
    except Exception as e:  # noqa: BLE001 - any exporter failure only means no scopes are lent
        return Lending(0, 0, f"the dynamo exporter failed: {one_line(e, limit=200)}")
    return lend_scopes(proto, exported)


class TorchReference:
    """The model and its samples (``(args, kwargs)`` each) against the candidate ``cand``."""

    holds_values = True
    own_runs: tuple[OrtSide, ...] = ()  # the forward runs in PyTorch

    def __init__(self, model: Any, runs: list[tuple[tuple, dict]], cand: OrtSide, *, method: str | Callable[..., Any],
                 criterion: Criterion, modules: Sequence[str] | None, batch_outputs: int | None, memory_budget: int,
                 allow_different_weights: bool, progress: Any, local: bool = False, judging: Judging | None = None,
                 ideal: bool = True) -> None:
        self.model, self.method, self.runs_args, self.prog, self.local = model, method, runs, progress, local
        self.n_samples, self.criterion, self.judging = len(runs), criterion, judging
        self.cand, self.batch_outputs, self.budget = cand, batch_outputs, memory_budget
        self.cand_scopes = ScopeMap.from_model(cand.proto, branches=IF_BRANCHES)
        self.lending = _lend_scopes(model, method, runs, cand.proto) if self.cand_scopes.source == "none" else None
        if self.lending is not None and self.lending.refused is None:
            self.cand_scopes = ScopeMap.from_model(cand.proto, branches=IF_BRANCHES)
        self.view = ScopeView(self.cand_scopes, {p for p, _ in model.named_modules() if p})
        self.layout = kv_layout(cand.proto.graph)
        if self.layout is not None:  # before the weight check: a differently shaped model is named as such
            check_config(self.layout, getattr(model, "config", None))
        check_same_model(self.view, model, cand.path)
        self.wanted, self.include_root = module_filter(modules, [p for p, _ in model.named_modules()])
        self.absorbed = absorbed_modules(self.view)  # their values are not in the file: the forward keeps shapes only
        self.outputs = own_outputs(cand.proto)
        self._stores: list[ArrayStore] = []  # every sample's store (the driver releases each as its rows are made)
        # the candidate's shapes, read when a module ran several times: declared in the file, else inferred
        self._declared: dict[str, Any] | None = None
        self._shapes: dict[str, Any] | None = None
        # judged at the candidate's precision: the forward run again, rounded as the candidate holds its values
        self.ideal = self._ideal() if judging is not None and ideal else None
        self._plan = self.ideal.plan if self.ideal is not None else None  # as the graph numbers calls
        # the weight check starts after the forward, beside the candidate's session build (see PendingCheck)
        self._weights = PendingCheck(lambda stop: check_model_weights(model, self.view, cand.runner.source, stop),
                                     allow_different_weights, start=False)
        # Inputs first: a wrong number or shape of arguments should not cost a forward.
        with self._weights.named_first():
            self.feeds = [feed_from_args(cand.inputs, a, k, layout=self.layout, config=getattr(model, "config", None))
                          for a, k in runs]
            for feed in self.feeds:
                check_feed_shapes(feed, cand.runner.input_shapes())

    def sample(self, index: int, budget: int) -> Sample:
        """Run the forward of sample ``index`` into a store of ``budget`` bytes; plan its batches."""
        store = ArrayStore(budget)
        self._stores.append(store)  # closed by close() too: a signal before the driver holds it leaves no spilled values
        prog = self.prog if self.prog is not None else Silent()
        prog.step("PyTorch forward")
        a, k = self.runs_args[index]
        # judged at the format with local errors: every call's arguments kept, to run it again alone at the format
        kept: dict[int, Any] | None = {} if self.local and self.ideal is not None else None
        calls, root = run_torch(self.model, a, k, self.method, store, self.wanted, inputs=self.local, kept=kept,
                                shapes_only=self.absorbed)
        prog.advance()
        shapes = (lambda mc: self._torch_shape(store, mc), self._onnx_shape)
        items = [self._refuse_blocked(it) for it in plan_items(calls, root, self.view, self.outputs, self.include_root, shapes)
                 if self.wanted(it.mc.path) or it.mc is root]
        absorb_unexposable(items, self.cand)
        if self.ideal is not None and self._plan is not None:  # the plan names calls as the graph does: in PyTorch's order
            self.ideal.plan = in_torch_order(self._plan, {(it.mc.path, it.onnx_call): it.mc.call for it in items
                                                          if it.onnx_call is not None})
        ideal = self._ideal_values(a, k, calls, budget) if self.ideal is not None else None
        builder = RowBuilder(items, store, self.criterion, call_counts(calls), branches=self.cand.carried,
                             judging=self.judging, ideal=ideal)

        def cost(item: Item) -> tuple[int, int]:  # estimated from the PyTorch sizes
            n = len(item.tensors)
            return n, store.nbytes(item.mc.key) if n else 0

        sample = Sample(items, builder, plan_batches(items, cost, self.batch_outputs, self.budget), self.feeds[index])
        if kept and self.ideal is not None:
            sample.local_ideal = self._alone(kept, items, budget)
        return sample

    @staticmethod
    def _torch_shape(store: ArrayStore, mc: Any) -> tuple[int, ...] | None:
        """A call's first output shape as the forward recorded it (``None``: not recorded)."""
        shapes = store.shapes(mc.key)
        return tuple(shapes[0]) if shapes else None

    def _onnx_shape(self, name: str) -> tuple[int, ...] | None:
        """A candidate tensor's static shape (``None``: unknown or symbolic): as the file declares it, else as
        ONNX shape inference finds it (run once, and only for a tensor the file declares no static shape of:
        the first inference in a process costs 10-20 ms of set-up, on resnet50 whose file declares them all)."""
        if self._declared is None:
            self._declared = {n: static_dims(vi) for n, vi in declared_types(self.cand.proto.graph).items()}
        dims = self._declared.get(name)
        if dims is None:
            if self._shapes is None:
                self._shapes = {n: static_dims(vi) for n, vi in inferred_types(self.cand.proto).items()}
            dims = self._shapes.get(name)
        return dims

    def _alone(self, kept: dict[int, Any], items: list[Item], budget: int) -> ArrayStore:
        """Every compared call run alone at the candidate's format on its own arguments (the local split's ideal part)."""
        assert self.ideal is not None and self.judging is not None
        store = ArrayStore(budget)
        self._stores.append(store)
        prog = self.prog if self.prog is not None else Silent()
        prog.step(f"each module alone at {self.judging.precision}")
        self.ideal.local(self.model, kept, items, store)
        kept.clear()  # the arguments' copies go now
        prog.advance()
        return store

    def _ideal(self) -> TorchIdeal:
        """The rounded forward's plan, from the candidate's scopes and formats."""
        assert self.judging is not None
        cand_inputs = [n for n, _ in self.cand.inputs]
        counterparts = {(c.path, c.call): tuple(c.tensors) for c in self.view.counterparts() if c.tensors}
        return TorchIdeal(rounding_plan(self.view, self.cand_scopes, self.judging.formats, counterparts, cand_inputs,
                                        self.outputs))

    def _ideal_values(self, args: tuple, kwargs: dict, calls: list[Any], budget: int) -> ArrayStore | None:
        """The ideal forward of one sample in a store keyed as the reference's (``None`` when its module
        calls differ: a data-dependent branch took another way; or when it failed, which the report says)."""
        assert self.ideal is not None and self.judging is not None
        store = ArrayStore(budget)
        self._stores.append(store)
        prog = self.prog if self.prog is not None else Silent()
        prog.step(f"PyTorch forward at {self.judging.precision if self.judging else 'the format'}")
        try:
            ideal_calls, _ = self.ideal.run(self.model, args, kwargs, self.method, store, self.wanted, self.absorbed)
        except Exception as e:  # noqa: BLE001 - an aid, never a gate: the comparison goes on by the fixed rule
            store.close()
            self.judging.give_up(e)
            self.ideal = None
            return None
        prog.advance()
        if [(c.path, c.call) for c in ideal_calls] != [(c.path, c.call) for c in calls]:
            store.close()
            return None
        return store

    def prepare(self, batch: list[Item], parts: Any) -> None:
        pass  # nothing runs per batch: the forward ran when the sample was planned

    def values(self, sample: Sample, batch: list[Item], parts: Any) -> dict[str, np.ndarray]:
        return {}  # the forward's values are in the sample's store

    def ideal_values(self, sample: Sample, batch: list[Item]) -> dict[str, np.ndarray]:
        return {}  # the ideal forward's values are in the sample's ideal store

    def local_inputs(self, sample: Sample, batch: list[Item], ref_values: dict[str, np.ndarray],
                     cand_values: dict[str, np.ndarray]) -> LocalInputs:
        pairs_of, ref_of = torch_ref_inputs(sample.builder, sample.feed, sample.items, self._named_inputs(), sample.local_ideal)
        return pairs_of, ref_of, lambda it, row: row.onnx, None  # the calls ran alone after the forward

    def _named_inputs(self) -> dict[str, str]:
        """ONNX tensors the file computes as a module's input (a fused skip-norm's residual sum)."""
        graph = self.cand.proto.graph
        return skip_norm_inputs(graph) if is_fused_llm(graph) else {}

    def notes(self, candidate: Any, rounding: bool) -> list[str]:
        notes = candidate.notes(None, rounding)
        if getattr(self.model, "training", False):
            notes.append("the model is in training mode (dropout, batch statistics): call model.eval() before comparing")
        from ..pytorch.values import gpu_device

        device = gpu_device(self.model, *self.runs_args[0]) if self.runs_args else None
        if device is not None:  # the rule run_torch applies
            notes.append(f"the PyTorch forward ran on {device} in full float32 (PyTorch's default there, TF32 "
                         "convolutions, is about 1e-3 from float32 on its own)")
        if self.lending is not None:
            notes.append(self.lending.note())
        elif self.view.source == "none":
            notes.append(
                "the ONNX file carries no module scopes (not from torch.onnx.export), so only the model output is compared"
            )
        if self.view.prefix:
            notes.append(f"the file's module scopes carry the prefix '{self.view.prefix}.' (exported through a wrapper); stripped")
        if self.cand.blocked:
            notes.append(NCHWC_NOTE)
        return notes

    def start_weight_check(self) -> None:
        """Start the weight check: after the forward, beside the candidate's session build."""
        self._weights.start()

    def checked_weights(self, beside: Callable[[], Any] | None = None) -> WeightCheck:
        """The weight check, run beside ``beside()``; raises :class:`~.weights.DifferentWeightsError` on another checkpoint."""
        return self._weights.result(beside)

    def close(self) -> None:
        self._weights.cancel()
        for store in self._stores:
            store.close()

    def _refuse_blocked(self, item: Item) -> Item:
        """A call answered by a tensor in ORT's NCHWc layout is not compared with PyTorch's NCHW value."""
        if item.status is None and self.cand.blocked.intersection(item.tensors):
            item.status, item.tensors, item.unverified = NO_COUNTERPART, (), None
            item.note = "its ONNX tensor is in ONNX Runtime's blocked NCHWc layout (a file saved at ORT_ENABLE_ALL)"
        return item
