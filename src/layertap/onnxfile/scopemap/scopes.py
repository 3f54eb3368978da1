"""ONNX tensor <-> PyTorch module path, for files from either torch exporter.

Where the module of a node comes from (:mod:`.node_scopes`):

* torch.export-based exporter (``dynamo=True``): node ``metadata_props``
  ``pkg.torch.onnx.name_scopes``, a Python-literal list of cumulative module
  paths, root first, FX node name last (``['', 'layer1', 'layer1.0',
  'layer1.0.relu', 'relu_1']``). Read with :func:`ast.literal_eval`, never eval.
* TorchScript exporter (``dynamo=False``): node names ``/layer1/layer1.0/conv1/Conv``.
  A component is either a child attribute (``conv1``) or, for children of
  containers, the parent's name extended (``layer1.0`` under ``layer1``,
  ``layer.0`` under ``encoder`` when the ModuleList itself never ran). A
  ``_k`` suffix on a component (``relu_1``) is call ``k`` of that module when
  the unsuffixed sibling (``relu``) also owns nodes.
* anything else: no module information (:attr:`ScopeMap.source` is ``"none"``).

Calls (:mod:`.calls`). The TorchScript ``_k`` suffix gives call indices
directly. Under dynamo a call is a maximal run of consecutive nodes (graph
order) inside the module's scope; nodes without scope information (constants)
do not break a run. Back-to-back calls (``act(act(x))``, a loop over one
block) read as one call; a call whose nodes repeat one pattern is refused,
and so are the later calls of that module.

A module's output for one call is the tensor its nodes hand to the rest of the
graph (or a graph output); its input is the tensor its nodes read from outside,
weights and values computed only from weights excluded. ONNX does not record
which element of a tuple a tensor is, so a call with several output (or input)
tensors is refused with their names, to be selected by tensor name.

Folds and rewrites (:mod:`.folds`): eval-mode BatchNorm folded into its Conv
makes the Conv's own value vanish; the Conv's :class:`Counterpart` names the
BatchNorm in ``absorbed_by`` (``None`` under TorchScript when the BatchNorm's
name cannot be guessed). Other optimizer rewrites that may span modules make
the input or output at the rewritten node untrusted, and so do edges where a
node reads a tensor its FX node never took (nodes rewritten away, dynamo).

Example:
    >>> import onnx.helper as h
    >>> nodes = [h.make_node("Relu", ["x"], ["r0"], name="/block/act/Relu"),   # TorchScript names:
    ...          h.make_node("Neg", ["r0"], ["n"], name="/block/neg/Neg"),     # act runs twice
    ...          h.make_node("Relu", ["n"], ["r1"], name="/block/act_1/Relu")]
    >>> g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", 1, [4])], [h.make_tensor_value_info("r1", 1, [4])])
    >>> smap = ScopeMap.from_model(h.make_model(g))
    >>> smap.resolve(Tap.parse("block.act"))
    [('block.act#0', 'r0'), ('block.act#1', 'r1')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection

from ...errors import OnnxFileError, unknown_name
from ...selectors import Tap
from ..branches import with_branches
from ..kvcache import kv_layout
from ..metadata import NAME_SCOPES_KEY
from .calls import Call, build_calls, refuse_merged_calls
from .folds import (
    distrust_bypassed_edges,
    distrust_rewrites,
    distrust_suspects,
    fold_dynamo,
    fold_fusions,
    fold_torchscript,
)
from .graph_facts import RULE_KEY, GraphFacts, is_fusion
from .llm_names import fused_calls, is_fused_llm, with_fused_values
from .node_scopes import read_nodes
from .placing import place_floating

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_BY_NAME = "select it by tensor name (add_outputs tensors=[...], --tensor NAME, or a run tap)"


@dataclass(frozen=True)
class Counterpart:
    """One call of one PyTorch module and the ONNX tensors that hold its output.

    Attributes:
        path: module path (never ``""``; the root's result is the graph output).
        call: 0-based call index, in graph order.
        tensors: boundary tensors of that call, in graph order; empty when none
            is trustworthy (then ``note`` says why).
        note: why there is no trustworthy tensor, else ``None``.
        absorbed_by: for a module folded into another (Conv into its
            BatchNorm), the module path whose node holds the fused value;
            ``None`` otherwise, and under TorchScript when the BatchNorm's name
            cannot be guessed.
        unverified: for a call refused only because an optimizer rewrite, or a
            node inserted without scope after it, may have moved its value, the
            boundary tensors it would have had; a caller that knows the true
            value can check them numerically.

    Example:
        >>> cp = Counterpart("layer1.0.conv1", 0, (), "folded into node X with layer1.0.bn1", "layer1.0.bn1")
        >>> cp.note, cp.absorbed_by
        ('folded into node X with layer1.0.bn1', 'layer1.0.bn1')
    """

    path: str
    call: int
    tensors: tuple[str, ...]
    note: str | None = None
    absorbed_by: str | None = None
    unverified: tuple[str, ...] = ()


class ScopeMap:
    """Module paths of an ONNX graph's nodes, their calls and boundary tensors.

    Build it with :meth:`from_model`; it reads only the graph structure, so a
    model loaded with ``load_external_data=False`` is enough.

    Example:
        >>> import onnx
        >>> from onnx import helper, TensorProto
        >>> n = helper.make_node("Relu", ["x"], ["y"], name="/act/Relu")
        >>> g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        >>> smap = ScopeMap.from_model(helper.make_model(g))
        >>> smap.source, smap.modules(), smap.resolve(Tap.parse("act")), smap.resolve(Tap.parse("act:input"))
        ('torchscript', ['act'], [('act', 'y')], [('act:input', 'x')])
    """

    def __init__(self, source: str, calls: list[Call], graph: "onnx.GraphProto", node_paths: list[str | None],
                 facts: GraphFacts | None = None) -> None:
        self.source = source
        self._graph = graph
        self._node_paths = node_paths
        self._facts = facts or GraphFacts(graph)
        layout = kv_layout(graph)
        self._cache = frozenset(layout.present.values()) if layout else frozenset()
        self._by_path: dict[str, list[Call]] = {}
        for c in calls:
            self._by_path.setdefault(c.path, []).append(c)
        for lst in self._by_path.values():
            lst.sort(key=lambda c: c.call)
        order = {id(c): i for i, c in enumerate(calls)}
        # completion order: a call sits where its last node is; inner before outer
        self._calls = sorted(
            calls,
            key=lambda c: (max(c.nodes) if c.nodes else -1, -c.path.count(".") if c.path else 0, order[id(c)]),
        )

    # -- construction ---------------------------------------------------------
    @classmethod
    def from_model(cls, model: "onnx.ModelProto", *, branches: bool | Collection[str] = False) -> "ScopeMap":
        """Read module scopes from a model (weights not needed); ``model`` is left as it was.

        ``branches``: read the nodes inside ``If``/``Loop``/``Scan`` subgraphs too (or inside
        those of the op types it lists, e.g. ``("If",)``), on a view
        of the graph with them inlined (:func:`~layertap.onnxfile.branches.flat_graph`); node
        indices then count in that view, so only callers that use tensor names
        ask for it. A graph without subgraphs is read as it is either way. A fused decoder's
        hidden values (:mod:`.llm_names`) are read on a copy with them made tensors, unless the
        graph has them already (:func:`~.llm_names.expose_fused_values_in_place`: what a caller
        that runs the tensors the map names does to its own model first).
        """
        ops = None if branches is True or branches is False else branches
        graph = with_branches(model.graph, ops) if branches else model.graph
        if is_fused_llm(graph):
            graph = with_fused_values(graph)
            calls, paths = fused_calls(graph)
            return cls("builder", calls, graph, paths)
        facts = GraphFacts(graph)
        ns = read_nodes(graph, is_fusion)
        suspects = place_floating(graph, ns, facts)
        chains = ns.chains
        node_paths = [c[-1][0] if c else None for c in chains]
        calls = build_calls(graph, chains, facts)
        if ns.source == "torchscript":
            # call numbers come from node names, so back-to-back calls never merge
            fold_torchscript(graph, calls, facts, ns)
        else:
            refuse_merged_calls(graph, calls, node_paths, facts.weight_nodes)
            fold_dynamo(graph, calls, ns)
            distrust_bypassed_edges(graph, calls, facts)
        fold_fusions(graph, calls, ns, facts)
        distrust_rewrites(graph, calls, facts)
        distrust_suspects(calls, suspects, facts)
        return cls(ns.source, calls, graph, node_paths, facts)

    # -- queries --------------------------------------------------------------
    @property
    def graph(self) -> "onnx.GraphProto":
        """The graph the node indices count in (a view with subgraphs inlined, see :meth:`from_model`)."""
        return self._graph

    def modules(self) -> list[str]:
        """Module paths the file knows, in graph order of first appearance.

        Absorbed modules (a Conv folded into its BatchNorm) are listed too;
        their :meth:`counterparts` carry a note instead of tensors.
        """
        first: dict[str, int] = {}
        for c in self._calls:
            pos = min(c.nodes) if c.nodes else -1
            first[c.path] = min(first.get(c.path, pos), pos)
        return sorted(first, key=lambda p: (first[p], p.count(".")))

    def calls(self, path: str) -> int:
        """How many calls of ``path`` the graph holds (0 for an unknown path)."""
        return len(self._by_path.get(path, ()))

    def counterparts(self) -> list[Counterpart]:
        """Every (module, call) in graph order of completion (inner first).

        ``tensors`` lists every boundary tensor of the call (a comparison
        can pair them with PyTorch values by shape); :meth:`resolve` is
        stricter and refuses calls with several.
        """
        return [self._counterpart(c) for c in self._calls]

    def module_of_node(self, index: int) -> str | None:
        """Innermost module path of node ``index`` (``""`` = root, ``None`` = unknown)."""
        return self._node_paths[index]

    def calls_of_node(self, index: int) -> list[tuple[str, int]]:
        """Every (module, call) whose nodes include node ``index``, outer first."""
        found = [c for c in self._calls if c.has(index)]
        return [(c.path, c.call) for c in sorted(found, key=lambda c: len(c.path))]

    def call_nodes(self, path: str, call: int) -> tuple[list[int], tuple[str, ...], tuple[str, ...]]:
        """Node indices of one call, the tensors it reads from outside (weights excluded)
        and its boundary tensors; empty when the graph has no such call."""
        for c in self._by_path.get(path, ()):
            if c.call == call:
                return list(c.nodes), self._entering(c), self._boundary(c)
        return [], (), ()

    def owners(self) -> dict[int, tuple[str, int]]:
        """:meth:`owner` for every node at once (node index -> (module, call))."""
        out: dict[int, tuple[str, int]] = {}
        parent: dict[int, tuple[str, int]] = {}
        shared: set[int] = set()
        for c in sorted((c for c in self._calls if c.note is None), key=lambda c: len(c.path)):
            for i in c.nodes:
                held = out.get(i)
                if i in shared:
                    continue
                if held is not None and held[0] != c.path and not c.path.startswith(held[0] + "."):
                    # a node two sibling calls share (a packed q/k/v projection) is their parent's
                    shared.add(i)
                    out[i] = parent.get(i, held)
                    continue
                if held is not None:
                    parent[i] = held
                out[i] = (c.path, c.call)
        return out

    def owner(self, index: int) -> tuple[str, int] | None:
        """The (module, call) whose value node ``index`` computes: the deepest call
        without a note (so a folded Conv node belongs to its BatchNorm); a node that
        sibling calls share belongs to the call around them."""
        return self.owners().get(index)

    def resolve(self, tap: Tap | str) -> list[tuple[str, str]]:
        """Tensor names for a tap: ``[(name, tensor_name)]`` named per SPEC.

        ``PATH`` for a module that ran once, ``PATH#k`` per call when it ran k>1
        times and no ``#CALL`` is given. A call must hand exactly one tensor to
        the rest of the graph (read one, for ``:input``); an ``[INDEX]`` other
        than ``[0]`` is refused, because ONNX does not record which tuple
        element a tensor is. Raises :class:`OnnxFileError` for what cannot be
        answered, saying why.
        """
        tap = Tap.parse(tap)
        if tap.pos is not None:
            raise OnnxFileError(
                f"tap {tap.canonical!r}: a graph output holds a module's whole sequence, not one token position: "
                f"add {tap.with_pos(None).canonical!r} and take [:, {tap.pos}] of its value (layertap run reads "
                f"{tap.canonical!r} itself)"
            )
        if tap.path == "":
            return self._resolve_root(tap)
        if self.source == "none":
            raise OnnxFileError(
                f"cannot resolve module {tap.path!r}: this file carries no module scopes (no node has "
                f"'{NAME_SCOPES_KEY}' metadata from the torch.onnx dynamo exporter, and node names are not "
                "TorchScript-exporter scopes like '/layer1/layer1.0/conv1/Conv'); select tensors by name instead"
            )
        calls = self._by_path.get(tap.path)
        if not calls:
            hint = "modules that compute nothing in ONNX, such as Dropout or Identity in eval mode, leave no nodes"
            if any(n.op_type == "QuantizeLinear" for n in self._graph.node):
                hint += ("; a quantizer also removes activations (Relu, Clip) it folds into a QuantizeLinear: "
                         "their value is the output of the module that applies them")
            raise OnnxFileError(unknown_name("module", tap.path, self.modules(), hint=hint))
        if tap.call is not None:
            k = tap.call + len(calls) if tap.call < 0 else tap.call
            if not 0 <= k < len(calls):
                merged = next((c.note for c in calls if c.note and "back-to-back" in c.note), None)
                raise OnnxFileError(
                    f"module {tap.path!r} ran {len(calls)} time(s) in this graph; call #{tap.call} is out of range "
                    f"(use #0..#{len(calls) - 1})" + (f"; {merged}" if merged else "")
                )
            picked = [(tap.name, calls[k])]
        elif len(calls) == 1:
            picked = [(tap.name, calls[0])]
        else:
            picked = [(tap.name_for_call(c.call), c) for c in calls]
        return [(name, self._tensor_for(tap, call)) for name, call in picked]

    # -- helpers --------------------------------------------------------------
    def _counterpart(self, c: Call) -> Counterpart:
        if c.note is not None:
            unverified = self._boundary(c) if c.rewritten else ()
            return Counterpart(c.path, c.call, (), c.note, c.absorbed_by, unverified)
        return Counterpart(c.path, c.call, self._boundary(c), None, c.absorbed_by)

    def _boundary(self, c: Call) -> tuple[str, ...]:
        tensors = c.tensors if c.tensors is not None else self._facts.boundary(c.nodes)
        # a decoder layer also hands its KV cache to the graph's outputs: its value is the other tensor
        kept = tuple(t for t in tensors if t not in self._cache)
        return kept if kept else tensors

    def _entering(self, c: Call) -> tuple[str, ...]:
        return c.inputs if c.inputs is not None else self._facts.entering(c.nodes)

    def _tensor_for(self, tap: Tap, c: Call) -> str:
        """The one tensor that answers ``tap`` for call ``c``, or a one-line refusal."""
        label = f"{c.path}#{c.call}" if self.calls(c.path) > 1 else c.path
        if tap.port == "input":
            if c.input_note is not None:
                raise OnnxFileError(f"the input of module {label!r} is not in this file: {c.input_note}")
            tensors, what = self._entering(c), "input"
        else:
            if c.note is not None:
                raise OnnxFileError(f"module {label!r} has no tensor of its own in this file: {c.note}")
            tensors, what = self._boundary(c), "output"
        if not tensors:
            extra = " (it reads only weights or values computed from weights)" if what == "input" else ""
            raise OnnxFileError(f"module {label!r} has no {what} tensor in this graph{extra}")
        if len(tensors) > 1:
            raise OnnxFileError(
                f"tap {tap.canonical!r}: module {label!r} has {len(tensors)} {what} tensors ({', '.join(tensors)}) and "
                f"ONNX does not record which tuple element each one is; {_BY_NAME}"
            )
        if tap.index and tuple(tap.index) != (0,):
            raise OnnxFileError(
                f"tap {tap.canonical!r}: ONNX does not record which element of module {label!r}'s {what} a tensor is "
                f"(the graph keeps one {what} tensor, {tensors[0]}); {_BY_NAME}"
            )
        return tensors[0]

    def _resolve_root(self, tap: Tap) -> list[tuple[str, str]]:
        # The exporters flatten the model's own inputs and results in order, so
        # positions of graph inputs/outputs are the flattened positions.
        if tap.port == "input":
            inits = {i.name for i in self._graph.initializer}
            tensors = [i.name for i in self._graph.input if i.name not in inits]
        else:
            tensors = [o.name for o in self._graph.output]
        name = tap.name
        if tap.index:
            i = tap.index[0]
            if not isinstance(i, int) or not -len(tensors) <= i < len(tensors):
                raise OnnxFileError(f"tap {tap.canonical!r}: the model has {len(tensors)} {tap.port}(s); pick [0]..[{len(tensors) - 1}]")
            return [(name, tensors[i])]
        if len(tensors) == 1:
            return [(name, tensors[0])]
        return [(f"{name}[{i}]", t) for i, t in enumerate(tensors)]




__all__ = ["Counterpart", "ScopeMap", "NAME_SCOPES_KEY", "RULE_KEY"]
