"""Tensors inside ``If``/``Loop``/``Scan`` subgraphs, carried out to the main graph.

ONNX Runtime (and OpenVINO) can return only main-graph outputs, so a tensor
computed inside a branch or a loop body is exposed by carrying it outwards,
one level at a time, until it is a value of the main graph:

- ``If``: the branch that computes the tensor gets one more output, and the
  ``If`` node one more output. Both branches must give as many outputs, so the
  other branch outputs the tensor of the same name when it computes one too
  (the ``If``'s output is then the value of whichever branch ran), else an
  empty value of the tensor's type (every dimension 0; a sequence: an empty
  sequence). An empty value therefore means "this branch did not run".
- ``Loop`` and ``Scan``: the tensor becomes one more scan output of the body,
  so the node's new output holds its value at every iteration, stacked along a
  new first axis (``value[-1]`` is the last iteration's). A loop that runs no
  iteration gives an empty value; a tensor whose shape changes from one
  iteration to the next cannot be stacked and the runtime refuses the run.
- Nested subgraphs are carried level by level (an ``If`` inside a ``Loop``
  body: the branch's value, empty on iterations where the branch did not run,
  then stacked by the loop; iterations must then agree in shape).

Each level's new output keeps the tensor's name when no enclosing graph
defines that name (ONNX lets a subgraph name shadow an outer one), so in the
main graph the tensor is found under its own name, as a main-graph tensor is.
Functions are not carried (their bodies are expanded only at run time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection, Iterator

from ..errors import OnnxFileError
from .tensor_types import is_typed
from .walk import attribute_graphs, fresh_name, inner_graphs

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_CARRIERS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_EMPTY_PREFIX = "layertap/empty/"
_COPY_PREFIX = "layertap/carry/"
_MADE = (_EMPTY_PREFIX, _COPY_PREFIX)


def has_subgraphs(graph: "onnx.GraphProto") -> bool:
    """True when a node of ``graph`` holds a subgraph (the fast check before any branch work)."""
    return any(a.type in (5, 10) for n in graph.node for a in n.attribute)  # GRAPH, GRAPHS


def branch_tensors(graph: "onnx.GraphProto", ops: Collection[str] | None = None) -> dict[str, str]:
    """Every node output inside the subgraphs of ``graph``'s nodes (at any depth) -> the subgraph
    that computes it (the innermost).

    A name defined in the main graph is left out (it is a main-graph tensor). ``ops``: descend
    only into the subgraphs of nodes of these types (``("If",)``: branches, not loop bodies).

    Example:
        >>> import onnx.helper as h
        >>> then = h.make_graph([h.make_node("Relu", ["x"], ["r"])], "then", [], [h.make_empty_tensor_value_info("r")])
        >>> other = h.make_graph([], "else", [], [h.make_empty_tensor_value_info("x")])
        >>> g = h.make_graph([h.make_node("If", ["c"], ["y"], name="pick", then_branch=then, else_branch=other)],
        ...                  "g", [], [])
        >>> branch_tensors(g)
        {'r': "the then_branch of If node 'pick'"}
    """
    main = _defined(graph)
    out: dict[str, str] = {}

    def visit(g: "onnx.GraphProto") -> None:
        for node in g.node:
            if ops is not None and node.op_type not in ops:
                continue
            for attr in node.attribute:
                for sub in attribute_graphs(attr):
                    where = f"the {attr.name} of {node.op_type} node {node.name or '(unnamed)'!r}"
                    out.update((t, where) for n in sub.node for t in n.output if t and t not in main and t not in out)
                    visit(sub)

    visit(graph)
    return out


Path = tuple[tuple[int, str], ...]  # (node index, attribute name) from the main graph down to a subgraph


@dataclass
class Carrier:
    """Carries branch tensors of ``model`` out to its main graph (edits ``model`` in place).

    Example:
        >>> import onnx.helper as h
        >>> f = lambda n: h.make_tensor_value_info(n, 1, [2])
        >>> then = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["a"])], "then", [], [f("a")])
        >>> other = h.make_graph([h.make_node("Abs", ["x"], ["b"])], "else", [], [f("b")])
        >>> g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        ...                  [h.make_tensor_value_info("c", 9, []), f("x")], [f("y")])
        >>> m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        >>> Carrier(m).carry("r")
        'r'
        >>> node = m.graph.node[0]  # r: an output of the If, empty when the else branch runs
        >>> list(node.output), {a.name: [o.name for o in a.g.output] for a in node.attribute}
        (['y', 'r'], {'else_branch': ['b', 'layertap/empty/r'], 'then_branch': ['a', 'r']})
    """

    model: "onnx.ModelProto"
    _names: set[str] | None = field(default=None, repr=False)
    _types: dict[Path, dict[str, "onnx.ValueInfoProto"]] | None = field(default=None, repr=False)
    # names each subgraph (with its own subgraphs) defines, by path: only grown by carrying, never
    # by a name asked about later (a carried name is already inside), so read once
    _trees: dict[Path, set[str]] = field(default_factory=dict, repr=False)

    def carry(self, name: str) -> str | None:
        """Make the branch tensor ``name`` a value of the main graph; return its main-graph name
        (``name`` itself), or ``None`` when no subgraph of a main-graph node defines it."""
        graph = self.model.graph
        taken = _defined(graph)
        if name in taken:
            return name
        if self._check(graph, (), name) is None:
            return None
        got = self._carry(graph, (), name, taken)
        return None if got is None else got.name

    def _holder(self, graph: "onnx.GraphProto", path: Path, name: str) -> "tuple[int, onnx.NodeProto] | None":
        """The one node of ``graph`` whose subgraphs define ``name`` (``None``: none); refused when
        several do, or when its op is not one whose subgraph values can be carried."""
        holders = [(k, n) for k, n in enumerate(graph.node)
                   if any(name in self._tree((*path, (k, a.name)), a.g) for a in n.attribute if a.HasField("g"))]
        if not holders:
            return None
        if len(holders) > 1:
            where = ", ".join(f"{n.op_type} {n.name or '(unnamed)'!r}" for _, n in holders[:3])
            raise OnnxFileError(f"tensor {name!r} is defined inside the subgraphs of several nodes ({where}); "
                                "it cannot be told apart by name")
        k, node = holders[0]
        if node.op_type not in _CARRIERS:
            raise OnnxFileError(f"tensor {name!r} is inside a subgraph of {node.op_type} node {node.name or '(unnamed)'!r}; "
                                "only tensors inside If, Loop and Scan subgraphs can be carried out to the main graph")
        return k, node

    def _check(self, graph: "onnx.GraphProto", path: Path, name: str) -> bool | None:
        """Every refusal :meth:`_carry` could meet, raised before anything is edited; whether the
        tensor's type is known (``None``: no subgraph of ``graph`` defines it)."""
        held = self._holder(graph, path, name)
        if held is None:
            return None
        k, node = held
        found: list[bool | None] = []
        for a in node.attribute:
            if a.name in _CARRIERS[node.op_type]:
                p = (*path, (k, a.name))
                found.append(self._type_of(p, name) is not None if name in _defined(a.g) else self._check(a.g, p, name))
        typed = any(found)
        if node.op_type == "If" and None in found and not typed:
            raise OnnxFileError(f"cannot find the type of tensor {name!r} inside a branch of If node "
                                f"{node.name or '(unnamed)'!r} (shape inference does not type it), so the other branch "
                                "cannot give an empty value of that type")
        return typed

    def _carry(self, graph: "onnx.GraphProto", path: Path, name: str, taken: set[str]) -> "onnx.ValueInfoProto | None":
        """Carry ``name`` out of the one node of ``graph`` whose subgraphs define it: the node's new output."""
        held = self._holder(graph, path, name)
        if held is None:
            return None
        k, node = held
        inner = {a.name: a.g for a in node.attribute if a.name in _CARRIERS[node.op_type]}
        values = {a: self._inner_value(g, (*path, (k, a)), name, taken) for a, g in inner.items()}
        found = next(v for v in values.values() if v is not None)
        if node.op_type == "If":
            for a, g in inner.items():
                g.output.append(values[a] or self._empty(g, found))
        else:
            inner["body"].output.append(found)
            _extend_scan_attrs(node)
        # the node's output may be empty (a branch that did not run, no iteration): rank only
        outer = _loose(_stacked(found) if node.op_type != "If" else found)
        outer.name = name if name not in taken else self._fresh(name)
        node.output.append(outer.name)
        return outer

    def _inner_value(self, g: "onnx.GraphProto", path: Path, name: str, taken: set[str]) -> "onnx.ValueInfoProto | None":
        """``name``'s value as an output of ``g`` to add (typed when known), carried up from deeper subgraphs."""
        import onnx

        own = _defined(g)
        if name in own:
            vi = self._type_of(path, name)
            out = _copy(vi) if vi is not None else onnx.helper.make_empty_tensor_value_info(name)
            out.name = name
        else:
            deeper = self._carry(g, path, name, taken | own)
            if deeper is None:
                return None
            out = deeper
        if out.name in {o.name for o in g.output} or out.name in {i.name for i in g.input}:
            copy = self._fresh(_COPY_PREFIX + name)
            g.node.append(onnx.helper.make_node("Identity", [out.name], [copy], name=copy))
            out = _copy(out)
            out.name = copy
        return out

    def _empty(self, g: "onnx.GraphProto", like: "onnx.ValueInfoProto") -> "onnx.ValueInfoProto":
        """An empty value of ``like``'s type made in ``g`` (the branch that does not compute the tensor)."""
        import onnx

        kind = like.type.WhichOneof("value")
        name = self._fresh(_EMPTY_PREFIX + like.name)
        if kind == "sequence_type" and like.type.sequence_type.elem_type.tensor_type.elem_type:
            node = onnx.helper.make_node("SequenceEmpty", [], [name], name=name,
                                         dtype=like.type.sequence_type.elem_type.tensor_type.elem_type)
        elif kind == "tensor_type" and like.type.tensor_type.elem_type:
            tt = like.type.tensor_type
            # a scalar has no empty form of its rank: [0], and the branches' outputs lose their rank
            dims = [0] * len(tt.shape.dim) if tt.HasField("shape") and len(tt.shape.dim) else [0]
            node = onnx.helper.make_node("Constant", [], [name], name=name,
                                         value=onnx.helper.make_tensor(name, tt.elem_type, dims, []))
        else:
            raise OnnxFileError(f"cannot find the type of tensor {like.name!r} inside a branch (shape inference does not "
                                "type it), so the other branch cannot give an empty value of that type")
        g.node.append(node)
        out = _loose(like)  # the rank kept: OpenVINO's CPU plug-in refuses an If output of unknown rank
        out.name = name
        if kind == "tensor_type" and len(dims) != len(out.type.tensor_type.shape.dim):
            out.type.tensor_type.ClearField("shape")
            like.type.tensor_type.ClearField("shape")
        return out

    def _tree(self, path: Path, g: "onnx.GraphProto") -> set[str]:
        if path not in self._trees:
            self._trees[path] = {t for inner in inner_graphs(g) for t in _defined(inner)}
        return self._trees[path]

    def _type_of(self, path: Path, name: str) -> "onnx.ValueInfoProto | None":
        """``name``'s type in the subgraph at ``path``, from ONNX shape inference of the whole model (run once)."""
        if self._types is None:
            self._types = subgraph_types(self.model)
        return self._types.get(path, {}).get(name)

    def _fresh(self, base: str) -> str:
        if self._names is None:
            self._names = {t for g in inner_graphs(self.model.graph) for t in _defined(g)}
        return fresh_name(base, self._names)


