"""Judged at the candidate's precision: what a format costs, apart from what a file breaks.

When the candidate computes in a lower precision than its reference (a float16 or int8 file,
OpenVINO at bfloat16), every compared row carries two errors beside the plain one:

* the *format error*: an ideal run at the candidate's format (the reference's own computation
  with each value the candidate holds in a lower precision rounded to it, nothing else changed)
  against the reference: what the format costs at that row;
* the *implementation error*: the candidate against that ideal run: what the file or its
  runtime adds.

The ideal run is built from the reference: an ONNX reference's graph with rounding nodes after
each tensor the candidate holds low (:func:`~layertap.onnxfile.rounded.rounded_model`, run in
ONNX Runtime with its optimisations off, so no rounding is optimised away or fused into integer
kernels); a PyTorch reference's forward with its operators and calls rounded
(:mod:`layertap.pytorch.rounding`, from a :class:`~layertap.pytorch.rounding.RoundingPlan` made here
from the candidate's scopes). Which tensors are low comes from the candidate file and its runtime
(:func:`~layertap.onnxfile.formats.file_formats`).

The verdict (:class:`~.judging.Judging`, unless the user set ``rtol``/``atol``/``metric``): a row passes while
its implementation error stays within :data:`~layertap.metrics.FORMAT_MULTIPLE` times its format
error (plus the float32 tolerance), and fails where the format itself cannot carry the value
(:meth:`~layertap.onnxfile.formats.Format.limit`). float32 against float32 keeps the fixed rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

import numpy as np

from ..metrics import FORMAT_MULTIPLE
from ..numformats import FLOAT_LIMITS, Format, round_on_grid
from ..onnxfile.formats import TensorFormats, file_formats
from ..onnxfile.parts import PartCutter
from ..onnxfile.rounded import rounded_model
from ..onnxfile.scopemap import GraphFacts, ScopeMap
from ..onnxfile.tensor_types import element_type
from ..onnxfile.walk import holds_graphs
from ..runtimes import exact_runtime
from ..runtimes.ort_kernels import rounded_through
from ..runtimes.runner import ModelRunner
from ..runtimes.source import SessionSource
from .rows import ABSORBED, FAIL
from .torch_side import run_torch

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..pytorch.rounding import RoundingPlan
    from ..runtimes.runner import ModelRunner
    from .onnx_side import OrtSide, ScopeView

def candidate_formats(cand: "OrtSide", precision: str = "auto") -> TensorFormats:
    """The candidate's formats: its file's types and quantisers, and what its runtime computes at."""
    info = cand.describe()
    runtime_precision = info.precision if info.precision in ("bfloat16", "float16") else None
    if cand.runner.file is not None:  # an OpenVINO IR: no ONNX graph to read, only its runtime's precision

        if precision in ("auto", "int8"):
            return TensorFormats(default=Format(runtime_precision) if runtime_precision in FLOAT_LIMITS else None)
    src = cand.runner.source
    return file_formats(src.model, src.folder, src.held, runtime_precision=runtime_precision, precision=precision)


# ---------------------------------------------------------------------------
# an ONNX reference: its graph, rounded
# ---------------------------------------------------------------------------
def reference_formats(ref: "onnx.ModelProto", formats: TensorFormats) -> dict[str, Format]:
    """Each tensor of the reference file -> the format the candidate holds it in: by name (converters and
    quantisers keep names; a weight under its parameter name, with the converter's cap), else the candidate's runtime precision,
    else, where the candidate holds most of the float values it shares with the reference in one reduced
    float type, that type (an optimiser renamed the rest)."""
    names = [t for n in ref.graph.node for t in n.output if t] + [i.name for i in ref.graph.input] + \
        [i.name for i in ref.graph.initializer]
    out: dict[str, Format] = {}
    shared = [t for t in names if t in formats.tensors]
    floats = [formats.tensors[t] for t in shared if not formats.tensors[t].is_quantised]
    dominant = None
    if floats and len(floats) * 2 >= len(shared) and not formats.forced:
        kinds = {f.name for f in floats}
        dominant = Format(kinds.pop()) if len(kinds) == 1 else None
    for t in names:
        fmt = formats.weights.get(t) or formats.tensors.get(t) or formats.default or dominant
        if fmt is not None:
            out[t] = fmt
    return out


class OnnxIdeal:
    """The ideal run of an ONNX reference: its graph rounded (:func:`~layertap.onnxfile.rounded.rounded_model`),
    run in ONNX Runtime on the CPU with graph optimisations off."""

    def __init__(self, ref: "OrtSide", formats: TensorFormats) -> None:
        self.ref, self.formats = ref, formats
        self._runner: ModelRunner | None = None

    @property
    def runner(self) -> "ModelRunner":
        """Built on first use: in the driver's worker thread, beside the candidate's session build (its
        weights rounded there, numpy and ONNX Runtime letting go of the GIL)."""
        if self._runner is None:
            wanted = reference_formats(self.ref.proto, self.formats)
            ref = self.ref.runner.source
            model, held = rounded_model(ref.model, ref.folder, ref.held, wanted, _grid(self.formats), cast_round=rounded_through)
            self._runner = ModelRunner(SessionSource(model, ref.folder, held=held), exact_runtime(),
                                       label=f"the ideal run of {self.ref.path}")
        return self._runner

    def prepare(self, names: list[str]) -> None:
        self.runner.prepare(names)

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(names, feed) if names else {}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()


class OnnxIdealParts:
    """The local split's ideal part of an ONNX reference (``local=True``): for each compared call the reference's
    own computation of the row's values from the very values the candidate's part for it is fed (the nodes
    between them: the call's own, and those of calls the candidate folded into it), cut out of its graph
    (:class:`~layertap.onnxfile.parts.PartCutter`), rounded as the candidate holds every value they read and make,
    their inputs included (:func:`~layertap.onnxfile.rounded.rounded_model`), and run in ONNX Runtime with its
    optimisations off on the reference's own values: what the format costs that call alone."""

    def __init__(self, ref: "OrtSide", formats: TensorFormats) -> None:
        self.ref, self.formats = ref, formats
        source = ref.runner.source
        self.cutter = PartCutter(source.model)
        self.facts = GraphFacts(source.model.graph)
        self.smap = ScopeMap.from_model(source.model)
        self.wanted = reference_formats(source.model, formats)
        self.runtime = exact_runtime()
        self._made: tuple[Any, Any, Any] | None = None  # the last batch's parts: (rows and their feeds, shapes, plan)

    def nodes(self, item: Any, entering: Collection[str]) -> list[int]:
        """The reference's nodes computing a row's tensors from ``entering`` (reference tensors: what the
        candidate's part is fed), back to them, the graph's inputs or its weights; none where that reaches
        beyond the row's call (the two parts do not start at the same values) or holds subgraphs."""
        graph, producer = self.cutter.graph, self.cutter.producer
        own = self._own(item)
        found: set[int] = set()
        todo = list(item.ref_tensors)
        while todo:
            t = todo.pop()
            i = producer.get(t)
            if t in entering or t in self.facts.weights or i is None or i in found:
                continue
            found.add(i)
            todo.extend(x for x in graph.node[i].input if x)
            if len(found) > 4 * max(len(own), 8):
                return []
        if not found or any(holds_graphs(graph.node[i]) for i in found):
            return []
        return sorted(found)

    def _own(self, item: Any) -> list[int]:
        """The reference's nodes of the row's own call (its scope), else those making its tensors."""
        if self.smap.source != "none":
            nodes = self.smap.call_nodes(item.mc.path, item.mc.call)[0]
            if nodes:
                return list(nodes)
        return [self.cutter.producer[t] for t in item.ref_tensors if t in self.cutter.producer]

    def run(self, wants: Sequence[tuple[Any, Collection[str]]], values: Mapping[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
        """``wants``: (row item, the reference tensors its candidate part is fed); per item key, the ideal part's
        values of the row's reference tensors, run on the reference's ``values``. The parts of a batch are made
        once for every sample (the same rows fed the same tensors)."""
        plan = self._plan(wants, values)
        if plan is None:
            return {}
        engine, entering, outputs = plan
        got = engine.run(list(outputs), {name: values[t] for name, t in entering.items()})
        out: dict[int, dict[str, np.ndarray]] = {}
        for name, value in got.items():
            key, tensor = outputs[name]
            out.setdefault(key, {})[tensor] = value
        return out

    def _plan(self, wants: Sequence[tuple[Any, Collection[str]]], values: Mapping[str, np.ndarray]) -> Any:
        """``(engine, part input -> reference tensor, part output -> (item key, reference tensor))`` for ``wants``,
        made on first use (``None``: no row has an ideal part)."""
        shapes = {t: (v.dtype.str, v.shape) for t, v in values.items()}
        key = tuple((it.mc.key, tuple(fed)) for it, fed in wants)
        if self._made is not None and self._made[0] == key and self._made[1] == shapes:
            return self._made[2]
        pieces, entering_of, outputs = [], {}, {}
        ref_name: dict[str, str] = {}  # a tensor of the part -> the reference's name of it
        for k, (it, fed) in enumerate(wants):
            nodes = self.nodes(it, set(fed))
            entering = self.facts.entering(nodes)
            if not nodes or any(t not in values for t in entering):
                continue
            prefix = f"lt_ideal{k}/"
            piece = self.cutter.piece(nodes, {t: (element_type(values[t]), values[t].shape) for t in entering}, it.ref_tensors,
                                      prefix=prefix)
            pieces.append(piece)
            entering_of.update({prefix + t: t for t in entering})
            ref_name.update({prefix + t: t for i in nodes for t in self.cutter.graph.node[i].output if t})
            outputs.update({prefix + t: (it.mc.key, t) for t in it.ref_tensors if t in piece.names and t not in entering})
        plan = None
        if outputs:
            part = self.cutter.model(pieces, "layertap_ideal_part")
            ref_name.update(entering_of)
            # the weights and the nodes making them keep their names in the part
            ref_name.update({t: t for t in [*(i.name for i in part.graph.initializer),
                                            *(o for n in part.graph.node for o in n.output)] if t not in ref_name})
            wanted = {t: self.wanted[r] for t, r in ref_name.items() if r in self.wanted}
            source = self.ref.runner.source
            model, held = rounded_model(part, source.folder, source.held, wanted, _grid(self.formats), cast_round=rounded_through)
            plan = (self.runtime.open_part(SessionSource(model, source.folder, held=held), model), entering_of, outputs)
        self._made = None  # the engine before goes first
        self._made = (key, shapes, plan)
        return plan

    def needs(self, batch: Sequence[Any]) -> list[str]:
        """Reference tensors a batch's ideal parts may read beyond those the candidate's parts ask for: the
        entering tensors of each row's own call (a part may start there)."""
        out: list[str] = []
        for it in batch:
            if it.status is None and it.mc.path:
                out += [t for t in self.facts.entering(self._own(it)) if t not in out]
        return out

    def close(self) -> None:
        self._made = None


def _handed(value: Any, handed: Sequence[int], i: int, t: Any) -> Any:
    """Argument tensor ``i`` of a call run again: the result handed on where the call read it, else a copy."""
    return value if i in handed else t.clone()


def _grid(formats: TensorFormats) -> Any:
    """A weight quantised on the candidate's grid (its levels per channel), by parameter name."""
    def weight_round(name: str, value: np.ndarray) -> np.ndarray | None:
        fmt, levels = formats.weights.get(name), formats.weight_levels.get(name)
        if fmt is None or levels is None or not fmt.is_quantised:
            return None
        return round_on_grid(value, fmt, levels)

    return weight_round


# ---------------------------------------------------------------------------
# a PyTorch reference: its forward, rounded
# ---------------------------------------------------------------------------
def rounding_plan(view: "ScopeView", smap: Any, formats: TensorFormats, counterparts: Mapping[tuple[str, int], Sequence[str]],
                  cand_inputs: Sequence[str], cand_outputs: Sequence[str] = ()) -> "RoundingPlan":
    """What the ideal PyTorch forward rounds, from the candidate's scopes and formats.

    Args:
        view: the candidate's module calls under the model's paths (its ``prefix`` is stripped here too).
        smap: the candidate's ScopeMap (the module of each node).
        formats: the candidate's formats.
        counterparts: ``(path, call)`` -> the candidate tensors that answer that call.
        cand_inputs: the candidate's input names, in the order the forward's tensor arguments feed them.
        cand_outputs: the candidate's own outputs, in the order of the forward's flattened result (a result
            the candidate hands out dequantised is rounded as such, under the root's key ``("", 0)``).
    """
    from ..pytorch.rounding import RoundingPlan

    prefix = view.prefix + "." if view.prefix else ""

    def model_path(p: str | None) -> str | None:
        if p is None:
            return None
        if prefix and (p + ".").startswith(prefix):
            return p[len(prefix):]
        return "" if p == view.prefix else p

    regions = _regions(smap, formats, model_path)
    outputs: dict[tuple[str, int], list[Format | None]] = {}
    counterparts = {**counterparts, ("", 0): tuple(cand_outputs)}
    for key, tensors in counterparts.items():
        # only a value the candidate holds quantised as compared (a DequantizeLinear output); a quantised
        # tensor's own name holds its float value, and the call reading it is rounded on its input instead
        fmts = [formats.tensors.get(t) if t in formats.dequantized else None for t in tensors]
        if any(f is not None for f in fmts):
            outputs[key] = fmts
    readers: dict[str, list[int]] = {}  # tensor -> the nodes reading it, for both walks below
    for i, node in enumerate(smap.graph.node):
        for t in node.input:
            readers.setdefault(t, []).append(i)
    inputs = _quantised_inputs(view, smap, formats, readers)
    inside, followed = _quantised_inside(view, smap, formats, model_path, readers)
    weights = {n: (f, formats.weight_levels[n]) for n, f in formats.weights.items()
               if f.is_quantised and n in formats.weight_levels}
    weights = {(n[len(prefix):] if prefix and n.startswith(prefix) else n): v for n, v in weights.items()}
    model_inputs = [f if f is not None and f.is_quantised else None for f in (formats.tensors.get(n) for n in cand_inputs)]
    covered = {t for tensors in counterparts.values() for t in tensors} | set(cand_inputs)
    covered |= {t for cp in view.counterparts() for t in _entering(view, smap, cp)} | followed
    dynamic = bool(formats.dequantized) and 2 * len(formats.dequantized & covered) < len(formats.dequantized)
    return RoundingPlan(regions, outputs, inputs, weights, model_inputs, dynamic, clamp=formats.weight_clamp,
                        inside=inside)


def in_torch_order(plan: "RoundingPlan", moved: Mapping[tuple[str, int], int]) -> "RoundingPlan":
    """``plan`` (made from the graph's calls) with its calls renumbered where PyTorch's order of a module's calls
    differs from the graph's (``moved``: (path, the graph's call) -> PyTorch's call; :func:`~.align.in_call_order`);
    ``plan`` itself when nothing moved.

    Example:
        >>> from layertap.pytorch.rounding import RoundingPlan
        >>> plan = RoundingPlan(outputs={("head", 0): [None], ("head", 2): [Format("float16")]})
        >>> sorted(in_torch_order(plan, {("head", 0): 2, ("head", 2): 0}).outputs.items(), key=str)[0]
        (('head', 0), [Format('float16')])
    """
    if all(moved.get(key) == key[1] for key in moved):
        return plan

    def renumbered(table: Mapping[tuple[str, int], Any]) -> dict[tuple[str, int], Any]:
        return {(path, moved.get((path, call), call)): value for (path, call), value in table.items()}

    return dataclasses.replace(plan, outputs=renumbered(plan.outputs), inputs=renumbered(plan.inputs),
                               inside=renumbered(plan.inside))


def _entering(view: "ScopeView", smap: Any, cp: Any) -> tuple[str, ...]:
    return smap.call_nodes(_full(view, cp), cp.call)[1]


def _regions(smap: Any, formats: TensorFormats, model_path: Any) -> dict[str, str | None]:
    """Module path -> the float format most of its own nodes' float outputs are held in (the
    runtime's precision everywhere when it computes below float32)."""
    if formats.default is not None and not formats.default.is_quantised:
        return {"": formats.default.name}
    graph = smap.graph
    votes: dict[str, dict[str | None, int]] = {}
    for i, node in enumerate(graph.node):
        path = model_path(smap.module_of_node(i)) if smap.source != "none" else ""
        if path is None:
            continue
        for t in node.output:
            if not t:
                continue
            fmt = formats.tensors.get(t)
            if fmt is not None and fmt.is_quantised:
                continue
            kind = fmt.name if fmt is not None else None
            counts = votes.setdefault(path, {})
            counts[kind] = counts.get(kind, 0) + 1
    out: dict[str, str | None] = {}
    for path, counts in votes.items():
        out[path] = max(counts, key=lambda k: (counts[k], k is not None))
    if "" not in out:  # no node of the root's own: the file's most common float format
        total: dict[str | None, int] = {}
        for counts in votes.values():
            for k, n in counts.items():
                total[k] = total.get(k, 0) + n
        out[""] = max(total, key=lambda k: (total[k], k is not None)) if total else None
    return out


def _quantised_inputs(view: "ScopeView", smap: Any, formats: TensorFormats,
                      readers: Mapping[str, list[int]]) -> dict[tuple[str, int], Format]:
    """A call whose one entering float tensor the candidate quantises (a module fed by a functional op,
    ``torch.flatten``, a residual sum): that tensor's format."""
    out: dict[tuple[str, int], Format] = {}
    counterparts = view.counterparts()
    # a call another module was folded into (a BatchNorm holding its Conv) reads the Conv's input, not its own
    absorbers = {cp.absorbed_by for cp in counterparts if cp.absorbed_by}
    for cp in counterparts:
        if cp.path in absorbers:
            continue
        entering = _entering(view, smap, cp)
        if len(entering) != 1:
            continue
        t = entering[0]
        fmt = formats.tensors[t] if t in formats.dequantized else _after_layout(smap.graph, readers, formats, t)
        if fmt is not None:
            out[(cp.path, cp.call)] = fmt
    return out


def _quantised_inside(view: "ScopeView", smap: Any, formats: TensorFormats, model_path: Any,
                      readers: Mapping[str, list[int]]) -> tuple[dict[tuple[str, int], tuple[tuple[str, Format | None], ...]], set[str]]:
    """Calls whose own operators the candidate quantises between them: a value one of its own nodes makes (not a
    child module's) held quantised, that neither leaves the call nor enters a child call alone (those are
    rounded as the call's output or the child's input); an attention block quantising ``q @ k``, the softmax
    and ``attn @ v``. Per call, its own nodes of the kinds an ideal run follows (:func:`~layertap.pytorch.
    rounding.op_kind`), in graph order, with the format each one's value is held in; and the
    ``DequantizeLinear`` outputs so followed."""
    from ..pytorch.rounding import op_kind

    covered: set[str] = set()
    if formats.default is not None and not formats.default.is_quantised:
        return {}, covered
    graph = smap.graph
    edges: set[str] = set()  # what the plan rounds already: calls' outputs, and single inputs
    for cp in view.counterparts():
        _, entering, boundary = smap.call_nodes(_full(view, cp), cp.call)
        edges.update(boundary)
        if len(entering) == 1:
            edges.update(entering)
    followed: set[str] = set()  # the DequantizeLinear outputs the call in hand follows

    def held(t: str) -> Format | None:
        deq = _dequantised(graph, readers, formats, t)
        if deq is None:
            return None
        followed.add(deq)
        return formats.tensors.get(deq)

    out: dict[tuple[str, int], tuple[tuple[str, Format | None], ...]] = {}
    for cp in view.counterparts():
        full = _full(view, cp)
        path = model_path(full)
        nodes, _, _ = smap.call_nodes(full, cp.call)
        own = [(kind, graph.node[i].output[0]) for i in sorted(nodes)
               if smap.module_of_node(i) == full and graph.node[i].output
               and (kind := op_kind(graph.node[i].op_type)) is not None]
        ops = tuple((kind, held(t)) for kind, t in own)
        if path is not None and any(f is not None and t not in edges for (_, f), (_, t) in zip(ops, own)):
            out[(path, cp.call)] = ops
            covered.update(followed)
        followed.clear()
    return out, covered


def _full(view: "ScopeView", cp: Any) -> str:
    return (view.prefix + "." + cp.path) if view.prefix else cp.path


#: ops that only move values: quantising their result per tensor is quantising their input
_LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def _after_layout(graph: Any, readers: Mapping[str, list[int]], formats: TensorFormats, tensor: str) -> Format | None:
    """The per-tensor format the candidate quantises ``tensor`` in just after a layout op (a LayerNorm2d's
    ``permute`` before its quantised ``layer_norm``: the module's input, rounded inside it)."""
    for _ in range(4):
        users = readers.get(tensor, [])
        if len(users) != 1 or graph.node[users[0]].op_type not in _LAYOUT_OPS:
            return None
        tensor = graph.node[users[0]].output[0]
        deq = _dequantised(graph, readers, formats, tensor)
        fmt = formats.tensors.get(deq) if deq is not None else None
        if fmt is not None:
            return fmt if fmt.axis is None else None
    return None


def _dequantised(graph: Any, readers: Mapping[str, list[int]], formats: TensorFormats, tensor: str) -> str | None:
    """The ``DequantizeLinear`` output of the one ``QuantizeLinear -> DequantizeLinear`` pair reading ``tensor``
    (the value the candidate computes with), where the formats know it; ``None`` otherwise."""
    deq = [graph.node[d].output[0] for q in readers.get(tensor, []) if graph.node[q].op_type == "QuantizeLinear"
           for d in readers.get(graph.node[q].output[0], []) if graph.node[d].op_type == "DequantizeLinear"]
    return deq[0] if len(deq) == 1 and deq[0] in formats.dequantized else None


class TorchIdeal:
    """The ideal run of a PyTorch reference: the forward run again inside
    :func:`layertap.pytorch.rounding.rounded`, its module calls recorded like the reference's."""

    def __init__(self, plan: "RoundingPlan") -> None:
        self.plan = plan

    def run(self, model: Any, args: tuple, kwargs: dict, method: Any, store: Any, wanted: Any,
            shapes_only: Collection[str] = ()) -> Any:
        """The rounded forward's module calls, recorded into ``store`` (see :func:`.torch_side.run_torch`)."""
        from ..pytorch.rounding import rounded
        from ..pytorch.taps import bound_method

        fn = bound_method(model, method)
        with rounded(model, self.plan) as (round_inputs, round_result):
            return run_torch(model, round_inputs(args), kwargs, lambda m, *a, **k: round_result(fn(*a, **k)), store, wanted,
                             shapes_only=shapes_only)

    def local(self, model: Any, kept: Mapping[int, Any], items: Sequence[Any], store: Any) -> None:
        """Each compared call run alone at the candidate's format on the reference's own arguments (``kept``:
        :class:`~.torch_side.KeptCall` by call key), into ``store`` keyed as the reference's values: the local
        split's ideal part. The calls folded into it in the candidate (a Conv into its BatchNorm) run first, each
        handing its result on, as the candidate's part computes them; a call that cannot be run so has none, nor
        has one holding more than :data:`ALONE_CALLS` calls of its own."""
        import torch

        from ..pytorch.rounding import rounded_calls
        from ..pytorch.values import exact_float32, flatten, gpu_device, tensor_to_numpy

        folded: dict[tuple[str, int], list[int]] = {}
        for it in items:
            if it.status == ABSORBED and it.fused_into:
                folded.setdefault((it.fused_into, it.mc.call), []).append(it.mc.key)
        on_gpu = gpu_device(model, (), {}) is not None
        with torch.no_grad(), (exact_float32() if on_gpu else contextlib.nullcontext()), rounded_calls(model, self.plan) as run:
            for it in items:
                if it.status is not None or not it.mc.path or it.mc.key not in kept:
                    continue
                if it.mc.key - kept[it.mc.key].first > ALONE_CALLS:
                    continue  # a large parent: its own part is most of the model, judged by the whole run
                chain = [k for k in folded.get((it.mc.path, it.mc.call), []) if k in kept] + [it.mc.key]
                out = _chain(run, kept, chain)
                if out is not None:
                    store.put(it.mc.key, [tensor_to_numpy(t, copy=True) for _, t in flatten(out)])


#: a module run alone at the format holds at most this many calls of its own (a ResNet block holds 7, a DenseNet
#: block up to 150: running every parent again would cost the depth of the model times its forward)
ALONE_CALLS = 24


def _chain(run: Any, kept: Mapping[int, Any], chain: Sequence[int]) -> Any:
    """The calls of ``chain`` run one after the other (``run``: :func:`~layertap.pytorch.rounding.rounded_calls`'s),
    each on its own arguments with the output of the one before in place of the tensor it returned then;
    ``None`` when they do not connect so, or one fails."""
    from ..pytorch.rounding import map_tensors

    value, before = None, None
    for key in chain:
        call = kept[key]
        handed: list[int] = [i for i, src in call.producers.items() if src == (before, 0)] if before is not None else []
        if before is not None and (not handed or not hasattr(value, "shape")):
            return None
        args, kwargs = map_tensors((call.args, call.kwargs), functools.partial(_handed, value, handed))
        try:
            value = run(call.module, args, kwargs, call.counts)
        except Exception:  # noqa: BLE001 - a module that cannot run again alone has no local split
            return None
        before = key
    return value


def weigh_limits(rows: Sequence[Any], rtol: float) -> list[Any]:
    """One sample's rows, where each value its format cannot carry (a row's ``limit``) fails that row when it
    matters, and is only noted when it does not.

    It matters when the module around it (the first later compared row of an enclosing module, else of the
    model's output, else the next compared row) shows a format error beyond what the format costs elsewhere
    in this run: more than :data:`~layertap.metrics.FORMAT_MULTIPLE` times the median format error of the rows
    without a limit before it, plus ``rtol``, or not finite. An overflow to infinity or a zeroed factor carry
    on; a mask value float16 turns into its own infinity, or a branch too small to count zeroed before a
    residual sum, do not. A quantiser's range that clips a share of the values
    (:data:`~layertap.numformats.CLIP_SHARE`) always fails its row.

    Example:
        >>> from layertap.comparing.rows import CompareRow
        >>> def row(name, fmt, limit=None):
        ...     return CompareRow(name, name, 0, "-", [1], 0.0, 0.0, "pass", True, format_rel=fmt, limit=limit)
        >>> out = weigh_limits([row("a", 1e-3), row("b.c", 1.0, "float16 underflow: ..."), row("b", 2e-3)], 1e-3)
        >>> [(r.name, r.ok) for r in out]
        [('a', True), ('b.c', True), ('b', True)]
        >>> weigh_limits([row("a", 1e-3), row("b.c", 1.0, "float16 overflow: ..."), row("b", 0.9)], 1e-3)[1].status
        'FAIL'
    """
    out = list(rows)
    if not any(r.ok is not None and r.limit for r in out):
        return out
    for i, row in enumerate(out):
        if row.ok is None or not row.limit:
            continue
        if row.precision == "int8":  # a range that clips a share of the values: always the quantiser's fault
            out[i] = dataclasses.replace(row, ok=False, status=FAIL)
            continue
        bound = FORMAT_MULTIPLE * _typical(out, i) + rtol
        after = _effect_row(out, i)
        shown = after.format_rel if after is not None else None
        if after is not None and shown is not None and np.isfinite(shown) and shown <= bound:
            note = (f"{row.limit}, without effect on {after.name} (its format error {shown:.3g} stays within what the "
                    "format costs elsewhere)")
            out[i] = dataclasses.replace(row, limit=None, note=f"{note}; {row.note}" if row.note else note)
        else:
            out[i] = dataclasses.replace(row, ok=False, status=FAIL)
    return out


def _typical(rows: Sequence[Any], i: int) -> float:
    """The median format error of the compared rows without a limit before ``rows[i]`` (else of all of them)."""
    def plain(some: Sequence[Any]) -> list[float]:
        return sorted(r.format_rel for r in some if r.ok is not None and not r.limit and r.format_rel is not None
                      and np.isfinite(r.format_rel))

    found = plain(rows[:i]) or plain(rows)
    return found[(len(found) - 1) // 2] if found else 0.0


def _effect_row(rows: Sequence[Any], i: int) -> Any:
    """Where a limit at ``rows[i]`` shows its effect: the first later compared row without a limit of its own
    whose module encloses it (the output's row encloses every one), else the next such row."""
    path = rows[i].path
    later = [r for r in rows[i + 1:] if r.ok is not None and not r.limit and r.format_rel is not None]
    for r in later:
        if r.path == "" or path.startswith(r.path + "."):
            return r
    return later[0] if later else None


def fail_differing_weights(rows: Sequence[Any], precision: str) -> None:
    """Judged at the candidate's precision, a parameter that differs beyond what its format's rounding
    explains (:mod:`.weights`, named on its module's row) is a fault: the row fails, in place; a module
    folded into another (a Conv into its BatchNorm) fails the row it was fused into, else the next compared row.

    Example:
        >>> from layertap.comparing.rows import CompareRow
        >>> rows = [CompareRow("conv1", "conv1", 0, "Conv2d", [1], None, None, "absorbed", None, fused_into="bn1",
        ...                    weights="conv1.weight differs (rel 0.05)"),
        ...         CompareRow("bn1", "bn1", 0, "BatchNorm2d", [1], 1e-3, 1e-3, "pass", True)]
        >>> fail_differing_weights(rows, "float16")
        >>> rows[1].status, rows[1].note
        ('FAIL', 'conv1.weight differs (rel 0.05): more than float16 rounding explains')
        >>> row = CompareRow("fc", "fc", 0, "Linear", [1], 1e-3, 1e-3, "pass", True, format_rel=1e-3, impl_rel=1e-4,
        ...                  weights="fc.weight differs (rel 0.002)")
        >>> fail_differing_weights([row], "int8")
        >>> row.status, row.note.endswith("(its effect on fc's values is below int8's rounding here)")
        ('FAIL', True)
    """
    for i, row in enumerate(rows):
        if not row.weights:
            continue
        target = row if row.ok is not None else next(
            (r for r in rows[i + 1:] if r.ok is not None and (row.fused_into is None or r.name == row.fused_into)), None)
        if target is None:
            continue
        why = f"{row.weights}: more than {precision} rounding explains"
        if target.ok and target.impl_rel is not None:  # a change whose effect its row's numbers do not show: said
            why += f" (its effect on {target.name}'s values is below {precision}'s rounding here)"
        if target is not row or target.ok:
            target.note = f"{why}; {target.note}" if target.note else why
        target.ok, target.status = False, FAIL
