"""ONNX tensor <-> PyTorch module path, for files from either torch exporter.

Where the module of a node comes from:

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

Calls. The TorchScript ``_k`` suffix gives call indices directly. Everywhere
else a call is a maximal run of consecutive nodes (graph order) inside the
module's scope; nodes without scope information (constants) do not break a
run. Known limit: a module called twice back to back with no node of another
scope between the calls (``act(act(x))``, a shared block applied in a loop)
shows as one call.

A module's output for one call is every tensor produced by that call's nodes
and used outside them (or a graph output), in graph order.

BatchNorm folded into Conv (both exporters do it in eval mode):

* dynamo: the fused Conv carries the BatchNorm's scope and the
  ``pkg.onnxscript.rewriter.rule_name`` ``FuseBatchNormIntoConv``; its weight
  initializer keeps the Conv's parameter name (``layer1.0.conv1.weight``), which
  names the absorbed Conv module.
* TorchScript: the fused Conv keeps the Conv's name (``/layer1/layer1.0/conv1/Conv``)
  while its output is the BatchNorm's value. Rule used here: a TorchScript
  Conv whose weight is not an initializer named ``<conv path>.weight`` (the
  exporter gives folded weights anonymous names such as ``onnx::Conv_196``)
  is treated as folded. The Conv module is then reported as absorbed, and the
  BatchNorm is guessed by name: ``convN -> bnN`` (also ``conv -> bn/norm``)
  and, in containers, ``k -> k+1`` (``downsample.0 -> downsample.1``). The
  guessed BatchNorm resolves to the fused node's output; when no guess can be
  made only the absorption is reported. A wrongly guessed fold errs on the safe
  side: the Conv is refused, never answered with the BatchNorm's value.

Other onnxscript rewrites that fuse several nodes (rule names starting with
``Fuse``, e.g. ``FuseSuccessiveRelu``) can merge two calls or two modules
into one node; the affected module calls get a note and no tensor.

Example:
    >>> import onnx
    >>> m = onnx.load("resnet18.onnx", load_external_data=False)   # doctest: +SKIP
    >>> smap = ScopeMap.from_model(m)                                # doctest: +SKIP
    >>> smap.resolve(Tap.parse("layer2.0.relu"))                     # doctest: +SKIP
    [('layer2.0.relu#0', 'relu_5'), ('layer2.0.relu#1', 'relu_6')]
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from ..errors import OnnxFileError, unknown_name
from ..selectors import Tap

if TYPE_CHECKING:  # pragma: no cover
    import onnx

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
RULE_KEY = "pkg.onnxscript.rewriter.rule_name"
_BN_FOLD_RULE = "FuseBatchNormIntoConv"
_CALL_SUFFIX_RE = re.compile(r"^(?P<base>.+)_(?P<call>\d+)$")
_NO_SCOPE_OPS = {"Constant"}  # exporter-made constants: not part of any call


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
            BatchNorm), the module path whose node holds the fused value.

    Example:
        >>> Counterpart("layer1.0.conv1", 0, (), "folded into node X with layer1.0.bn1").note
        'folded into node X with layer1.0.bn1'
    """

    path: str
    call: int
    tensors: tuple[str, ...]
    note: str | None = None
    absorbed_by: str | None = None