def padded_outputs(graph: "onnx.GraphProto") -> dict[str, str]:
    """Outputs of ``graph``'s ``If`` nodes that one branch gives as an empty stand-in (a tensor
    carried out of the other branch) -> that If node's name.

    Example:
        >>> import onnx.helper as h
        >>> m = h.make_model(h.make_graph([h.make_node("If", ["c"], [], name="pick",
        ...     then_branch=h.make_graph([h.make_node("Relu", ["x"], ["r"])], "t", [], []),
        ...     else_branch=h.make_graph([], "e", [], []))], "g", [h.make_tensor_value_info("x", 1, [2])], []))
        >>> _ = Carrier(m).carry("r")
        >>> padded_outputs(m.graph)
        {'r': 'pick'}
    """
    out: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "If":
            continue
        for attr in node.attribute:
            made = {t for n in attr.g.node if n.name.startswith(_EMPTY_PREFIX) for t in n.output}
            out.update((o, node.name) for o, b in zip(node.output, attr.g.output) if b.name in made)
    return out


def flat_graph(graph: "onnx.GraphProto", ops: Collection[str] | None = None) -> "onnx.GraphProto":
    """A view of ``graph`` for reading module scopes and data flow, never run: each node's
    subgraph nodes (at any depth) inlined before it, in order, their initializers with them.

    The node itself stays, without its subgraphs, reading what its subgraphs output (so data
    flows from the branch nodes to the node's outputs); an output of it that a subgraph already
    computes (a tensor carried out) is left to the node inside. A name several subgraphs
    define (both branches of an If) has one producer per subgraph in the view. Nodes layertap
    added to carry tensors out are left out. ``ops``: inline only the subgraphs of these op types.

    Example:
        >>> import onnx.helper as h
        >>> then = h.make_graph([h.make_node("Relu", ["x"], ["r"], name="/a/Relu")], "then", [],
        ...                     [h.make_empty_tensor_value_info("r")])
        >>> other = h.make_graph([h.make_node("Neg", ["x"], ["n"], name="/b/Neg")], "else", [],
        ...                      [h.make_empty_tensor_value_info("n")])
        >>> g = h.make_graph([h.make_node("If", ["c"], ["y"], name="/If", then_branch=then, else_branch=other)], "g", [], [])
        >>> [(n.name, list(n.input), list(n.output)) for n in flat_graph(g).node]
        [('/a/Relu', ['x'], ['r']), ('/b/Neg', ['x'], ['n']), ('/If', ['c', 'r', 'n'], ['y'])]
    """
    import onnx

    out = onnx.GraphProto()
    out.name = graph.name
    out.input.extend(graph.input)
    out.output.extend(graph.output)
    out.value_info.extend(graph.value_info)
    out.initializer.extend(graph.initializer)
    for node in graph.node:
        _inline(node, out, ops)
    return out


