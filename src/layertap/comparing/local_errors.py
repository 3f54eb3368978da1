"""``local=True``: the error each module call makes by itself.

For every compared call, the candidate's nodes of that call are copied into one in-memory
graph per batch (tensors renamed per call, weights shared by name), whose inputs are the
tensors the call reads from outside. They are fed the *reference's* values of those tensors,
so the outputs carry only the error this call adds; ``local_rel`` is their rel error
against the reference. A reference value is found for a tensor that is a graph input, a
tensor another row compared (the reference's tensor paired with it), or, seen through the
converter's ``Cast``/``QuantizeLinear``/``DequantizeLinear`` nodes, such a tensor. When one
input has none, the row says so and ``local_rel`` stays ``None``.

Never imports torch (the PyTorch reference's values come as numpy from the value store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..metrics import Criterion, ErrorStats, ideal_stats
from ..onnxfile.parts import PartCutter
from ..onnxfile.scopemap import GraphFacts, ScopeMap
from ..onnxfile.shapes import declared_dims
from ..onnxfile.tensor_types import element_type, inferred_types
from ..onnxfile.walk import holds_graphs
from ..runtimes.ort_kernels import nchwc_block_size
from ..text import fmt_float
from .align import Item
from .nchwc import block, blocked_tensors, unblock
from .rows import FAIL, PASS, CompareRow, merge_stats, pair_tensors, relative, same_shape
from .torch_side import input_key

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..runtimes import Runtime
    from ..runtimes.source import SessionSource

_SEE_THROUGH = {"Cast", "QuantizeLinear", "DequantizeLinear", "Identity"}

RefLookup = Callable[[str], "np.ndarray | None"]  # candidate tensor -> the reference's value, or None
#: a row's (reference value, candidate tensor, the ideal part's value or None)
Pair = tuple[np.ndarray, str, "np.ndarray | None"]
#: a call's part as fed: (the reference's values by candidate tensor, the part's nodes), or why it cannot be
Feeding = tuple[dict[str, np.ndarray], list[int]] | str


class LocalGraph:
    """The candidate's nodes of several calls, each fed on its own (see module doc)."""

    def __init__(self, source: "SessionSource", runtime: "Runtime", scopes: "ScopeMap | None" = None) -> None:
        self.sessions = source  # the candidate, its weights held once for every part run
        self.cand = cand = source.model
        self.runtime = runtime
        # the file's map the reference read, unless it counts nodes in a view with subgraphs inlined
        self.smap = scopes if scopes is not None and scopes.graph is cand.graph else ScopeMap.from_model(cand)
        self.facts = GraphFacts(cand.graph)
        self.cutter = PartCutter(cand, self.facts)
        self.types = inferred_types(cand)
        self.producer = self.cutter.producer
        self.inits = self.cutter.inits
        self.graph_inputs = [i.name for i in cand.graph.input if i.name not in self.inits]
        self._last: tuple[bytes, Any] | None = None
        # tensors in ORT's NCHWc layout (an ORT_ENABLE_ALL file): fed blocked, read back as NCHW
        self.blocked = blocked_tensors(cand.graph)
        self.block = 0
        if self.blocked:
            self.block = nchwc_block_size() or 0

    def part(self, path: str, call: int, tensors: Sequence[str]) -> tuple[list[int], tuple[str, ...]]:
        """Nodes and entering tensors of a call (its module scope, else the nodes making ``tensors``)."""
        if path and self.smap.source != "none":
            nodes, entering, _ = self.smap.call_nodes(path, call)
            made = {o for i in nodes for o in self.cand.graph.node[i].output}
            # a value a fused node of the next scope holds (a decoder layer's residual sum): that node too
            outside = {self.producer[t] for t in tensors if t not in made and t in self.producer}
            if nodes and outside:
                nodes = sorted({*nodes, *outside})
                return nodes, self.facts.entering(nodes)
            if nodes:
                return nodes, entering
        # a tensor row (no module scopes): the nodes that make it, from the reference's tensor of that
        # name through the conversion after it (a QDQ file's Q/DQ pair), so its own node is in the part
        name = path if self.smap.source == "none" else ""  # a module path may equal a tensor name (dynamo's relu)
        chains = [s for t in tensors for s in self._made_from(t, name)]
        nodes = sorted({self.producer[s] for s in chains if s in self.producer})
        return nodes, self.facts.entering(nodes)

    def _made_from(self, tensor: str, name: str) -> list[str]:
        """``tensor`` back through Cast / Q / DQ to the tensor ``name``, if it was converted from it."""
        chain = self.source(tensor)
        return chain[:chain.index(name) + 1] if name and name in chain else [tensor]

    def source(self, tensor: str) -> list[str]:
        """``tensor`` and what it was converted from (through Cast / Q / DQ), nearest first."""
        out = [tensor]
        while out[-1] in self.producer and len(out) < 16:
            node = self.cand.graph.node[self.producer[out[-1]]]
            if node.op_type not in _SEE_THROUGH or not node.input:
                break
            out.append(node.input[0])
        return out

    def run(self, jobs: Sequence[tuple[int, list[int], tuple[str, ...], Sequence[str]]], ref_of: RefLookup,
            feedings: Mapping[int, Feeding] | None = None) -> dict[int, dict[str, np.ndarray] | str]:
        """``jobs``: ``(job id, nodes, entering, outputs)``. Returns per job the candidate's outputs
        computed from the reference's inputs, or why that cannot be done. ``feedings``: each job's
        :meth:`feeding`, where the caller made it already."""
        results: dict[int, dict[str, np.ndarray] | str] = {}
        pieces: list[Any] = []
        feed: dict[str, np.ndarray] = {}
        wanted: dict[int, dict[str, str]] = {}
        for job, nodes, entering, outs in jobs:
            feeding = feedings[job] if feedings is not None else self.feeding(entering, nodes, ref_of)
            if isinstance(feeding, str):
                results[job] = feeding
                continue
            fed, nodes = feeding
            fed = {s: self._typed(s, v) for s, v in fed.items()}
            fed = {s: block(v, self.block) if s in self.blocked else v for s, v in fed.items()}
            piece = self.cutter.piece(nodes, {t: (element_type(v), v.shape) for t, v in fed.items()}, outs, prefix=f"lt_local{job}/")
            feed.update({piece.names[t]: v for t, v in fed.items()})
            pieces.append(piece)
            wanted[job] = {t: piece.names[t] for t in outs if t in piece.names and t not in fed}
        if not any(p.outputs for p in pieces):
            return results
        model = self.cutter.model(pieces, "layertap_local")
        names = [o.name for p in pieces for o in p.outputs]
        try:
            got = self._session(model).run(names, feed)
        except Exception as e:  # noqa: BLE001 - the runtime's own message
            why = f"{self.runtime.describe().runtime} cannot run the candidate's part alone: {' '.join(str(e).split())[:160]}"
            for job in wanted:
                results[job] = why
            return results
        for job, renamed in wanted.items():
            results[job] = {t: got[r] for t, r in renamed.items()}
        return results

    def feeding(self, entering: Sequence[str], nodes: Sequence[int], ref_of: RefLookup) -> Feeding:
        """The reference's values for a call's part (as the reference holds them) and the
        part's nodes, the conversion nodes it must run included; or why there is none."""
        feeding = self._feed(entering, ref_of)
        if isinstance(feeding, str):
            return feeding
        fed, converting = feeding
        # a value found before a quantiser the part reads from its own nodes (the call's scope left that
        # QuantizeLinear out): the part computes it, and runs the quantiser after it
        made = {t for i in nodes for t in self.cand.graph.node[i].output}
        fed = {t: v for t, v in fed.items() if t not in made}
        nodes = sorted({*nodes, *converting})
        if any(holds_graphs(self.cand.graph.node[i]) for i in nodes):
            return "the call holds control flow (subgraphs); its part cannot be run alone"
        return fed, nodes

    def _session(self, model: "onnx.ModelProto") -> Any:
        """A session on the part graph; the last one is reused while the graph is the same
        (the next sample of a batch feeds other values to the same part)."""
        key = model.SerializeToString()
        if self._last is None or self._last[0] != key:
            self._last = None  # free the old session first
            self._last = (key, self.runtime.open_part(self.sessions, model))
        return self._last[1]

    def _feed(self, entering: Sequence[str], ref_of: RefLookup) -> tuple[dict[str, np.ndarray], set[int]] | str:
        """The reference's values for the part's inputs, and the conversion nodes the part must run.

        A value found upstream of ``Cast``/``QuantizeLinear``/``DequantizeLinear`` nodes is fed
        where the reference has it and the part runs those nodes too: a float value goes into
        the candidate's ``QuantizeLinear``, never into its int8 tensor.
        """
        fed: dict[str, np.ndarray] = {}
        converting: set[int] = set()
        for t in entering:
            chain = self.source(t)
            k, value = next(((k, v) for k, v in enumerate(ref_of(s) for s in chain) if v is not None), (0, None))
            if value is None and (made := self.from_inputs(t)) is not None:
                inputs = {i: ref_of(i) for i in self.facts.entering(sorted(made))}
                if all(v is not None for v in inputs.values()):
                    converting.update(made)
                    fed.update({i: v for i, v in inputs.items() if v is not None})
                    continue
            if value is None:
                return f"its input {t} has no reference value (the boundary cannot be matched)"
            s = chain[k]
            converting.update(self.producer[c] for c in chain[:k])
            fed[s] = value
        return fed, converting

    def from_inputs(self, t: str) -> set[int] | None:
        """The nodes computing ``t`` from graph inputs alone, none of them in a module (a fused
        decoder's attention-mask lengths), or ``None``: the part runs them on the same inputs."""
        nodes: set[int] = set()
        todo = [t]
        while todo:
            name = todo.pop()
            if name in self.inits or name in self.graph_inputs or not name:
                continue
            n = self.producer.get(name)
            if n is None or self.smap.module_of_node(n) is not None or len(nodes) > 64:
                return None
            if n not in nodes:
                nodes.add(n)
                todo.extend(self.cand.graph.node[n].input)
        return nodes or None

    def has_value(self, t: str, ref_of: RefLookup) -> bool:
        """Whether a call's part can be fed ``t``: a reference value (through conversions), or nodes from graph inputs."""
        return t in self.graph_inputs or any(ref_of(s) is not None for s in self.source(t)) or self.from_inputs(t) is not None

    def fits(self, t: str, value: np.ndarray) -> bool:
        """Whether ``value`` can be tensor ``t``: its declared dims (where known) and element count agree."""
        vi = self.types.get(t)
        dims = _sizes(vi) if vi is not None else None
        if dims is None:
            return True
        if all(dims):
            return math.prod(dims) == value.size
        return len(dims) == value.ndim and all(d in (0, v) for d, v in zip(dims, value.shape))

    def as_reference(self, name: str, value: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        """A locally computed output in the reference's layout (NCHW for a blocked tensor)."""
        return unblock(value, shape, self.block) if name in self.blocked else value

    def _typed(self, t: str, value: np.ndarray) -> np.ndarray:
        """The reference's value in the candidate's type and declared shape (float16 for a float16 file)."""
        a, dtype = self.declared(t, value)
        if dtype is not None:
            a = a.astype(dtype, copy=False)
        return np.ascontiguousarray(a)

    def declared(self, t: str, value: np.ndarray) -> tuple[np.ndarray, Any]:
        """The reference's value in the declared shape of candidate tensor ``t``, and the numpy type
        the candidate holds it in (``None`` when unknown)."""
        import onnx

        vi = self.types.get(t)
        a = np.asarray(value)
        dtype = None
        if vi is not None and vi.type.tensor_type.elem_type:
            try:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            except (KeyError, TypeError, ValueError):
                pass
            dims = _sizes(vi)
            if dims is not None and all(dims) and math.prod(dims) == a.size and tuple(dims) != a.shape:
                a = a.reshape(dims)
        return a, dtype


def _sizes(vi: Any) -> list[int] | None:
    """A tensor's declared sizes, 0 where symbolic (``None`` when it declares no shape)."""
    dims = declared_dims(vi)
    return None if dims is None else [d if isinstance(d, int) else 0 for d in dims]


def local_stats(outputs: dict[str, np.ndarray], pairs: Sequence[Pair], criterion: Any,
                graph: "LocalGraph | None" = None) -> ErrorStats | None:
    """The worst statistics of the locally computed outputs against the reference's values (read in the
    reference's layout through ``graph``); with the ideal part's values (a pair's third member), also the
    local split: ``format_abs`` (the ideal part against the reference: what the format costs this call
    alone) and ``impl_abs`` (the candidate's part against the ideal part: what the file adds here)."""
    stats = []
    for ref, name, ideal in pairs:
        got = outputs.get(name)
        if got is None:
            continue
        if graph is not None:
            got = graph.as_reference(name, got, ref.shape)
        if got.shape != ref.shape and got.size == ref.size:
            got = got.reshape(ref.shape)
        if got.shape != ref.shape:
            continue
        if np.issubdtype(got.dtype, np.floating) and got.dtype != ref.dtype:
            got = got.astype(ref.dtype)
        st = criterion.judge(ref, got)
        if ideal is not None and np.shape(ideal) == ref.shape:
            split = ideal_stats(ref, got, np.asarray(ideal))
            st = dataclasses.replace(st, format_abs=split.format_abs, impl_abs=split.impl_abs, format_rms=split.format_rms,
                                     impl_rms=split.impl_rms, ref_rms=split.ref_rms, impl_gain=split.impl_gain,
                                     ideal_rms=split.ideal_rms)
        stats.append(st)
    if not stats:
        return None
    merged = merge_stats(stats)
    whole = all(st.format_abs is not None for st in stats)  # every tensor of the call has its ideal value
    return merged if whole else dataclasses.replace(merged, format_abs=None, impl_abs=None)


def annotate(row: CompareRow, stats: ErrorStats | None, why: str | None, judging: Any = None, criterion: Any = None) -> None:
    """Set ``local_rel`` (and the local split) on a row, or say why it has none; judged at the candidate's
    precision, the local split decides the row (see :func:`judge_locally`)."""
    row.local_rel = stats.rel_err if stats is not None else None
    if why:
        row.note = f"{row.note}; local: {why}" if row.note else f"local: {why}"
    if stats is None or stats.format_abs is None or stats.impl_abs is None:
        return
    row.local_format_rel, row.local_impl_rel = relative(stats.format_abs, stats.scale), relative(stats.impl_abs, stats.scale)
    row.local_impl_gain = stats.impl_gain
    if judging is not None and judging.decides and not judging.lost and row.ok is not None:
        judge_locally(row, stats, criterion)


def judge_locally(row: CompareRow, stats: ErrorStats, criterion: Any = None) -> None:
    """A row judged by its own part (the local split), in place: it passes while the candidate's part adds no
    more than :data:`~layertap.metrics.FORMAT_MULTIPLE` times what the format costs that part alone (plus the
    tolerance), in the largest difference and in the root mean square one. A fault whose effect on the
    whole run stays within the format's accumulated noise here still stands out against the part's own
    rounding; a row that fails as a whole but not on its own inherited its error from before it (said in
    its note). A value the format cannot carry (``limit``) is weighed later, as for the whole run."""
    if row.limit:
        return
    rule = criterion if criterion is not None else Criterion()
    ok = stats.within_format(rule.rtol, rule.atol) and (row.finite is not False or not rule.check_finite)
    if row.ok is False and ok:
        row.note = (f"{row.note}; " if row.note else "") + ("its own part is within what the format explains (local "
                                                          f"impl {fmt_float(row.local_impl_rel)}, format "
                                                          f"{fmt_float(row.local_format_rel)}): the error comes from before it")
    row.ok, row.status = ok, (PASS if ok else FAIL)


# ---------------------------------------------------------------------------
# the two references
# ---------------------------------------------------------------------------
def ref_pairs(item: Item, ref_values: dict[str, np.ndarray], cand_shapes: dict[str, tuple]) -> list[tuple[str, str]]:
    """(reference tensor, candidate tensor) of an ONNX-reference row: by position, else by shape."""
    refs, cands = list(item.ref_tensors), list(item.tensors)
    shapes_r = [tuple(ref_values[t].shape) if t in ref_values else () for t in refs]
    shapes_c = [cand_shapes.get(t, ()) for t in cands]
    if len(refs) == len(cands) and all(same_shape(a, b) for a, b in zip(shapes_r, shapes_c)):
        return list(zip(refs, cands))
    return [(refs[i], cands[j]) for i, j in pair_tensors(shapes_r, shapes_c)]


def ref_needs(graph: LocalGraph, batch: list[Item], ref_names: set[str]) -> list[str]:
    """Reference tensors (beyond the batch's own) that feed the batch's calls: same names first."""
    extra: list[str] = []
    for it in batch:
        if it.status is not None or not it.mc.path:
            continue
        _, entering = graph.part(it.mc.path, it.graph_call, it.tensors)
        for t in entering:
            for s in graph.source(t):
                if s in ref_names and s not in extra:
                    extra.append(s)
                    break
    return extra


PairsOf = Callable[[Item, CompareRow], "list[Pair]"]
#: (row item, the reference tensors its candidate part is fed) pairs -> per item key, the reference's own part's
#: values at the candidate's format by reference tensor (an ONNX reference's ideal parts, cut to start where the
#: candidate's do)
Alone = Callable[[Sequence[tuple[Item, Sequence[str]]]], "dict[int, dict[str, np.ndarray]]"]
#: what a reference hands :func:`local_errors`: pairs, a reference lookup, a row's candidate tensors, and ``Alone``
LocalInputs = tuple[PairsOf, RefLookup, Callable[[Item, CompareRow], Sequence[str]], "Alone | None"]


def local_errors(graph: LocalGraph, batch: list[Item], rows: list[CompareRow], pairs_of: PairsOf, ref_of: RefLookup,
                 tensors_of: Callable[[Item, CompareRow], Sequence[str]], criterion: Any, judging: Any = None,
                 alone: Alone | None = None) -> None:
    """Set ``local_rel`` on the compared rows of a batch: each call's part of the candidate
    (its nodes, found through ``tensors_of``) fed the reference's values (``ref_of``), its
    outputs judged against the reference values ``pairs_of`` pairs them with; where a pair carries the
    ideal part's value (judged at the candidate's precision), the local split too, which then decides the
    row (``judging``: the precision rule, :class:`~.judging.Judging`)."""
    jobs, pairs = [], {}
    for k, (it, row) in enumerate(zip(batch, rows)):
        if row.ok is None or not it.mc.path:
            continue
        nodes, entering = graph.part(it.mc.path, it.graph_call, tensors_of(it, row))
        if not nodes:
            continue
        if isinstance(ref_of, TorchLookup):
            ref_of.pair(graph, it, entering)
        pairs[k] = pairs_of(it, row)
        jobs.append((k, nodes, entering, [name for _, name, _ in pairs[k]]))
        keeper = _KEEPER.get()
        if keeper is not None and keeper.wants(it, row):
            keeper.keep(graph, it, nodes, entering, pairs[k], ref_of)
    if not jobs:
        return
    feedings = {k: graph.feeding(entering, nodes, ref_of) for k, nodes, entering, _ in jobs}
    if alone is not None:
        _with_ideal_parts(batch, jobs, feedings, pairs, ref_of, alone)
    for k, got in graph.run(jobs, ref_of, feedings).items():
        if isinstance(got, str):
            annotate(rows[k], None, got)
        else:
            annotate(rows[k], local_stats(got, pairs.get(k, []), criterion, graph), None, judging, criterion)


def _with_ideal_parts(batch: list[Item], jobs: Sequence[tuple[int, list[int], tuple[str, ...], Any]],
                      feedings: Mapping[int, Feeding], pairs: dict[int, list[Pair]], ref_of: RefLookup, alone: Alone) -> None:
    """Each job's pairs, in place, with the reference's own part's values (``alone``), started at the values the
    candidate's part is fed (``feedings``: found through its conversions; named as the reference names them)."""
    name_of = getattr(ref_of, "ref_name", lambda t: t)
    wants = []
    for k, _, _, _ in jobs:
        feeding = feedings[k]
        if not isinstance(feeding, str):
            wants.append((batch[k], [name_of(t) for t in feeding[0]]))
    found = alone(wants)
    for k, _, _, _ in jobs:
        ideal = found.get(batch[k].mc.key)
        if ideal:
            pairs[k] = [(ref, name, ideal.get(name_of(name))) for ref, name, _ in pairs[k]]


def onnx_ref_inputs(batch: list[Item], ref_values: dict[str, np.ndarray], cand_values: dict[str, np.ndarray],
                    ref_feed: dict[str, np.ndarray], cand_feed: dict[str, np.ndarray]) -> tuple[PairsOf, RefLookup]:
    """An ONNX reference's values for :func:`local_errors`: a row's (reference value, candidate
    tensor) pairs (their ideal parts come from the reference's ``alone``, :data:`LocalInputs`), and a
    candidate tensor's reference value (the reference tensor paired with it, or the reference's input at
    the same position)."""
    cand_shapes = {k: tuple(v.shape) for k, v in cand_values.items()}
    by_cand: dict[str, str] = {}
    for it in batch:
        if it.status is None:
            by_cand.update({c: r for r, c in ref_pairs(it, ref_values, cand_shapes)})

    def pairs_of(it: Item, row: CompareRow) -> list[Pair]:
        return [(ref_values[r], c, None) for r, c in ref_pairs(it, ref_values, cand_shapes) if r in ref_values]

    return pairs_of, FileLookup(by_cand, ref_values, ref_feed, cand_feed)


class FileLookup:
    """An ONNX reference's value of a candidate tensor (:data:`RefLookup`): the reference tensor
    paired with it, or the reference's input at the same position; :meth:`ref_name` names it."""

    def __init__(self, by_cand: dict[str, str], ref_values: dict[str, np.ndarray], ref_feed: dict[str, np.ndarray],
                 cand_feed: dict[str, np.ndarray]) -> None:
        self.by_cand, self.ref_values, self.ref_feed, self.cand_feed = by_cand, ref_values, ref_feed, cand_feed

    def ref_name(self, t: str) -> str:
        """The reference tensor that holds candidate tensor ``t``'s value."""
        if t in self.cand_feed and t not in self.ref_feed:
            return list(self.ref_feed)[list(self.cand_feed).index(t)]
        return t if t in self.cand_feed else self.by_cand.get(t, t)

    def __call__(self, t: str) -> np.ndarray | None:
        if t in self.cand_feed:
            return self.ref_feed[self.ref_name(t)]
        return self.ref_values.get(self.ref_name(t))


def torch_ref_inputs(builder: Any, feed: dict[str, np.ndarray], items: Sequence[Item] = (),
                     named: dict[str, str] | None = None, ideal: Any = None) -> tuple[PairsOf, RefLookup]:
    """A PyTorch reference's values for :func:`local_errors`, from the value store: a row's
    (PyTorch value, ONNX tensor it was compared with, the call run alone at the candidate's format), and an
    ONNX tensor's PyTorch value (see :class:`TorchLookup`). ``ideal``: the store of the calls run alone at
    the format (:class:`~layertap.comparing.ideal.TorchIdeal`), keyed as the values."""
    def pairs_of(it: Item, row: CompareRow) -> list[Pair]:
        ref = builder.store.get(it.mc.key)
        own = ideal.get(it.mc.key) if ideal is not None and ideal.has(it.mc.key) else None
        return [(np.asarray(ref[i]), name, np.asarray(own[i]) if own is not None and i < len(own) else None)
                for (key, i), name in builder.onnx_of.items() if key == it.mc.key and i < len(ref)]

    return pairs_of, TorchLookup(builder, feed, items, named or {})


class TorchLookup:
    """An ONNX tensor's PyTorch value (:data:`RefLookup`): the graph input, the value another row
    paired with it, or a call's input kept by the recorder (``inputs=True``): one the file names
    as a module's input (``named``: tensor -> module path), or one :func:`local_errors` paired
    with the single tensor a call's part reads that has no other value (:meth:`call_inputs`)."""

    def __init__(self, builder: Any, feed: dict[str, np.ndarray], items: Sequence[Item], named: dict[str, str]) -> None:
        self.builder, self.feed = builder, feed
        self.where = {name: key for key, name in builder.onnx_of.items()}
        self.keys = {it.mc.path: it.mc.key for it in items if it.mc.call == 0}
        self.named = named
        self.paired: dict[str, np.ndarray] = {}

    def __call__(self, t: str) -> np.ndarray | None:
        if t in self.feed:
            return self.feed[t]
        if t in self.paired:
            return self.paired[t]
        key = self.where.get(t)
        if key is not None:
            arrays = self.builder.store.get(key[0])
            return np.asarray(arrays[key[1]]) if key[1] < len(arrays) else None
        fresh = self.call_inputs(self.keys[self.named[t]]) if self.named.get(t) in self.keys else []
        return fresh[0] if len(fresh) == 1 else None

    def call_inputs(self, key: int) -> list[np.ndarray]:
        """The inputs of call ``key`` that no module returned (kept with ``inputs=True``)."""
        store = self.builder.store
        return [np.asarray(a) for a in store.get(input_key(key))] if store.has(input_key(key)) else []

    def pair(self, graph: "LocalGraph", it: Item, entering: Sequence[str]) -> None:
        """The one tensor of ``entering`` with no value gets the call's one input of its size."""
        missing = [t for t in entering if not graph.has_value(t, self)]
        if len(missing) != 1:
            return
        fits = [a for a in self.call_inputs(it.mc.key) if graph.fits(missing[0], a)]
        if len(fits) == 1:
            self.paired[missing[0]] = fits[0]


# ---------------------------------------------------------------------------
# one call's part kept for a repro package
# ---------------------------------------------------------------------------
@dataclass
class KeptPart:
    """A call's part as ``local=True`` ran it, with the values it was fed (what ``repro`` packages).

    Attributes:
        path, call: the module call.
        nodes: the candidate's node indices of the part (conversion nodes it runs included).
        inputs: candidate tensor -> the reference's value fed there, in the reference's own type.
        casts: inputs the candidate holds in another type -> that ONNX element type.
        expected: candidate output tensor -> the reference's value of it.
        ref_names: candidate tensor -> the ONNX reference's tensor holding that value (an ONNX reference).
    """

    path: str
    call: int
    nodes: list[int]
    inputs: dict[str, np.ndarray]
    casts: dict[str, int]
    expected: dict[str, np.ndarray]
    ref_names: dict[str, str] = field(default_factory=dict)


class PartKeeper:
    """Keeps the part of one call while a ``local=True`` comparison runs (see :func:`keep_part`)."""

    def __init__(self, path: str | None, call: int = 0) -> None:
        self.path, self.call = path, call
        self.part: KeptPart | None = None
        self.why: str | None = None  # why the wanted call's part cannot be kept
        self.where = path or ""  # the call it was, PATH#k

    def wants(self, it: Item, row: CompareRow) -> bool:
        """The asked-for call, else the first failing one."""
        if self.path is None:
            return self.part is None and self.why is None and row.ok is False
        return it.mc.path == self.path and it.mc.call == self.call

    def keep(self, graph: LocalGraph, it: Item, nodes: list[int], entering: Sequence[str],
             pairs: Sequence[Pair], ref_of: RefLookup) -> None:
        """Keep the part of ``it`` with the reference's values for its inputs and outputs (or say why not)."""
        import onnx

        self.where = f"{it.mc.path}#{it.mc.call}"
        feeding = graph.feeding(entering, nodes, ref_of)
        if isinstance(feeding, str):
            self.why = feeding
            return
        fed, nodes = feeding
        if graph.blocked & {*fed, *(name for _, name, _ in pairs)}:
            self.why = "its tensors are in ONNX Runtime's NCHWc layout (a file saved at ORT_ENABLE_ALL)"
            return
        inputs, casts = {}, {}
        for t, v in fed.items():
            a, dtype = graph.declared(t, v)
            inputs[t] = np.array(a, order="C")
            if dtype is not None and dtype != a.dtype:
                casts[t] = int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
        expected = {name: np.array(ref, order="C") for ref, name, _ in pairs}
        name_of = getattr(ref_of, "ref_name", None)
        ref_names = {t: name_of(t) for t in [*inputs, *expected]} if name_of is not None else {}
        self.part = KeptPart(it.mc.path, it.mc.call, nodes, inputs, casts, expected, ref_names)


_KEEPER: ContextVar[PartKeeper | None] = ContextVar("layertap_part_keeper", default=None)


@contextlib.contextmanager
def keep_part(path: str | None, call: int = 0) -> Iterator[PartKeeper]:
    """While the block runs, a ``local=True`` comparison keeps the part of call ``path#call``
    (``path=None``: the first failing call) in the keeper it yields.

    Example:
        >>> with keep_part("fc", 0) as keeper:
        ...     pass
        >>> keeper.part is None
        True
    """
    keeper = PartKeeper(path, call)
    token = _KEEPER.set(keeper)
    try:
        yield keeper
    finally:
        _KEEPER.reset(token)