@dataclass
class _Call:
    """Nodes of one module call, plus what the fold analysis learned."""

    path: str
    call: int
    nodes: list[int] = field(default_factory=list)
    note: str | None = None          # output not trustworthy (absorbed, merged)
    input_note: str | None = None    # input not in the graph (absorber of a fold)
    tensors: tuple[str, ...] | None = None  # set for absorbed/absorbing calls
    inputs: tuple[str, ...] | None = None

    @property
    def first(self) -> int:
        return self.nodes[0] if self.nodes else -1

    @property
    def last(self) -> int:
        return self.nodes[-1] if self.nodes else -1

    @property
    def node_set(self) -> frozenset[int]:
        cached = self.__dict__.get("_node_set")
        if cached is None or len(cached) != len(self.nodes):
            cached = frozenset(self.nodes)
            self.__dict__["_node_set"] = cached
        return cached


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
        >>> smap.source, smap.modules(), smap.resolve(Tap.parse("act"))
        ('torchscript', ['act'], [('act', 'y')])
    """

    def __init__(self, source: str, calls: list[_Call], graph: "onnx.GraphProto", node_paths: list[str | None]) -> None:
        self.source = source
        self._graph = graph
        self._node_paths = node_paths
        self._by_path: dict[str, list[_Call]] = {}
        for c in calls:
            self._by_path.setdefault(c.path, []).append(c)
        for lst in self._by_path.values():
            lst.sort(key=lambda c: c.call)
        self._uses = _uses(graph)
        self._outputs = {o.name for o in graph.output}
        self._constants = _constant_names(graph)
        order = {id(c): i for i, c in enumerate(calls)}
        # completion order: a call sits where its last node is; inner before outer
        self._calls = sorted(
            calls,
            key=lambda c: (max(c.nodes) if c.nodes else -1, -c.path.count(".") if c.path else 0, order[id(c)]),
        )

    # -- construction ---------------------------------------------------------
    @classmethod
    def from_model(cls, model: "onnx.ModelProto") -> "ScopeMap":
        """Read module scopes from a model (weights not needed)."""
        graph = model.graph
        chains, source = _Chains.read(graph)
        calls = _CallBuilder(graph, chains).build()
        if source == "torchscript":
            _fold_torchscript(graph, calls)
        else:
            _fold_dynamo(graph, calls)
        node_paths = [c[-1][0] if c else None for c in chains]
        return cls(source, calls, graph, node_paths)

    # -- queries --------------------------------------------------------------
    def modules(self) -> list[str]:
        """Module paths the file knows, in graph order of first appearance.

        Absorbed modules (a Conv folded into its BatchNorm) are listed too;
        their :meth:`counterparts` carry a note instead of tensors.
        """
        first: dict[str, int] = {}
        for c in self._all_calls():
            pos = min(c.nodes) if c.nodes else -1
            first[c.path] = min(first.get(c.path, pos), pos)
        return sorted(first, key=lambda p: (first[p], p.count(".")))

    def calls(self, path: str) -> int:
        """How many calls of ``path`` the graph holds (0 for an unknown path)."""
        return len(self._by_path.get(path, ()))

    def counterparts(self) -> list[Counterpart]:
        """Every (module, call) in graph order of completion (inner first)."""
        return [self._counterpart(c) for c in self._calls]

    def module_of_node(self, index: int) -> str | None:
        """Innermost module path of node ``index`` (``""`` = root, ``None`` = unknown)."""
        return self._node_paths[index]

    def calls_of_node(self, index: int) -> list[tuple[str, int]]:
        """Every (module, call) whose nodes include node ``index``, outer first."""
        found = [c for c in self._all_calls() if c.first <= index <= c.last and index in c.node_set]
        return [(c.path, c.call) for c in sorted(found, key=lambda c: len(c.path))]

    def owners(self) -> dict[int, tuple[str, int]]:
        """:meth:`owner` for every node at once (node index -> (module, call))."""
        out: dict[int, tuple[str, int]] = {}
        for c in sorted((c for c in self._all_calls() if c.note is None), key=lambda c: len(c.path)):
            for i in c.nodes:
                out[i] = (c.path, c.call)
        return out

    def owner(self, index: int) -> tuple[str, int] | None:
        """The (module, call) whose value node ``index`` computes: the deepest call
        without a note (so a folded Conv node belongs to its BatchNorm)."""
        best = None
        for c in self._all_calls():
            if c.note is None and c.first <= index <= c.last and index in c.node_set:
                if best is None or len(c.path) > len(best.path):
                    best = c
        return None if best is None else (best.path, best.call)

    def resolve(self, tap: Tap) -> list[tuple[str, str]]:
        """Tensor names for a tap: ``[(name, tensor_name)]`` named per SPEC.

        ``PATH`` for a module that ran once, ``PATH#k`` per call when it ran k>1
        times and no ``#CALL`` is given; several boundary tensors of one call
        are named ``NAME[i]`` (graph order) unless the tap picks one with
        ``[i]``. Raises :class:`OnnxFileError` for what cannot be answered.
        """
        tap = Tap.parse(tap)
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
            raise OnnxFileError(
                unknown_name(
                    "module", tap.path, self.modules(),
                    hint="modules that compute nothing in ONNX, such as Dropout or Identity in eval mode, leave no nodes",
                )
            )
        if tap.call is not None:
            k = tap.call + len(calls) if tap.call < 0 else tap.call
            if not 0 <= k < len(calls):
                raise OnnxFileError(
                    f"module {tap.path!r} ran {len(calls)} time(s) in this graph; call #{tap.call} is out of range "
                    f"(use #0..#{len(calls) - 1})"
                )
            picked = [(tap.name, calls[k])]
        elif len(calls) == 1:
            picked = [(tap.name, calls[0])]
        else:
            picked = [(tap.name_for_call(c.call), c) for c in calls]
        out: list[tuple[str, str]] = []
        for name, call in picked:
            out.extend(self._name_tensors(tap, name, call))
        return out

    # -- helpers --------------------------------------------------------------
    def _all_calls(self) -> Iterable[_Call]:
        return self._calls

    def _counterpart(self, c: _Call) -> Counterpart:
        if c.note is not None:
            return Counterpart(c.path, c.call, (), c.note)
        return Counterpart(c.path, c.call, self._boundary(c), None)

    def _boundary(self, c: _Call) -> tuple[str, ...]:
        if c.tensors is not None:
            return c.tensors
        inside = set(c.nodes)
        out: list[str] = []
        for i in sorted(inside):
            for t in self._graph.node[i].output:
                if not t:
                    continue
                users = self._uses.get(t, ())
                if t in self._outputs or any(u not in inside for u in users):
                    out.append(t)
        return tuple(out)

    def _entering(self, c: _Call) -> tuple[str, ...]:
        if c.inputs is not None:
            return c.inputs
        inside = set(c.nodes)
        made = {t for i in inside for t in self._graph.node[i].output}
        out: list[str] = []
        for i in sorted(inside):
            for t in self._graph.node[i].input:
                if t and t not in made and t not in self._constants and t not in out:
                    out.append(t)
        return tuple(out)

    def _name_tensors(self, tap: Tap, name: str, c: _Call) -> list[tuple[str, str]]:
        label = f"{c.path}#{c.call}" if self.calls(c.path) > 1 else c.path
        if tap.port == "input":
            if c.input_note is not None:
                raise OnnxFileError(f"the input of module {label!r} is not in this file: {c.input_note}")
            tensors = self._entering(c)
            what = "input"
        else:
            if c.note is not None:
                raise OnnxFileError(f"module {label!r} has no tensor of its own in this file: {c.note}")
            tensors = self._boundary(c)
            what = "output"
        if not tensors:
            raise OnnxFileError(f"module {label!r} has no {what} tensor in this graph")
        if tap.index:
            first = tap.index[0]
            if not isinstance(first, int) or not -len(tensors) <= first < len(tensors) or len(tap.index) > 1:
                raise OnnxFileError(
                    f"tap {tap.canonical!r}: module {label!r} has {len(tensors)} {what} tensor(s) "
                    f"({', '.join(tensors)}); pick one with [0]..[{len(tensors) - 1}]"
                )
            return [(name, tensors[first])]
        if len(tensors) == 1:
            return [(name, tensors[0])]
        return [(f"{name}[{i}]", t) for i, t in enumerate(tensors)]

    def _resolve_root(self, tap: Tap) -> list[tuple[str, str]]:
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


# ---------------------------------------------------------------------------
# reading scopes
# ---------------------------------------------------------------------------
Chain = tuple[tuple[str, "int | None"], ...]  # (module path, explicit call or None), outer first


class _Chains:
    """Per node: the chain of enclosing modules, outer first (root excluded)."""

    @staticmethod
    def read(graph: "onnx.GraphProto") -> tuple[list[Chain | None], str]:
        dynamo = [_dynamo_scopes(n) for n in graph.node]
        if any(s is not None for s in dynamo):
            return [None if s is None else tuple((p, None) for p in s) for s in dynamo], "dynamo"
        parts = [_torchscript_parts(n.name) for n in graph.node]
        named = [p for p in parts if p is not None]
        if named and sum(1 for p in named if p) > 0:
            return _torchscript_chains(parts), "torchscript"
        return [None] * len(graph.node), "none"


def _dynamo_scopes(node) -> list[str] | None:
    for p in node.metadata_props:
        if p.key == NAME_SCOPES_KEY:
            try:
                value = ast.literal_eval(p.value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) and value:
                # root first, FX node name last: modules are the middle
                return [v for v in value[1:-1] if v]
            return None
    return None


def _torchscript_parts(name: str) -> list[str] | None:
    """``/layer1/layer1.0/conv1/Conv`` -> ``['layer1', 'layer1.0', 'conv1']``."""
    if not name.startswith("/") or name.count("/") < 1:
        return None
    parts = name.split("/")[1:]
    if any(not p for p in parts):
        return None
    return parts[:-1]


def _torchscript_chains(parts_per_node: Sequence[list[str] | None]) -> list[Chain | None]:
    levels = [None if p is None else _ts_levels(p) for p in parts_per_node]
    existing = {lv for node_levels in levels if node_levels for lv in node_levels}
    return [None if lv is None else _ts_resolve(lv, existing) for lv in levels]


def _ts_levels(parts: list[str]) -> list[tuple[str, str]]:
    """Components -> ``(container, component)`` per level, raw (suffixes kept).

    ``layer1.0`` right after ``layer1`` replaces it (a container's child is
    written with the container's name), otherwise a component nests.

    Example:
        >>> _ts_levels(["layer1", "layer1.0", "conv1"])
        [('', 'layer1'), ('', 'layer1.0'), ('layer1.0', 'conv1')]
        >>> _ts_levels(["encoder", "layer.0", "attention"])
        [('', 'encoder'), ('encoder', 'layer.0'), ('encoder.layer.0', 'attention')]
    """
    levels: list[tuple[str, str]] = []
    for comp in parts:
        if not levels:
            levels.append(("", comp))
            continue
        container, prev = levels[-1]
        if comp.startswith(prev + "."):
            levels.append((container, comp))
        else:
            levels.append((_join(container, prev), comp))
    return levels


def _ts_resolve(levels: list[tuple[str, str]], existing: set[tuple[str, str]]) -> Chain:
    """Raw levels -> ``((path, call), ...)``; ``relu_1`` is call 1 of ``relu`` when ``relu`` exists.

    Example:
        >>> _ts_resolve([("", "layer2"), ("", "layer2.0"), ("layer2.0", "relu_1")],
        ...             {("layer2.0", "relu"), ("layer2.0", "relu_1")})
        (('layer2', 0), ('layer2.0', 0), ('layer2.0.relu', 1))
    """
    out: list[tuple[str, int | None]] = []
    resolved: dict[str, str] = {"": ""}  # raw path -> path with call suffixes removed
    for container, comp in levels:
        base, call = comp, 0
        m = _CALL_SUFFIX_RE.match(comp)
        if m and (container, m.group("base")) in existing:
            base, call = m.group("base"), int(m.group("call"))
        path = _join(resolved.get(container, container), base)
        resolved[_join(container, comp)] = path
        out.append((path, call))
    return tuple(out)


def _join(container: str, comp: str) -> str:
    return f"{container}.{comp}" if container else comp


# ---------------------------------------------------------------------------
# calls
# ---------------------------------------------------------------------------
class _CallBuilder:
    """Group nodes into module calls: explicit TorchScript suffixes, else runs."""

    def __init__(self, graph: "onnx.GraphProto", chains: Sequence[Chain | None]) -> None:
        self.graph = graph
        self.chains = chains

    def build(self) -> list[_Call]:
        runs = self._runs()
        explicit: dict[str, set] = {}
        for path, call in runs:
            explicit.setdefault(path, set()).add(call)
        calls: list[_Call] = []
        for path, keys in explicit.items():
            calls.extend(self._calls_of(path, sorted(keys, key=lambda k: -1 if k is None else k), runs))
        return calls

    def _runs(self) -> dict[tuple[str, "int | None"], list[list[int]]]:
        """Maximal runs per (path, explicit call); neutral nodes do not break runs."""
        runs: dict[tuple[str, int | None], list[list[int]]] = {}
        active: set = set()
        for i, (node, chain) in enumerate(zip(self.graph.node, self.chains)):
            if chain is None or (node.op_type in _NO_SCOPE_OPS and not node.input):
                continue
            keys = set(chain)
            for key in chain:
                if key in active:
                    runs[key][-1].append(i)
                else:
                    runs.setdefault(key, []).append([i])
            active = keys
        return runs

    @staticmethod
    def _calls_of(path: str, keys: list, runs: dict) -> list[_Call]:
        if len(keys) > 1:  # TorchScript suffixes number the calls: one call per suffix
            return [_Call(path, k, sorted(i for r in runs[(path, key)] for i in r)) for k, key in enumerate(keys)]
        return [_Call(path, k, run) for k, run in enumerate(runs[(path, keys[0])])]


# ---------------------------------------------------------------------------
# folds and fusions
# ---------------------------------------------------------------------------
def _innermost(calls: list[_Call], node_index: int) -> _Call | None:
    """The deepest call whose nodes include ``node_index``."""
    best = None
    for c in calls:
        if (best is None or len(c.path) > len(best.path)) and c.first <= node_index <= c.last and node_index in c.node_set:
            best = c
    return best


def _rules(node) -> list[str]:
    for p in node.metadata_props:
        if p.key == RULE_KEY:
            return [r.strip() for r in p.value.split(",") if r.strip()]
    return []


def _next_call(calls: list[_Call], path: str) -> int:
    return sum(1 for c in calls if c.path == path)


def _fold_dynamo(graph: "onnx.GraphProto", calls: list[_Call]) -> None:
    """Absorbed Convs (named by their weight) and other fusing rewrites."""
    added: list[_Call] = []
    for i, node in enumerate(graph.node):
        rules = _rules(node)
        if not rules:
            continue
        owner = _innermost(calls, i)
        if owner is None:
            continue
        if _BN_FOLD_RULE in rules and node.op_type == "Conv":
            conv = _param_module(node.input[1] if len(node.input) > 1 else "")
            if conv and conv != owner.path:
                added.append(_Call(
                    conv, _next_call(calls + added, conv), [i],
                    note=f"folded into node {node.name} with {owner.path} (BatchNorm fused into the Conv by the exporter); "
                         f"the Conv's own output is not in the graph",
                ))
            owner.input_note = (
                f"its input, the output of {conv or 'the preceding Conv'}, was folded into node {node.name}"
            )
            continue
        fusing = [r for r in rules if r.startswith("Fuse") and r != _BN_FOLD_RULE]
        if fusing and owner.note is None:
            owner.note = (
                f"node {node.name} was rewritten by the exporter's optimizer (rule {fusing[0]}), "
                "which can merge several calls or modules into one node; its value is not trusted as this call's output"
            )
    calls.extend(added)


def _fold_torchscript(graph: "onnx.GraphProto", calls: list[_Call]) -> None:
    """A Conv with an anonymous constant weight had a BatchNorm folded in (see module doc)."""
    constants = _constant_names(graph)
    known = {c.path for c in calls}
    added: list[_Call] = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        owner = _innermost(calls, i)
        if owner is None or len(owner.nodes) != 1:
            continue  # a Conv module is exactly its Conv node
        weight = node.input[1]
        if weight == owner.path + ".weight" or weight not in constants:
            continue
        bn = _guess_batchnorm(owner.path)
        if bn is not None and bn in known:
            continue  # the BatchNorm has nodes of its own: nothing was folded into this Conv
        if bn is None:
            owner.note = (
                f"a BatchNorm was folded into node {node.name} by the exporter, so that node's output is the "
                "BatchNorm's value, not this Conv's"
            )
            continue
        owner.note = (
            f"folded into node {node.name} with {bn} (BatchNorm fused into the Conv by the exporter); "
            f"that node's output is {bn}'s value, not this Conv's"
        )
        added.append(_Call(
            bn, _next_call(calls + added, bn), [i],
            input_note=f"its input, the output of {owner.path}, was folded into node {node.name}",
        ))
    calls.extend(added)


def _param_module(name: str) -> str | None:
    """``layer1.0.conv1.weight`` -> ``layer1.0.conv1``; anonymous names -> None."""
    if name.endswith(".weight") and not name.startswith(("onnx::", "val_")):
        return name[: -len(".weight")]
    return None


def _guess_batchnorm(conv_path: str) -> str | None:
    """The BatchNorm conventionally right after a Conv: ``conv1 -> bn1``, ``0 -> 1``.

    Example:
        >>> _guess_batchnorm("layer1.0.conv1"), _guess_batchnorm("layer2.0.downsample.0"), _guess_batchnorm("proj")
        ('layer1.0.bn1', 'layer2.0.downsample.1', None)
    """
    head, _, last = conv_path.rpartition(".")
    if last.isdigit():
        guess = str(int(last) + 1)
    elif "conv" in last:
        guess = last.replace("conv", "bn", 1)
    else:
        return None
    return _join(head, guess)


# ---------------------------------------------------------------------------
# graph facts
# ---------------------------------------------------------------------------
def _uses(graph: "onnx.GraphProto") -> dict[str, list[int]]:
    """Tensor name -> indices of the nodes that read it (subgraph reads count for the parent node)."""
    uses: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        names = set(node.input)
        for attr in node.attribute:
            for g in list(attr.g.node and [attr.g] or []) + list(attr.graphs):
                names |= _subgraph_reads(g)
        for t in names:
            if t:
                uses.setdefault(t, []).append(i)
    return uses


def _subgraph_reads(graph: "onnx.GraphProto") -> set[str]:
    reads: set[str] = set()
    for node in graph.node:
        reads |= set(node.input)
        for attr in node.attribute:
            for g in list(attr.g.node and [attr.g] or []) + list(attr.graphs):
                reads |= _subgraph_reads(g)
    return reads


def _constant_names(graph: "onnx.GraphProto") -> set[str]:
    """Initializers and outputs of input-less Constant nodes."""
    names = {i.name for i in graph.initializer} | {i.values.name for i in graph.sparse_initializer}
    for node in graph.node:
        if node.op_type == "Constant" and not node.input:
            names.update(node.output)
    return names


__all__ = ["Counterpart", "ScopeMap", "NAME_SCOPES_KEY"]