def with_branches(graph: "onnx.GraphProto", ops: Collection[str] | None = None) -> "onnx.GraphProto":
    """:func:`flat_graph` of a graph with subgraphs; any other graph as it is (no copy)."""
    return flat_graph(graph, ops) if has_subgraphs(graph) else graph


def _inline(node: "onnx.NodeProto", out: "onnx.GraphProto", ops: Collection[str] | None) -> None:
    import onnx

    if node.name.startswith(_MADE):
        return
    # then before else: rows follow the order a reader of the model expects
    attrs = sorted(node.attribute, key=lambda a: a.name != "then_branch")
    subs = [g for a in attrs for g in attribute_graphs(a)] if ops is None or node.op_type in ops else []
    if not subs:
        out.node.append(node)
        return
    inside: set[str] = set()
    for sub in subs:
        out.initializer.extend(sub.initializer)
        for inner in sub.node:
            _inline(inner, out, ops)
        inside.update(t for g in inner_graphs(sub) for t in _defined(g))
    bare = onnx.NodeProto()
    bare.CopyFrom(node)
    kept = [a for a in node.attribute if not a.HasField("g") and not len(a.graphs)]
    del bare.attribute[:]
    bare.attribute.extend(kept)
    carried = {t for t in node.output if t in inside}  # outputs carrying a tensor out feed nothing else
    skip = 1 if node.op_type == "Loop" else 0  # a Loop body's first output is its condition
    kept = [i for i, t in enumerate(node.output) if t not in carried]
    bare.input.extend(sub.output[i + skip].name for sub in subs for i in kept if i + skip < len(sub.output))
    del bare.output[:]
    bare.output.extend("" if t in carried else t for t in node.output)
    out.node.append(bare)


