"""The one walk over an ONNX model's nodes: the main graph, every subgraph
(``If``/``Loop``/``Scan`` bodies, at any depth) and, for a model, its local
function bodies.

Everything that must see every node or tensor (the external-data safety
checks, renames, subgraph reads, "where is this tensor") walks through here.
Reads structure only, so a model loaded without its weights is enough.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    Body = onnx.GraphProto | onnx.FunctionProto


def subgraphs(node: "onnx.NodeProto") -> Iterator["onnx.GraphProto"]:
    """The graphs held in ``node``'s attributes (one level).

    Example:
        >>> from onnx import helper
        >>> body = helper.make_graph([], "then", [], [])
        >>> [g.name for g in subgraphs(helper.make_node("If", ["c"], [], then_branch=body, else_branch=body))]
        ['then', 'then']
    """
    for attr in node.attribute:
        yield from attribute_graphs(attr)


def holds_graphs(node: "onnx.NodeProto") -> bool:
    """``node`` holds a subgraph (control flow: ``If``, ``Loop``, ``Scan``).

    Example:
        >>> from onnx import helper
        >>> holds_graphs(helper.make_node("Relu", ["x"], ["y"]))
        False
    """
    return next(subgraphs(node), None) is not None


def attribute_graphs(attr: "onnx.AttributeProto") -> Iterator["onnx.GraphProto"]:
    """The graphs one attribute holds (``g`` and ``graphs``)."""
    if attr.HasField("g"):
        yield attr.g
    yield from attr.graphs


def graph_nodes(graph: "Body") -> Iterator["onnx.NodeProto"]:
    """Every node of ``graph`` (or a function body) and of its subgraphs, depth first, parents first.

    Example:
        >>> from onnx import helper
        >>> body = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "body", [], [])
        >>> g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)], "g", [], [])
        >>> [n.op_type for n in graph_nodes(g)]
        ['If', 'Relu', 'Relu']
    """
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from graph_nodes(sub)


def inner_graphs(graph: "onnx.GraphProto") -> Iterator["onnx.GraphProto"]:
    """``graph`` and every subgraph under it, parents first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from inner_graphs(sub)


def model_nodes(model: "onnx.ModelProto") -> Iterator["onnx.NodeProto"]:
    """Every node of the model: main graph, subgraphs, local function bodies.

    Example:
        >>> from onnx import helper
        >>> f = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], [])
        >>> g = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g", [], [])
        >>> [n.op_type for n in model_nodes(helper.make_model(g, functions=[f]))]
        ['F', 'Neg']
    """
    yield from graph_nodes(model.graph)
    for f in model.functions:
        yield from graph_nodes(f)


def model_graphs(model: "onnx.ModelProto") -> Iterator["onnx.GraphProto"]:
    """The main graph and every subgraph, those inside function bodies included."""
    yield from inner_graphs(model.graph)
    for f in model.functions:
        for node in f.node:
            for sub in subgraphs(node):
                yield from inner_graphs(sub)


def all_tensors(model: "onnx.ModelProto") -> Iterator["onnx.TensorProto"]:
    """Every TensorProto: initializers and attribute tensors, in subgraphs and functions too.

    Example:
        >>> from onnx import helper, numpy_helper
        >>> import numpy as np
        >>> g = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(np.zeros(1, np.float32), "w")])
        >>> [t.name for t in all_tensors(helper.make_model(g))]
        ['w']
    """
    for g in model_graphs(model):
        yield from g.initializer
        for s in g.sparse_initializer:
            yield s.values
            yield s.indices
    for node in model_nodes(model):
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for s in a.sparse_tensors:
                yield s.values
                yield s.indices


def subgraph_reads(node: "onnx.NodeProto") -> set[str]:
    """Names read by the nodes inside ``node``'s subgraphs (an ``If`` reads what its branches read)."""
    return {t for sub in subgraphs(node) for inner in graph_nodes(sub) for t in inner.input}


def defines(graph: "onnx.GraphProto", name: str) -> bool:
    """True when ``graph`` or one of its subgraphs makes ``name`` (a node output or a graph input)."""
    return any(name in n.output for n in graph_nodes(graph)) or any(
        name == i.name for g in inner_graphs(graph) for i in g.input
    )


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, else ``base_1``, ``base_2``, ...: the first not in ``taken``, which it joins (a new tensor's
    or node's name in a graph whose names ``taken`` holds).

    Example:
        >>> taken = {"y", "y_1"}
        >>> fresh_name("y", taken), fresh_name("z", taken), sorted(taken)
        ('y_2', 'z', ['y', 'y_1', 'y_2', 'z'])
    """
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def linked_groups(items: Iterable[int], links: Iterable[tuple[int, int]]) -> list[list[int]]:
    """``items`` split into the groups that ``links`` (pairs of items; a pair with an end outside ``items`` is
    ignored) connect: each group in the order of ``items``, the groups by their smallest item. The graphs of
    both ONNX files and LiteRT programs group their nodes so.

    Example:
        >>> linked_groups([0, 1, 2, 3], [(0, 2), (2, 3), (1, 9)])
        [[0, 2, 3], [1]]
    """
    parent = {i: i for i in items}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for i in parent:
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=min)
