"""What ``layertap fix`` keeps in float32: the units of the float32 file, with the nodes each holds.

Two kinds behind one interface (:class:`Units`):

* :class:`ModuleNodes`: PyTorch module paths, where the file carries module scopes (either torch
  exporter); a module holds the nodes of every call of it, its submodules' included.
* :class:`NodeUnits`: the file's own ONNX nodes, where it carries none (paddle2onnx, tf2onnx, a
  renamed or hand-made graph). Each node that computes on data is a unit, as the rows of a
  scope-less comparison are its tensors, one per node: the ranking reads each node's own error
  (``local_rel``) with nothing summed over a group, and pruning can drop a Pad or a MaxPool next
  to the node that needs float32. (Polygraphy's ``debug precision`` also works per layer.)

:func:`units_of` picks the kind. Never imports torch.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, ClassVar, Iterable, Sequence

from ..errors import LayertapError, unknown_name
from ..onnxfile.scopemap import GraphFacts, ScopeMap

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.scopemap import ScopeMap

# element-wise activations a quantiser fuses into the node before them (their output shares its rounding)
_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Identity"}


class Units:
    """Units of the float32 file <-> its node names; subclasses fill ``_nodes`` (unit -> node
    indices, ascending), ``order`` (unit -> its first node) and ``_owner`` (node -> the unit whose
    value it computes). ``kind`` is the unit in words: ``module`` or ``node``."""

    kind: ClassVar[str] = "unit"
    hint: ClassVar[str] = ""  # where a user finds the names (for unknown-name errors)

    def __init__(self, graph: "onnx.GraphProto") -> None:
        self.order: dict[str, int] = {}
        self._nodes: dict[str, list[int]] = {}
        self._owner: dict[int, str] = {}
        self._names = [n.name for n in graph.node]
        self._ops = [n.op_type for n in graph.node]
        self._outputs = [set(n.output) for n in graph.node]
        self._inputs = [set(n.input) for n in graph.node]
        facts = GraphFacts(graph)
        self._weight_nodes = facts.weight_nodes
        self._weights = facts.weights
        self._made_by = {t: i for i, outs in enumerate(self._outputs) for t in outs if t}

    def modules(self) -> list[str]:
        """Every unit with nodes, in graph order."""
        return sorted(self._nodes, key=lambda p: (self.order[p], p.count(".")))

    def check(self, paths: Sequence[str]) -> list[str]:
        """``paths`` as units; an unknown one is a one-line error with close matches."""
        for p in paths:
            if p not in self._nodes:
                raise LayertapError(unknown_name(self.kind, p, self.modules(), self.hint))
        return list(paths)

    def names(self, paths: Sequence[str]) -> list[str]:
        """Node names of ``paths``, in graph order (the converters' node lists), with every node that makes a
        constant they read (:meth:`feeders`): a unit kept in float32 keeps what it reads."""
        own = {i for p in paths for i in self._nodes.get(p, ())}
        picked = sorted(own | self.feeders(own))
        return [self._names[i] for i in picked if self._names[i]]

    def feeders(self, nodes: Iterable[int]) -> set[int]:
        """The nodes that make the constants ``nodes`` read: ``Constant`` nodes and nodes computing on
        weights alone (a reshaped or sliced weight), back to the initializers. A converter rounds and clamps
        a constant its node makes unless that node is kept too (paddle2onnx writes a BatchNormalization's
        running variance as a ``Constant``).

        Example:
            >>> import onnx.helper as h, numpy as np, onnx.numpy_helper as nh
            >>> g = h.make_graph([h.make_node("Constant", [], ["v"], name="c", value=nh.from_array(np.ones(2, np.float32))),
            ...                   h.make_node("Neg", ["v"], ["nv"], name="neg"), h.make_node("Add", ["x", "nv"], ["y"], name="add")],
            ...                  "g", [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
            >>> units = NodeUnits(h.make_model(g))
            >>> units.names(["add"]), units.modules()
            (['c', 'neg', 'add'], ['add'])
        """
        found: set[int] = set()
        todo = [t for i in nodes for t in self._inputs[i]]
        while todo:
            i = self._made_by.get(todo.pop())
            if i is None or i in found or i not in self._weight_nodes:
                continue
            found.add(i)
            todo.extend(self._inputs[i])
        return found

    def constants_read(self, path: str) -> set[str]:
        """The constant tensors unit ``path`` reads (initializers, ``Constant`` outputs, values computed from
        them), its own nodes' and those of the nodes that make them (:meth:`feeders`)."""
        own = set(self._nodes.get(path, ()))
        return {t for i in own | self.feeders(own) for t in self._inputs[i] if t in self._weights}

    def unit_of(self, row_path: str) -> str | None:
        """The unit a comparison row stands for (``None``: none, e.g. the model's output row)."""
        return row_path if row_path in self._nodes else None

    def innermost(self, units: Iterable[str]) -> list[str]:
        """Of ``units``, those with none of the others inside them."""
        return list(units)

    def _related(self, a: str, b: str) -> bool:
        """Whether ``a`` is ``b`` or holds it or lies in it."""
        return a == b

    def readers(self, path: str) -> list[str]:
        """The innermost units whose nodes read a tensor ``path`` makes (its consumers)."""
        own = set(self._nodes[path])
        made = set().union(*(self._outputs[i] for i in own))
        return self._innermost(path, {i for i, ins in enumerate(self._inputs) if i not in own and ins & made})

    def writers(self, path: str) -> list[str]:
        """The innermost units whose nodes make a tensor ``path`` reads (its producers); through an
        activation (ReLU and the like) to the unit before it, whose output the activation passes
        on: a quantiser rounds that tensor where the activation's producer writes it."""
        found = self._writers(path)
        for w in list(found):
            if all(self._ops[i] in _ACTIVATIONS for i in self._nodes[w]):
                found += [p for p in self._writers(w) if p not in found and p != path]
        return found

    def _writers(self, path: str) -> list[str]:
        own = set(self._nodes[path])
        read = set().union(*(self._inputs[i] for i in own)) - set().union(*(self._outputs[i] for i in own))
        return self._innermost(path, {i for i, outs in enumerate(self._outputs) if i not in own and outs & read})

    def _innermost(self, path: str, nodes: set[int]) -> list[str]:
        """The units owning ``nodes``, in graph order, other than ``path`` and those it holds or lies in."""
        found = {self._owner[i] for i in nodes if i in self._owner}
        return sorted((p for p in found if not self._related(p, path)), key=lambda p: self.order[p])


#: the unit of the model's own operators (under no submodule's scope), and its words
ROOT_UNIT = "(root)"


def own_unit(path: str) -> str:
    """The unit of module ``path``'s own operators, under no child's scope (a residual ``Add``):
    ``layer1.0 (own)``; the root's is :data:`ROOT_UNIT`.

    Example:
        >>> own_unit("layer1.0"), own_unit("")
        ('layer1.0 (own)', '(root)')
    """
    return f"{path} (own)" if path else ROOT_UNIT


def input_unit(name: str) -> str:
    """The unit of the nodes reading model input ``name``: kept in float32, no quantiser rounds that input."""
    return f"(input {name})"


class ModuleNodes(Units):
    """Module paths <-> node names of the float32 file (every call of a module, its submodules
    included), from :class:`~layertap.onnxfile.scopemap.ScopeMap`; and so that every node belongs to
    a unit the search can keep, the units of a module's own nodes where it has children too
    (:func:`own_unit`: a block's residual ``Add``, the root's own operators) and of the nodes reading each
    model input (:func:`input_unit`: the input's quantiser)."""

    kind = "module"
    hint = "module paths of the float32 file; 'layertap layers REF' lists them"

    def __init__(self, model: "onnx.ModelProto", smap: "ScopeMap | None" = None) -> None:
        super().__init__(model.graph)
        smap = smap or ScopeMap.from_model(model)
        at = _node_indices(smap.graph, model.graph)
        for path in smap.modules():
            found = sorted({at[i] for k in range(smap.calls(path)) for i in smap.call_nodes(path, k)[0] if i in at})
            if path and found:
                self._add(path, found)
        # each node's module: the deepest call that holds its value (a folded Conv is its BatchNorm's)
        self._owner = {at[i]: path for i, (path, _) in smap.owners().items() if path in self._nodes and i in at}
        self._own_units(model.graph)

    def _add(self, unit: str, nodes: list[int]) -> None:
        self._nodes[unit] = nodes
        self.order[unit] = nodes[0]

    def _own_units(self, graph: "onnx.GraphProto") -> None:
        """The units of nodes no leaf unit holds: a parent's own (a node whose owner has children units,
        or no owner at all: the root's), and each model input's readers."""
        parents = {p for p in self._nodes if any(q.startswith(p + ".") for q in self._nodes)}
        own: dict[str, list[int]] = {}
        for i in range(len(graph.node)):
            if i in self._weight_nodes:
                continue
            owner = self._owner.get(i)
            if owner is None or owner in parents:
                own.setdefault(own_unit(owner or ""), []).append(i)
        for unit, nodes in own.items():
            self._add(unit, nodes)
            self._owner.update(dict.fromkeys(nodes, unit))
        inits = {t.name for t in graph.initializer}
        for inp in (i.name for i in graph.input if i.name not in inits):
            readers = [i for i, ins in enumerate(self._inputs) if inp in ins and i not in self._weight_nodes]
            if readers:
                self._add(input_unit(inp), readers)

    def unit_of(self, row_path: str) -> str | None:
        """A row's unit: the module's own nodes where it has children units (the model's output row: the
        root's own), else the module."""
        own = own_unit(row_path)
        if own in self._nodes:
            return own
        return row_path if row_path and row_path in self._nodes else None

    def innermost(self, units: Iterable[str]) -> list[str]:
        units = list(units)
        return [p for p in units if not any(q.startswith(p + ".") for q in units)]

    def _related(self, a: str, b: str) -> bool:
        return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _node_indices(view: "onnx.GraphProto", graph: "onnx.GraphProto") -> dict[int, int]:
    """A scope map's node index -> the index of that node in ``graph``: the same where the map read
    ``graph`` itself, by node name where it read a copy with more nodes (a fused decoder's hidden
    values made tensors), whose added nodes the file does not have.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g", [], [])
        >>> v = h.make_graph([h.make_node("Neg", ["x"], ["n"], name="added"), *g.node], "v", [], [])
        >>> _node_indices(g, g), _node_indices(v, g)
        ({0: 0}, {1: 0})
    """
    if view is graph:
        return {i: i for i in range(len(graph.node))}
    index = {n.name: i for i, n in enumerate(graph.node)}
    return {i: index[n.name] for i, n in enumerate(view.node) if n.name in index}


class NodeUnits(Units):
    """The nodes of a file without module scopes, by node name: each named node that computes on
    data (not on weights alone). A tensor name stands for the node that makes it.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["relu_0.tmp_0"], name="p2o.Relu.0"),
        ...                   h.make_node("Neg", ["relu_0.tmp_0"], ["y"], name="p2o.Neg.0")], "g",
        ...                  [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> units = NodeUnits(h.make_model(g))
        >>> units.modules(), units.check(["relu_0.tmp_0"]), units.readers("p2o.Relu.0")
        (['p2o.Relu.0', 'p2o.Neg.0'], ['p2o.Relu.0'], ['p2o.Neg.0'])
    """

    kind = "node"
    hint = "node names, or the tensor names they make, of the float32 file; 'layertap layers REF' lists the tensors"

    def __init__(self, model: "onnx.ModelProto") -> None:
        super().__init__(model.graph)
        weights = self._weight_nodes
        times = Counter(self._names)
        for i, name in enumerate(self._names):
            if name and i not in weights and times[name] == 1:  # a name given twice cannot be told apart
                self._nodes[name], self.order[name], self._owner[i] = [i], i, name
        self._made = {t: self._names[i] for i, outs in enumerate(self._outputs) for t in outs
                      if t and self._names[i] in self._nodes}
        self.unnamed = sum(1 for i, n in enumerate(self._names) if not n and i not in weights)

    def check(self, paths: Sequence[str]) -> list[str]:
        """Node names, a tensor name standing for the node that makes it; unknown: one line with close matches."""
        out = []
        for p in paths:
            unit = p if p in self._nodes else self._made.get(p)
            if unit is None:
                raise LayertapError(unknown_name(self.kind, p, [*self.modules(), *self._made], self.hint))
            out.append(unit)
        return list(dict.fromkeys(out))

    def unit_of(self, row_path: str) -> str | None:
        """A scope-less comparison's row is a tensor: the node that makes it."""
        return self._made.get(row_path)


def units_of(model: "onnx.ModelProto") -> Units:
    """The units ``fix`` keeps: module paths where the file carries module scopes, else its nodes.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["conv2d_0.tmp_0"], name="p2o.Relu.0")], "g",
        ...                  [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("conv2d_0.tmp_0", 1, [2])])
        >>> units_of(h.make_model(g)).kind
        'node'
    """
    smap = ScopeMap.from_model(model)
    if smap.source != "none":
        modules = ModuleNodes(model, smap)
        if modules.modules():
            return modules
    return NodeUnits(model)


__all__ = ["ROOT_UNIT", "ModuleNodes", "NodeUnits", "Units", "input_unit", "own_unit", "units_of"]