def carry_all(model: "onnx.ModelProto", names: Iterator[str] | list[str]) -> dict[str, str]:
    """Carry each of ``names`` (branch tensors) out to the main graph; their main-graph names."""
    carrier = Carrier(model)
    out = {}
    for n in names:
        got = carrier.carry(n)
        if got is not None:
            out[n] = got
    return out


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
def _defined(graph: "onnx.GraphProto") -> set[str]:
    """Names ``graph`` itself defines (node outputs, inputs, initializers), not those of its subgraphs."""
    return ({t for n in graph.node for t in n.output if t} | {i.name for i in graph.input}
            | {i.name for i in graph.initializer})


def _copy(vi: "onnx.ValueInfoProto") -> "onnx.ValueInfoProto":
    import onnx

    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    return out


def _stacked(vi: "onnx.ValueInfoProto") -> "onnx.ValueInfoProto":
    """The type of a scan output stacking values of type ``vi``: one more (unknown) leading axis."""
    out = _copy(vi)
    tt = out.type.tensor_type
    if out.type.WhichOneof("value") == "tensor_type" and tt.HasField("shape"):
        dims = [_copy_dim(d) for d in tt.shape.dim]
        del tt.shape.dim[:]
        tt.shape.dim.add()
        for d in dims:
            tt.shape.dim.add().CopyFrom(d)
    return out


