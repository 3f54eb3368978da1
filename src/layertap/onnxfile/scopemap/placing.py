"""Nodes without module scope that other tools inserted, placed by data flow.

Quantizers and ONNX Runtime's optimizer add nodes that carry no scope (dynamo
metadata is dropped, TorchScript-style names are replaced by the tool's own):
``QuantizeLinear``/``DequantizeLinear`` pairs, quantize_dynamic's
``DynamicQuantizeLinear``/``ConvInteger``/``Cast``/``Mul``/``Add`` groups, ORT's
``Reshape`` around a fused ``Gemm``. Their graph position says nothing (the
QDQ quantizer interleaves the pairs of neighbouring calls), so each connected
group of such nodes (an *island*) is placed from its neighbours:

1. an island whose results all go to one node named after an original tensor
   (kind ``"value"``) or after the node a tool replaced (kind ``"renamed"``)
   computes part of that module: it joins that node's module;
2. a ``QuantizeLinear -> DequantizeLinear`` pair that keeps values (its zero
   point is above the type's minimum, or the tensor is never negative) is
   the quantized form of its producer's value: it joins the producer's
   module, so the module's value is the tensor after ``DequantizeLinear``;
3. a pair that clips at zero stands for an activation the quantizer removed
   (QDQ folds ``Relu`` into the quantization, and its producer's output takes
   the activation's tensor name). Under TorchScript that name keeps the removed
   module's scope (``/layer1/layer1.0/relu/Relu_output_0`` on the Conv), so the
   pair becomes that module's call. Without one (dynamo names such as
   ``relu_12``) the activation is read as applied by the innermost module
   around its producer that calls other modules (the BasicBlock around its
   ``bn1`` or its residual ``Add``, the root around the stem's ``bn1``): the
   pair joins that module, whose value is then the tensor after
   ``DequantizeLinear``, while a leaf such as the BatchNorm keeps its own
   output before the pair;
4. anything else sits in the innermost module around all its neighbours.
   Whether it finished the module before it or started the one after it is
   unknown, so those modules' output (resp. input) at the island is refused
   (:class:`Suspect`), unless every neighbour is in that one module. The
   tensor the island reads stays a candidate for the module before it (a
   caller that knows the true value may check it), unless a quantizer made the
   island: its clipping pair may stand for an activation that module ended
   with, so the tensor before it is not that module's value.

Example:
    >>> from onnx import helper, TensorProto
    >>> from .graph_facts import GraphFacts, is_fusion
    >>> from .node_scopes import read_nodes
    >>> n = [helper.make_node("Relu", ["x"], ["r"], name="/act/Relu"),
    ...      helper.make_node("Neg", ["r"], ["q"], name="tool_1"),
    ...      helper.make_node("Abs", ["q"], ["y"], name="/out/Abs")]
    >>> g = helper.make_graph(n, "g", [helper.make_tensor_value_info("x", 1, [1])], [helper.make_tensor_value_info("y", 1, [1])])
    >>> ns = read_nodes(g, is_fusion)
    >>> suspects = place_floating(g, ns, GraphFacts(g))
    >>> ns.chains[1], [(s.tensor, s.side) for s in suspects]
    ((), [('r', 'out'), ('q', 'in')])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .graph_facts import GraphFacts, activation, connected_groups, is_quantizer
from .node_scopes import Chain, NodeScopes

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_QMIN = {2: 0, 4: 0, 3: -128, 5: -32768}  # uint8, uint16, int8, int16
_NONNEG_OPS = {"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt", "HardSigmoid", "Softplus"}
_KEEPS_SIGN_OPS = {
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Reshape", "Flatten", "Transpose", "Squeeze",
    "Unsqueeze", "Identity", "ReduceMean", "ReduceMax", "ReduceMin", "Concat", "Resize", "Slice", "Gather", "Split",
}


def _output_alias(node: "onnx.NodeProto", outputs: set[str]) -> bool:
    """An ``Identity`` that only names a graph output (``lt.export`` adds one per aliased output).

    It computes nothing and feeds no node, so it cannot move a module's edge.
    """
    return node.op_type == "Identity" and all(o in outputs for o in node.output)


@dataclass(frozen=True)
class Suspect:
    """A tensor where a placed island meets a module whose edge it may have moved.

    ``side="out"``: calls whose output is ``tensor`` are refused;
    ``side="in"``: calls whose input is ``tensor`` are refused.
    ``candidate``: the refused output may still be checked numerically (not after a quantizer's island).
    """

    tensor: str
    side: str
    why: str
    candidate: bool = False


def place_floating(graph: "onnx.GraphProto", ns: NodeScopes, facts: GraphFacts) -> list[Suspect]:
    """Give every unscoped node a chain (in ``ns.chains``, kind ``"placed"``); return the suspects."""
    outputs = {o.name for o in graph.output}
    floating = [
        i for i, n in enumerate(graph.node)
        if ns.chains[i] is None and ns.kinds[i] is None and i not in facts.weight_nodes
        and not (n.op_type == "Constant" and not n.input) and not _output_alias(n, outputs)
    ]
    if not floating or ns.source == "none":
        return []
    placer = _Placer(graph, ns, facts)
    suspects: list[Suspect] = []
    for island in connected_groups(graph, floating, facts):
        suspects.extend(placer.place(island))
    return suspects


class _Placer:
    def __init__(self, graph: "onnx.GraphProto", ns: NodeScopes, facts: GraphFacts) -> None:
        self.graph, self.ns, self.facts = graph, ns, facts
        self.producer = {t: i for i, n in enumerate(graph.node) for t in n.output if t}
        self.inits = {i.name: i for i in graph.initializer}
        self._nonneg: dict[str, bool] = {}
        self._parents: set[str] | None = None

    def place(self, island: list[int]) -> list[Suspect]:
        inside = set(island)
        reads = [t for i in island for t in self.graph.node[i].input
                 if t and t not in self.facts.weights and self.producer.get(t) not in inside]
        outs = [t for i in island for t in self.graph.node[i].output
                if t and (t in self.facts.outputs or any(u not in inside for u in self.facts.uses.get(t, ())))]
        readers = [u for t in outs for u in self.facts.uses.get(t, ()) if u not in inside]
        chain, suspicious = self._chain(island, reads, outs, readers)
        for i in island:
            self.ns.chains[i] = chain
            self.ns.kinds[i] = "placed"
        if not suspicious:
            return []
        first = self.graph.node[island[0]]
        why = (f"node {first.name or first.op_type} ({first.op_type}) was inserted by another tool without a module "
               "scope, and ONNX does not record whether it ends the module before it or starts the one after it")
        candidate = not any(is_quantizer(self.graph.node[i]) for i in island)
        return ([Suspect(t, "out", why, candidate) for t in dict.fromkeys(reads)]
                + [Suspect(t, "in", why) for t in dict.fromkeys(outs)])

    def _chain(self, island: list[int], reads: list[str], outs: list[str], readers: list[int]) -> tuple[Chain, bool]:
        ns = self.ns
        targets = {ns.chains[u] or () for u in readers}
        if readers and not set(outs) & self.facts.outputs and len(targets) == 1 \
                and all(ns.kinds[u] in ("value", "renamed") for u in readers):
            return targets.pop(), False  # rule 1
        pair = self._qdq_pair(island)
        if pair is not None and len(set(reads)) == 1:
            t = reads[0]
            p = self.producer.get(t)
            own: Chain = (ns.chains[p] or ()) if p is not None else ()
            if self._keeps_values(self.graph.node[pair[0]], t):
                return own, False  # rule 2
            named = ns.tensor_chain(t)
            if named is not None and named != own:
                return named, False  # rule 3
            if p is not None and named is None and ns.chains[p] is not None:
                return self._applier(own), False  # rule 3, no name
        around = [ns.chains[self.producer[t]] if t in self.producer else () for t in reads]
        around += [ns.chains[u] for u in readers] + [() for t in outs if t in self.facts.outputs]
        chains = [c or () for c in around]
        return _common_prefix(chains), len(set(chains)) != 1  # rule 4

    def _applier(self, chain: Chain) -> Chain:
        """The innermost level of ``chain`` that calls other modules (``()``, the root, when none does)."""
        if self._parents is None:
            self._parents = {c[j][0] for c in self.ns.chains if c for j in range(len(c) - 1)}
        for j in range(len(chain), 0, -1):
            if chain[j - 1][0] in self._parents:
                return chain[:j]
        return ()

    def _qdq_pair(self, island: list[int]) -> tuple[int, int] | None:
        if len(island) != 2:
            return None
        q, d = sorted(island)
        nq, nd = self.graph.node[q], self.graph.node[d]
        if nq.op_type == "QuantizeLinear" and nd.op_type == "DequantizeLinear" and nd.input[0] == nq.output[0]:
            return q, d
        return None

    def _keeps_values(self, q: "onnx.NodeProto", tensor: str) -> bool:
        """A QuantizeLinear keeps negative values unless its zero point is the type's minimum."""
        zp = self._zero_point(q)
        if zp is not None and zp[1] is not None and all(v > zp[1] for v in zp[0]):
            return True
        return self.nonneg(tensor)

    def _zero_point(self, q: "onnx.NodeProto") -> tuple[list[int], int | None] | None:
        from onnx import numpy_helper

        if len(q.input) < 3 or not q.input[2]:
            return [0], 0  # default zero point: uint8 0
        init = self.inits.get(q.input[2])
        if init is None or init.data_location == 1:  # external or computed: unknown
            return None
        try:
            values = numpy_helper.to_array(init).reshape(-1).tolist()
        except Exception:  # noqa: BLE001 - unreadable: unknown
            return None
        return [int(v) for v in values], _QMIN.get(init.data_type)

    def nonneg(self, tensor: str, depth: int = 0) -> bool:
        """Whether ``tensor`` is never negative (after Relu-like ops, through sign-keeping ones)."""
        if tensor in self._nonneg:
            return self._nonneg[tensor]
        p = self.producer.get(tensor)
        result = False
        if p is not None and depth < 64:
            node = self.graph.node[p]
            acts = [t for t in node.input if t and t not in self.facts.weights]
            if node.op_type in _NONNEG_OPS or activation(node) in _NONNEG_OPS:
                result = True
            elif node.op_type == "DequantizeLinear" and node.input[0] in self.producer:
                q = self.graph.node[self.producer[node.input[0]]]
                zp = self._zero_point(q) if q.op_type == "QuantizeLinear" else None
                result = zp is not None and zp[1] is not None and all(v == zp[1] for v in zp[0])
            elif node.op_type in _KEEPS_SIGN_OPS and acts:
                result = all(self.nonneg(t, depth + 1) for t in (acts if node.op_type == "Concat" else acts[:1]))
        self._nonneg[tensor] = result
        return result


def _common_prefix(chains: list[Chain]) -> Chain:
    if not chains:
        return ()
    out = []
    for level in zip(*chains):
        if any(x != level[0] for x in level):
            break
        out.append(level[0])
    return tuple(out)
