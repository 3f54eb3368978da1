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

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .align import Item
from .nchwc import block, blocked_tensors, unblock
from .rows import CompareRow, pair_tensors, same_shape

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.ort import SessionSource
    from ..runtimes import Runtime

_SEE_THROUGH = {"Cast", "QuantizeLinear", "DequantizeLinear", "Identity"}

RefLookup = Callable[[str], "np.ndarray | None"]  # candidate tensor -> the reference's value, or None


class LocalGraph:
    """The candidate's nodes of several calls, each fed on its own (see module doc)."""

    def __init__(self, source: "SessionSource", runtime: "Runtime") -> None:
        from ..onnxfile.graph_facts import GraphFacts
        from ..onnxfile.ort import inferred_types
        from ..onnxfile.scopes import ScopeMap

        self.sessions = source  # the candidate, its weights held once for every part run
        self.cand = cand = source.model
        self.runtime = runtime
        self.smap = ScopeMap.from_model(cand)
        self.facts = GraphFacts(cand.graph)
        self.types = inferred_types(cand)
        self.producer = {t: i for i, n in enumerate(cand.graph.node) for t in n.output if t}
        self.inits = {i.name: i for i in cand.graph.initializer}
        self.graph_inputs = [i.name for i in cand.graph.input if i.name not in self.inits]
        self._last: tuple[bytes, Any] | None = None
        # tensors in ORT's NCHWc layout (an ORT_ENABLE_ALL file): fed blocked, read back as NCHW
        self.blocked = blocked_tensors(cand.graph)
        self.block = 0
        if self.blocked:
            from ..onnxfile.ort import nchwc_block_size

            self.block = nchwc_block_size() or 0

    def part(self, path: str, call: int, tensors: Sequence[str]) -> tuple[list[int], tuple[str, ...]]:
        """Nodes and entering tensors of a call (its module scope, else the nodes making ``tensors``)."""
        if path and self.smap.source != "none":
            nodes, entering, _ = self.smap.call_nodes(path, call)
            if nodes:
                return nodes, entering
        nodes = sorted({self.producer[t] for t in tensors if t in self.producer})
        return nodes, self.facts.entering(nodes)

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
            ) -> dict[int, dict[str, np.ndarray] | str]:
        """``jobs``: ``(job id, nodes, entering, outputs)``. Returns per job the candidate's outputs
        computed from the reference's inputs, or why that cannot be done."""
        import onnx

        results: dict[int, dict[str, np.ndarray] | str] = {}
        nodes_out: list[Any] = []
        inputs: list[Any] = []
        outputs: list[Any] = []
        feed: dict[str, np.ndarray] = {}
        wanted: dict[int, dict[str, str]] = {}
        shared: set[int] = set()
        for job, nodes, entering, outs in jobs:
            feeding = self._feed(entering, ref_of)
            if isinstance(feeding, str):
                results[job] = feeding
                continue
            fed, converting = feeding
            nodes = sorted({*nodes, *converting})
            if any(_has_subgraph(self.cand.graph.node[i]) for i in nodes):
                results[job] = "the call holds control flow (subgraphs); its part cannot be run alone"
                continue
            rename = {t: f"lt_local{job}/{t}" for t in fed}
            for i in nodes:
                for t in self.cand.graph.node[i].output:
                    if t:
                        rename[t] = f"lt_local{job}/{t}"
            for t, value in fed.items():
                inputs.append(onnx.helper.make_tensor_value_info(rename[t], _elem(value), list(value.shape)))
                feed[rename[t]] = value
            for i in nodes:
                node = onnx.NodeProto()
                node.CopyFrom(self.cand.graph.node[i])
                node.name = f"lt_local{job}/{node.name}" if node.name else ""
                node.input[:] = [rename.get(t, t) for t in node.input]
                node.output[:] = [rename.get(t, t) for t in node.output]
                nodes_out.append(node)
            shared |= self._weight_nodes(nodes)
            wanted[job] = {t: rename[t] for t in outs if t in rename}
            for t in wanted[job].values():
                outputs.append(onnx.helper.make_empty_tensor_value_info(t))
        if not outputs:
            return results
        weight_nodes = [self.cand.graph.node[i] for i in sorted(shared)]
        graph = onnx.helper.make_graph(
            [*weight_nodes, *nodes_out], "layertap_local", inputs, outputs, self._initializers(nodes_out + weight_nodes)
        )
        model = onnx.helper.make_model(graph, opset_imports=list(self.cand.opset_import))
        model.ir_version = self.cand.ir_version
        model.functions.extend(self.cand.functions)
        try:
            got = self._session(model).run([o.name for o in outputs], feed)
        except Exception as e:  # noqa: BLE001 - the runtime's own message
            why = f"{self.runtime.describe().runtime} cannot run the candidate's part alone: {' '.join(str(e).split())[:160]}"
            for job in wanted:
                results[job] = why
            return results
        for job, names in wanted.items():
            results[job] = {t: got[r] for t, r in names.items()}
        return results

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
            if value is None:
                return f"its input {t} has no reference value (the boundary cannot be matched)"
            s = chain[k]
            converting.update(self.producer[c] for c in chain[:k])
            typed = self._typed(s, value)
            fed[s] = block(typed, self.block) if s in self.blocked else typed
        return fed, converting

    def as_reference(self, name: str, value: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        """A locally computed output in the reference's layout (NCHW for a blocked tensor)."""
        return unblock(value, shape, self.block) if name in self.blocked else value

    def _typed(self, t: str, value: np.ndarray) -> np.ndarray:
        """The reference's value in the candidate's type and declared shape (float16 for a float16 file)."""
        import onnx

        vi = self.types.get(t)
        a = np.asarray(value)
        if vi is not None and vi.type.tensor_type.elem_type:
            try:
                a = a.astype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type), copy=False)
            except (KeyError, TypeError, ValueError):
                pass
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                dims = [d.dim_value for d in tt.shape.dim]
                if all(dims) and math.prod(dims) == a.size and tuple(dims) != a.shape:
                    a = a.reshape(dims)
        return np.ascontiguousarray(a)

    def _weight_nodes(self, nodes: Sequence[int]) -> set[int]:
        """Nodes outside the call that compute weight-derived tensors it reads (shared weights, constants)."""
        inside = set(nodes)
        out: set[int] = set()
        todo = [t for i in nodes for t in self.cand.graph.node[i].input if t in self.facts.weights and t not in self.inits]
        while todo:
            t = todo.pop()
            i = self.producer.get(t)
            if i is None or i in inside or i in out:
                continue
            out.add(i)
            todo.extend(x for x in self.cand.graph.node[i].input if x and x not in self.inits)
        return out

    def _initializers(self, nodes: Sequence[Any]) -> list[Any]:
        reads = {t for n in nodes for t in n.input}
        return [self.inits[t] for t in reads if t in self.inits]