def _loose(vi: "onnx.ValueInfoProto") -> "onnx.ValueInfoProto":
    """``vi``'s type with every dimension unknown (its rank kept)."""
    out = _copy(vi)
    if out.type.WhichOneof("value") == "tensor_type" and out.type.tensor_type.HasField("shape"):
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    return out


def _copy_dim(d: "onnx.TensorShapeProto.Dimension") -> "onnx.TensorShapeProto.Dimension":
    import onnx

    out = onnx.TensorShapeProto.Dimension()
    out.CopyFrom(d)
    return out


def _extend_scan_attrs(node: "onnx.NodeProto") -> None:
    """A Scan that lists its scan outputs' axes or directions lists one more (0: stacked along axis 0, forward)."""
    for a in node.attribute:
        if a.name in ("scan_output_axes", "scan_output_directions"):
            a.ints.append(0)


def subgraph_types(model: "onnx.ModelProto") -> dict[Path, dict[str, "onnx.ValueInfoProto"]]:
    """Typed value infos per subgraph of ``model``, by the subgraph's path from the main graph
    (``()`` the main graph; ``((k, "then_branch"),)`` the then branch of its k-th node)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - shape inference fails on some valid files: tensors stay untyped
        inferred = model
    out: dict[Path, dict[str, onnx.ValueInfoProto]] = {}

    def visit(g: "onnx.GraphProto", path: Path) -> None:
        out[path] = {vi.name: vi for vi in list(g.value_info) + list(g.output) if is_typed(vi)}
        for k, node in enumerate(g.node):
            for a in node.attribute:
                if a.HasField("g"):
                    visit(a.g, (*path, (k, a.name)))

    visit(inferred.graph, ())
    return out
