"""Module calls: which nodes belong to which call of which module.

The TorchScript exporter numbers calls in node names (``relu_1``). The dynamo
exporter does not: there a call is a maximal run of consecutive nodes (graph
order) inside the module's scope, and two calls with no node of another scope
between them (``act(act(x))``, a shared block applied in a loop) read as one.
:func:`refuse_merged_calls` finds those and refuses them rather than answer
with the wrong call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ._reading import Chain

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
    rewritten: bool = False          # note set only because an optimizer rewrite may have moved the value

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


def build_calls(graph: "onnx.GraphProto", chains: Sequence[Chain | None]) -> list[Call]:
    """Group nodes into module calls: explicit TorchScript suffixes, else runs.

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
        ...                        helper.make_node("Relu", ["b"], ["c"])], "g", [], [])
        >>> [(c.path, c.call, c.nodes) for c in build_calls(g, [(("act", None),), None, (("act", None),)])]
        [('act', 0, [0, 2])]
        >>> [(c.path, c.call, c.nodes) for c in build_calls(g, [(("act", None),), (("neg", None),), (("act", None),)])]
        [('act', 0, [0]), ('act', 1, [2]), ('neg', 0, [1])]
    """
    runs = _runs(graph, chains)
    explicit: dict[str, set] = {}
    for path, call in runs:
        explicit.setdefault(path, set()).add(call)
    calls: list[Call] = []
    for path, keys in explicit.items():
        calls.extend(_calls_of(path, sorted(keys, key=lambda k: -1 if k is None else k), runs))
    return calls


def _runs(graph: "onnx.GraphProto", chains: Sequence[Chain | None]) -> dict[tuple[str, "int | None"], list[list[int]]]:
    """Maximal runs per (path, explicit call); nodes without scope do not break runs."""
    runs: dict[tuple[str, int | None], list[list[int]]] = {}
    active: set = set()
    for i, (node, chain) in enumerate(zip(graph.node, chains)):
        if chain is None or (node.op_type in _NO_SCOPE_OPS and not node.input):
            continue
        for key in chain:
            if key in active:
                runs[key][-1].append(i)
            else:
                runs.setdefault(key, []).append([i])
        active = set(chain)
    return runs


def _calls_of(path: str, keys: list, runs: dict) -> list[Call]:
    if len(keys) > 1:  # TorchScript suffixes number the calls: one call per suffix
        return [Call(path, k, sorted(i for r in runs[(path, key)] for i in r)) for k, key in enumerate(keys)]
    return [Call(path, k, run) for k, run in enumerate(runs[(path, keys[0])])]


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