def _has_subgraph(node: Any) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _elem(value: np.ndarray) -> int:
    import onnx

    return int(onnx.helper.np_dtype_to_tensor_dtype(value.dtype))


def local_rel(outputs: dict[str, np.ndarray], pairs: Sequence[tuple[np.ndarray, str]], criterion: Any,
              graph: "LocalGraph | None" = None) -> float | None:
    """The worst rel error of the locally computed outputs against the reference's values
    (read in the reference's layout through ``graph``)."""
    worst = None
    for ref, name in pairs:
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
        rel = criterion.judge(ref, got).rel_err
        worst = rel if worst is None else max(worst, rel)
    return worst


def annotate(row: CompareRow, value: float | None, why: str | None) -> None:
    """Set ``local_rel`` on a row, or say why it has none."""
    row.local_rel = value
    if why:
        row.note = f"{row.note}; local: {why}" if row.note else f"local: {why}"


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
        _, entering = graph.part(it.mc.path, it.mc.call, it.tensors)
        for t in entering:
            for s in graph.source(t):
                if s in ref_names and s not in extra:
                    extra.append(s)
                    break
    return extra


PairsOf = Callable[[Item, CompareRow], "list[tuple[np.ndarray, str]]"]  # a row's (reference value, candidate tensor)


def local_errors(graph: LocalGraph, batch: list[Item], rows: list[CompareRow], pairs_of: PairsOf, ref_of: RefLookup,
                 tensors_of: Callable[[Item, CompareRow], Sequence[str]], criterion: Any) -> None:
    """Set ``local_rel`` on the compared rows of a batch: each call's part of the candidate
    (its nodes, found through ``tensors_of``) fed the reference's values (``ref_of``), its
    outputs judged against the reference values ``pairs_of`` pairs them with."""
    jobs, pairs = [], {}
    for k, (it, row) in enumerate(zip(batch, rows)):
        if row.ok is None or not it.mc.path:
            continue
        nodes, entering = graph.part(it.mc.path, it.mc.call, tensors_of(it, row))
        if not nodes:
            continue
        pairs[k] = pairs_of(it, row)
        jobs.append((k, nodes, entering, [name for _, name in pairs[k]]))
    if not jobs:
        return
    for k, got in graph.run(jobs, ref_of).items():
        if isinstance(got, str):
            annotate(rows[k], None, got)
        else:
            annotate(rows[k], local_rel(got, pairs.get(k, []), criterion, graph), None)


