"""Module calls: which nodes belong to which call of which module.

The TorchScript exporter numbers calls in node names (``relu_1``). The dynamo
exporter does not: there calls are told apart by data flow (:func:`build_calls`),
and two calls with nothing of another module between them (``act(act(x))``,
a shared block applied in a loop) read as one.
:func:`refuse_merged_calls` finds those and refuses them rather than answer
with the wrong call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .graph_facts import GraphFacts, connected_groups
from .node_scopes import Chain

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_NO_SCOPE_OPS = {"Constant"}  # exporter-made constants: not part of any call


@dataclass
class Call:
    """Nodes of one module call, plus what the later analyses learned about it."""

    path: str
    call: int
    nodes: list[int] = field(default_factory=list)
    note: str | None = None          # output not trustworthy (absorbed, merged, rewritten)
    input_note: str | None = None    # input not trustworthy or not in the graph
    tensors: tuple[str, ...] | None = None  # set for absorbed/absorbing calls
    inputs: tuple[str, ...] | None = None
    absorbed_by: str | None = None   # the module whose node holds this (folded) module's value
    rewritten: bool = False          # note set only because a rewrite or an inserted node may have moved the value

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

    def has(self, index: int) -> bool:
        return self.first <= index <= self.last and index in self.node_set


def build_calls(graph: "onnx.GraphProto", chains: Sequence[Chain | None], facts: GraphFacts | None = None) -> list[Call]:
    """Group nodes into module calls: TorchScript suffixes where given, else data flow.

    Under dynamo a module's nodes split into groups connected by tensors one
    node makes and another reads; two groups are one call when the later does
    not depend on the earlier and no node of another module lies between
    them (a module computing two independent branches), else separate calls.
    Graph order alone cannot tell calls apart: quantizers interleave the
    nodes of neighbouring calls.

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
        ...                        helper.make_node("Relu", ["b"], ["c"])], "g", [], [])
        >>> [(c.path, c.call, c.nodes) for c in build_calls(g, [(("act", None),), None, (("act", None),)])]
        [('act', 0, [0]), ('act', 1, [2])]
        >>> [(c.path, c.call, c.nodes) for c in build_calls(g, [(("act", None),), (("neg", None),), (("act", None),)])]
        [('act', 0, [0]), ('act', 1, [2]), ('neg', 0, [1])]
    """
    facts = facts or GraphFacts(graph)
    members: dict[str, dict[int | None, list[int]]] = {}
    for i, (node, chain) in enumerate(zip(graph.node, chains)):
        if chain is None or (node.op_type in _NO_SCOPE_OPS and not node.input):
            continue
        for path, key in chain:
            members.setdefault(path, {}).setdefault(key, []).append(i)
    calls: list[Call] = []
    for path, keyed in members.items():
        if any(k is not None for k in keyed):
            calls.extend(_numbered_calls(path, keyed))
        else:
            groups = _split_by_flow(graph, keyed[None], facts, chains, path)
            calls.extend(Call(path, k, nodes) for k, nodes in enumerate(groups))
    return calls


def _numbered_calls(path: str, keyed: dict) -> list[Call]:
    """TorchScript: one call per suffix; a call whose nodes all vanished (fused away) is kept, refused."""
    out = [Call(path, k, sorted(nodes)) for k, nodes in sorted(keyed.items())]
    have = {c.call for c in out}
    for k in range(max(have)):
        if k not in have:
            why = f"no node of call #{k} of {path!r} is left in this file (a tool that rewrote it removed or fused them)"
            out.append(Call(path, k, [], note=why, input_note=why))
    return sorted(out, key=lambda c: c.call)


def _split_by_flow(graph: "onnx.GraphProto", nodes: list[int], facts: GraphFacts,
                   chains: Sequence[Chain | None], path: str) -> list[list[int]]:
    live = [i for i in nodes if i not in facts.weight_nodes] or list(nodes)
    groups = connected_groups(graph, live, facts)
    merged: list[list[int]] = [groups[0]]
    for g in groups[1:]:
        last = merged[-1]
        if _contiguous(graph, chains, path, max(last), g[0], facts) and not _reaches(graph, last, g, facts):
            last.extend(g)
        else:
            merged.append(g)
    placed = {i: k for k, g in enumerate(merged) for i in g}
    for i in nodes:  # weight-only nodes go with the call that reads them first (else the one before them)
        if i in placed:
            continue
        readers = sorted(u for t in graph.node[i].output for u in facts.uses.get(t, ()) if u in placed)
        before = [k for k, g in enumerate(merged) if g[0] < i]
        k = placed[readers[0]] if readers else (before[-1] if before else 0)
        merged[k].append(i)
    return [sorted(g) for g in merged]


def _contiguous(graph: "onnx.GraphProto", chains: Sequence[Chain | None], path: str, end: int, start: int,
                facts: GraphFacts) -> bool:
    """No node of another module between ``end`` and ``start`` (weights and constants do not count)."""
    for j in range(end + 1, start):
        chain = chains[j]
        if j in facts.weight_nodes or chain is None or (graph.node[j].op_type in _NO_SCOPE_OPS and not graph.node[j].input):
            continue
        if all(p != path for p, _ in chain):
            return False
    return True


def _reaches(graph: "onnx.GraphProto", src: list[int], dst: list[int], facts: GraphFacts) -> bool:
    """Whether a node of ``dst`` depends on a node of ``src`` (graph order bounds the search)."""
    target, limit = set(dst), max(dst)
    seen: set[int] = set()
    todo = list(src)
    while todo:
        i = todo.pop()
        for t in graph.node[i].output:
            for u in facts.uses.get(t, ()):
                if u in target:
                    return True
                if u <= limit and u not in seen:
                    seen.add(u)
                    todo.append(u)
    return False


def innermost(calls: Sequence[Call], node_index: int) -> Call | None:
    """The deepest call whose nodes include ``node_index``."""
    best = None
    for c in calls:
        if (best is None or len(c.path) > len(best.path)) and c.has(node_index):
            best = c
    return best


def refuse_merged_calls(
    graph: "onnx.GraphProto", calls: Sequence[Call], node_paths: Sequence[str | None], skip: frozenset[int]
) -> None:
    """Refuse calls that are really several back-to-back calls, and every later call of that module.

    A call whose nodes repeat one pattern k >= 2 times (op type and innermost
    module of each node; ``skip`` = weight-only nodes, which the exporter may
    compute once for all repetitions) is read as k merged calls. Its output
    is the last repetition's, and the calls after it are numbered k-1 too low,
    so all of them are refused. Earlier calls keep their answers. A module
    that loops over one child inside a single call looks the same and is
    refused too (two calls of it would read exactly alike).

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
        ...                        helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Relu", ["c"], ["d"])], "g", [], [])
        >>> calls = [Call("act", 0, [0, 1]), Call("act", 1, [3]), Call("neg", 0, [2])]
        >>> refuse_merged_calls(g, calls, ["act", "act", "neg", "act"], frozenset())
        >>> [(c.path, c.call, c.note is not None) for c in calls]
        [('act', 0, True), ('act', 1, True), ('neg', 0, False)]
    """
    by_path: dict[str, list[Call]] = {}
    for c in calls:
        by_path.setdefault(c.path, []).append(c)
    for path, cs in by_path.items():
        cs.sort(key=lambda c: c.call)
        for c in cs:
            signature = [(node_paths[i], graph.node[i].op_type) for i in c.nodes if i not in skip]
            times = repeats(signature)
            if times < 2:
                continue
            why = (
                f"call #{c.call} of {path!r} repeats one pattern of nodes {times} times: back-to-back calls "
                "(e.g. act(act(x)) or a loop over one module) read as one call in this graph, so it and the "
                "calls numbered after it cannot be matched to PyTorch's calls"
            )
            for later in cs[cs.index(c):]:
                later.note = later.note or why
                later.input_note = later.input_note or why
            break


def repeats(seq: Sequence[object]) -> int:
    """How many times ``seq`` is one shorter pattern repeated (1 when it is not).

    Example:
        >>> repeats("abab"), repeats("aaa"), repeats("aba"), repeats("")
        (2, 3, 1, 1)
    """
    n = len(seq)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and all(seq[i] == seq[i % period] for i in range(period, n)):
            return n // period
    return 1
