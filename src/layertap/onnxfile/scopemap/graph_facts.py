"""Graph facts the scope mapping needs: who reads a tensor, what is a weight, call boundaries.

Everything here reads only the graph structure (no weights), so a model loaded
with ``load_external_data=False`` is enough.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Iterable

from ..walk import linked_groups, subgraph_reads

if TYPE_CHECKING:  # pragma: no cover
    import onnx

RULE_KEY = "pkg.onnxscript.rewriter.rule_name"
# Ops whose output is not determined by their inputs: never treated as weights.
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


class GraphFacts:
    """Readers, graph outputs and weight-derived tensors of one graph, computed once.

    Example:
        >>> from onnx import helper, TensorProto, numpy_helper
        >>> import numpy as np
        >>> w = numpy_helper.from_array(np.ones((2, 2), np.float32), "W")
        >>> nodes = [helper.make_node("Identity", ["W"], ["W2"]),          # shared weight
        ...          helper.make_node("MatMul", ["x", "W2"], ["h"]),
        ...          helper.make_node("Relu", ["h"], ["y"])]
        >>> vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2])
        >>> facts = GraphFacts(helper.make_graph(nodes, "g", [vi("x")], [vi("y")], [w]))
        >>> sorted(facts.weights), facts.entering([1]), facts.boundary([1]), facts.boundary([2])
        (['W', 'W2'], ('x',), ('h',), ('y',))
    """

    def __init__(self, graph: "onnx.GraphProto") -> None:
        self.graph = graph
        self.uses = readers(graph)
        self.outputs = {o.name for o in graph.output}
        self.weights = weight_derived(graph)
        self.weight_nodes = frozenset(
            i for i, n in enumerate(graph.node) if n.output and all(t in self.weights for t in n.output if t)
        )

    def boundary(self, nodes: Collection[int]) -> tuple[str, ...]:
        """Tensors made by ``nodes`` and read outside them (or graph outputs), graph order.

        Weight-derived tensors (a shared weight's ``Identity`` that happens to
        sit in this scope) are left out unless nothing else leaves the nodes:
        a module's result is an activation, not one of its weights.
        """
        inside = set(nodes)
        found: list[str] = []
        for i in sorted(inside):
            for t in self.graph.node[i].output:
                if t and (t in self.outputs or any(u not in inside for u in self.uses.get(t, ()))):
                    found.append(t)
        live = [t for t in found if t not in self.weights]
        return tuple(live or found)

    def entering(self, nodes: Collection[int]) -> tuple[str, ...]:
        """Tensors read by ``nodes`` that they do not make, weights excluded, graph order."""
        inside = set(nodes)
        made = {t for i in inside for t in self.graph.node[i].output}
        out: list[str] = []
        for i in sorted(inside):
            for t in self.graph.node[i].input:
                if t and t not in made and t not in self.weights and t not in out:
                    out.append(t)
        return tuple(out)


def weight_derived(graph: "onnx.GraphProto") -> set[str]:
    """Initializers, ``Constant`` outputs, and every tensor computed only from them.

    Why the closure: exporters share a weight through ``Identity`` nodes and
    compute values such as MultiheadAttention's packed bias slices from
    weights; such tensors are constants, never a module's input.

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Constant", [], ["c"], value_float=1.0),
        ...                        helper.make_node("Neg", ["c"], ["d"]),
        ...                        helper.make_node("Add", ["x", "d"], ["y"])], "g", [], [])
        >>> sorted(weight_derived(g))
        ['c', 'd']
    """
    names = {i.name for i in graph.initializer} | {i.values.name for i in graph.sparse_initializer}
    for node in graph.node:
        if node.op_type in _RANDOM_OPS:
            continue
        reads = [t for t in node.input if t] + sorted(subgraph_reads(node))
        if node.op_type == "Constant" and not node.input:
            names.update(t for t in node.output if t)
        elif reads and all(t in names for t in reads):
            names.update(t for t in node.output if t)
    return names


# ONNX Runtime's fused ops whose own name is the first fused node's and whose inputs are that node's
FIRST_NODE_FUSIONS = frozenset({"FusedConv", "FusedGemm", "NhwcFusedConv"})
_QUANT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# weights ONNX Runtime's optimiser wrote folding the Mul or Add after a Conv into it (run by quantisation's
# pre-processing): the Conv then computes the value of a node of another module, or of its parent's own code
_ORT_FOLDS = ("ConvMulFusion_", "ConvAddFusion_")


def is_fusion(node: "onnx.NodeProto") -> bool:
    """Whether a node's op stands for several fused ops (ORT's ``Fused*``, ``com.microsoft`` ops, ``activation``;
    a Conv whose weights ONNX Runtime's ``ConvMulFusion``/``ConvAddFusion`` rewrote).

    Example:
        >>> from onnx import helper
        >>> is_fusion(helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation="Relu"))
        True
        >>> is_fusion(helper.make_node("Conv", ["x", "w"], ["y"])), is_fusion(helper.make_node("QuantizeLinear", ["x", "s"], ["y"]))
        (False, False)
    """
    if node.op_type in _QUANT_OPS:
        return False
    return (node.op_type.startswith("Fused") or node.domain.startswith("com.microsoft")
            or any(a.name == "activation" for a in node.attribute)
            or any(t.startswith(_ORT_FOLDS) for t in node.input[1:]))


def is_quantizer(node: "onnx.NodeProto") -> bool:
    """Whether a quantizer made the node: (De)QuantizeLinear, DynamicQuantizeLinear, ``QLinear*``, ``*Integer``.

    Example:
        >>> from onnx import helper
        >>> is_quantizer(helper.make_node("ConvInteger", ["x", "w"], ["y"])), is_quantizer(helper.make_node("Split", ["x"], ["y"]))
        (True, False)
    """
    op = node.op_type
    return op in _QUANT_OPS or op.startswith("QLinear") or op.endswith("Integer")


def activation(node: "onnx.NodeProto") -> str | None:
    """The ``activation`` attribute of a fused node (``"Relu"``), else ``None``."""
    for a in node.attribute:
        if a.name == "activation":
            return a.s.decode(errors="replace")
    return None


def connected_groups(graph: "onnx.GraphProto", nodes: Iterable[int], facts: GraphFacts) -> list[list[int]]:
    """Split ``nodes`` into groups linked by a tensor one of them makes and another reads; graph order.

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
        ...                        helper.make_node("Abs", ["x"], ["c"])], "g", [], [])
        >>> connected_groups(g, [0, 1, 2], GraphFacts(g))
        [[0, 1], [2]]
    """
    ordered = sorted(set(nodes))
    return linked_groups(ordered, ((i, u) for i in ordered for t in graph.node[i].output for u in facts.uses.get(t, ())))


def rules(node: "onnx.NodeProto") -> list[str]:
    """The onnxscript rewrite rules recorded on ``node`` (``[]`` when none)."""
    for p in node.metadata_props:
        if p.key == RULE_KEY:
            return [r.strip() for r in p.value.split(",") if r.strip()]
    return []


def readers(graph: "onnx.GraphProto") -> dict[str, list[int]]:
    """Tensor name -> indices of the nodes that read it (subgraph reads count for the parent node)."""
    uses: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for t in set(node.input) | subgraph_reads(node):
            if t:
                uses.setdefault(t, []).append(i)
    return uses


def stand_ins(graph: "onnx.GraphProto") -> dict[str, str]:
    """Tensor -> the ``DequantizeLinear`` output that stands for it after ``QuantizeLinear``.

    A quantised graph computes with the ``DequantizeLinear`` output: that is the
    value of a quantised tensor as the graph uses it.

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("QuantizeLinear", ["y", "s", "z"], ["y_q"]),
        ...                        helper.make_node("DequantizeLinear", ["y_q", "s", "z"], ["y_dq"])], "g", [], [])
        >>> stand_ins(g)
        {'y': 'y_dq'}
    """
    readers: dict[str, list["onnx.NodeProto"]] = {}
    for node in graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    out: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or not node.input or not node.output:
            continue
        dq = [r for r in readers.get(node.output[0], ()) if r.op_type == "DequantizeLinear"]
        if len(dq) == 1 and dq[0].output:
            out[node.input[0]] = dq[0].output[0]
    return out