def onnx_ref_inputs(batch: list[Item], ref_values: dict[str, np.ndarray], cand_values: dict[str, np.ndarray],
                    ref_feed: dict[str, np.ndarray], cand_feed: dict[str, np.ndarray]) -> tuple[PairsOf, RefLookup]:
    """An ONNX reference's values for :func:`local_errors`: a row's (reference value, candidate
    tensor) pairs, and a candidate tensor's reference value (the reference tensor paired with
    it, or the reference's input at the same position)."""
    cand_shapes = {k: tuple(v.shape) for k, v in cand_values.items()}
    by_cand: dict[str, str] = {}
    for it in batch:
        if it.status is None:
            by_cand.update({c: r for r, c in ref_pairs(it, ref_values, cand_shapes)})
    ref_in, cand_in = list(ref_feed), list(cand_feed)

    def pairs_of(it: Item, row: CompareRow) -> list[tuple[np.ndarray, str]]:
        return [(ref_values[r], c) for r, c in ref_pairs(it, ref_values, cand_shapes) if r in ref_values]

    def ref_of(t: str) -> np.ndarray | None:
        if t in cand_feed:
            return ref_feed.get(t) if t in ref_feed else ref_feed[ref_in[cand_in.index(t)]]
        return ref_values.get(by_cand.get(t, t))

    return pairs_of, ref_of


def torch_ref_inputs(builder: Any, feed: dict[str, np.ndarray]) -> tuple[PairsOf, RefLookup]:
    """A PyTorch reference's values for :func:`local_errors`, from the value store: a row's
    (PyTorch value, ONNX tensor it was compared with), and an ONNX tensor's PyTorch value
    (the one another row paired with it, or the graph input)."""
    where = {name: key for key, name in builder.onnx_of.items()}

    def ref_of(t: str) -> np.ndarray | None:
        if t in feed:
            return feed[t]
        key = where.get(t)
        if key is None:
            return None
        arrays = builder.store.get(key[0])
        return np.asarray(arrays[key[1]]) if key[1] < len(arrays) else None

    def pairs_of(it: Item, row: CompareRow) -> list[tuple[np.ndarray, str]]:
        ref = builder.store.get(it.mc.key)
        return [(np.asarray(ref[i]), name) for (key, i), name in builder.onnx_of.items() if key == it.mc.key and i < len(ref)]

    return pairs_of, ref_of
