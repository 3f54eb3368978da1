"""Two files of one model that share no tensor names (another tool built one of them: spox,
paddle2onnx, a hand-written graph): their tensors paired by order, shape, op type and the values
of the first sample.

Each file's activations are read once on the first sample (a strided subsample of each, so the
memory stays small) and scored pair by pair: the same shape is required; values within
:data:`CLOSE` of each other (relative L2 error) and the same op type both count. A monotone
alignment (the graphs' order kept, each tensor used once) takes the pairs of the highest total
score, so a Conv that one exporter folded a BatchNorm into pairs with the other file's
BatchNorm (same values), not with its Conv (same op, other values). A pair only by op type and
shape (values apart) is kept: it is where a conversion diverges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..onnxfile.scopemap import GraphFacts
from .rows import IN_BRANCH, NO_COUNTERPART, same_shape

#: relative L2 error under which two tensors count as the same value (float16 and int8 conversions
#: stay well below it; a ReLU against its input, or a Conv against Conv + BatchNorm, well above)
CLOSE = 0.1
_KEEP = 4096  # elements of each tensor kept to score pairs
_SKIPPED_OPS = {"Identity", "Cast", "QuantizeLinear", "Constant", "Shape", "Size"}


@dataclass(frozen=True)
class Print:
    """What pairing needs of one tensor: its op type, shape and a strided subsample of its values."""

    op: str
    shape: tuple[int, ...]
    values: np.ndarray

    @classmethod
    def of(cls, op: str, value: np.ndarray) -> "Print":
        """The print of one computed value.

        Example:
            >>> Print.of("Relu", np.arange(10, dtype=np.float32)).values.size
            10
        """
        flat = np.asarray(value).reshape(-1)
        if flat.size > _KEEP:
            flat = flat[np.linspace(0, flat.size - 1, _KEEP).astype(np.int64)]
        return cls(op, tuple(np.shape(value)), flat.astype(np.float64))


@dataclass(frozen=True)
class Pair:
    """A reference tensor, the candidate tensor paired with it, and whether their values agree."""

    ref: str
    cand: str
    close: bool


def distance(a: Print, b: Print) -> float:
    """Relative L2 error of ``b`` against ``a`` on the kept elements (``inf`` when shapes differ or
    a value is not finite).

    Example:
        >>> x = np.ones(4, np.float32)
        >>> distance(Print.of("A", x), Print.of("B", x * 1.01)) < 0.02, distance(Print.of("A", x), Print.of("B", x[:2]))
        (True, inf)
    """
    if not same_shape(a.shape, b.shape) or a.values.size != b.values.size:
        return float("inf")
    with np.errstate(all="ignore"):
        err = float(np.linalg.norm(a.values - b.values)) / max(float(np.linalg.norm(a.values)), 1e-12)
    return err if np.isfinite(err) else float("inf")


def score(a: Print, b: Print) -> float:
    """How well ``b`` answers ``a``: 0 apart (other shape, or other op and other values), 1 for the
    same op, 2 to 3 for close values (3 when equal), the two added.

    Example:
        >>> x = np.ones(4, np.float32)
        >>> score(Print.of("Relu", x), Print.of("Relu", x)), score(Print.of("Add", x), Print.of("Conv", x))
        (4.0, 3.0)
        >>> round(score(Print.of("Add", x), Print.of("Conv", x * 1.05)), 3), score(Print.of("Relu", x), Print.of("Sigmoid", -x))
        (2.5, 0.0)
    """
    if not same_shape(a.shape, b.shape):
        return 0.0
    err = distance(a, b)
    return (a.op == b.op) + (3 - err / CLOSE if err <= CLOSE else 0.0)


def align(ref: Sequence[Print], cand: Sequence[Print]) -> list[tuple[int, int]]:
    """The monotone one-to-one pairing of the highest total :func:`score` (graph order kept on both sides).

    Example:
        >>> x, y = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
        >>> ref = [Print.of("Conv", y), Print.of("Add", x), Print.of("Relu", x)]  # a BatchNorm as Add
        >>> align(ref, [Print.of("Conv", x), Print.of("Relu", x)])               # folded into the Conv
        [(1, 0), (2, 1)]
    """
    n, m = len(ref), len(cand)
    table = np.zeros((n + 1, m + 1))
    for i, a in enumerate(ref, 1):
        gain = np.array([score(a, b) for b in cand])
        row = np.maximum(table[i - 1, 1:], table[i - 1, :-1] + np.where(gain > 0, gain, -1))
        table[i, 1:] = np.maximum.accumulate(np.maximum(row, 0))
    return _trace(table)


def _trace(table: np.ndarray) -> list[tuple[int, int]]:
    """The pairs behind the best total of :func:`align`'s table."""
    i, j = table.shape[0] - 1, table.shape[1] - 1
    pairs = []
    while i > 0 and j > 0:
        if table[i, j] == table[i - 1, j]:
            i -= 1
        elif table[i, j] == table[i, j - 1]:
            j -= 1
        else:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return pairs[::-1]


def activations(graph: Any, skip: set[str]) -> list[tuple[str, str]]:
    """(tensor, op type) of the graph's computed tensors in graph order, those in ``skip`` (weights)
    and the outputs of copies and casts left out.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Identity", ["r"], ["y"])], "g", [], [])
        >>> activations(g, set())
        [('r', 'Relu')]
    """
    return [(t, n.op_type) for n in graph.node if n.op_type not in _SKIPPED_OPS
            for t in n.output if t and t not in skip]


def read_prints(tensors: Sequence[tuple[str, str]], run: Callable[[list[str]], dict[str, np.ndarray]],
                chunks: Callable[[list[str]], list[list[str]]]) -> dict[str, Print]:
    """The prints of ``tensors`` (name, op), run chunk by chunk so only one chunk's values are held.

    Example:
        >>> values = {"a": np.ones(3), "b": np.zeros(2)}
        >>> p = read_prints([("a", "Relu"), ("b", "Add")], lambda names: {n: values[n] for n in names},
        ...                 lambda names: [[n] for n in names])
        >>> p["b"].shape, p["a"].op
        ((2,), 'Relu')
    """
    ops = dict(tensors)
    out: dict[str, Print] = {}
    for chunk in chunks(list(ops)):
        for name, value in run(chunk).items():
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                out[name] = Print.of(ops[name], value)
    return out


def pair_prints(ref: dict[str, Print], cand: dict[str, Print]) -> list[Pair]:
    """The reference's tensors paired with the candidate's (:func:`align`), in the reference's order.

    Example:
        >>> x = np.ones(4, np.float32)
        >>> pair_prints({"r": Print.of("Relu", x)}, {"/relu": Print.of("Relu", x), "/fc": Print.of("Gemm", x[:2])})
        [Pair(ref='r', cand='/relu', close=True)]
    """
    refs, cands = list(ref), list(cand)
    pairs = align([ref[t] for t in refs], [cand[t] for t in cands])
    return [Pair(refs[i], cands[j], distance(ref[refs[i]], cand[cands[j]]) <= CLOSE) for i, j in pairs]


@dataclass(frozen=True)
class Pairing:
    """What :func:`pair_unnamed` did: rows it paired, rows it tried, pairs whose values agree."""

    paired: int
    tried: int
    pairs: int
    close: int

    def note(self) -> str:
        """One line for the report's notes.

        Example:
            >>> Pairing(5, 7, 6, 4).note().split("; ")[1]
            '4 tensor pairs agree within 0.1 there, 2 only by op type and shape'
        """
        apart = self.pairs - self.close
        return (f"the files share no tensor names: {self.paired} of {self.tried} rows paired by graph order, shape, op "
                f"type and the first sample's values (one more run of each file); {self.close} tensor pairs agree "
                f"within {CLOSE:g} there" + (f", {apart} only by op type and shape" if apart else ""))


def unnamed_rows(items: Sequence[Any], graph_outputs: set[str]) -> list[Any]:
    """The rows to pair by structure: none when some inner row found its tensor by name or module
    scope (variants of one file), else every inner row without a counterpart.

    Example:
        >>> from layertap.comparing.align import Item
        >>> from layertap.comparing.torch_side import ModuleCall
        >>> rows = [Item(ModuleCall(0, "r", 0, "Relu"), status="no counterpart", ref_tensors=("r",)),
        ...         Item(ModuleCall(1, "fc", 0, "Gemm"), ("y",), ref_tensors=("y",))]
        >>> [it.mc.path for it in unnamed_rows(rows, {"y"})]
        ['r']
    """
    inner = [it for it in items if it.mc.path]
    # a tensor found by name, also one a runtime keeps inside an If branch, makes the files variants of one
    if any((it.tensors and not set(it.ref_tensors) <= graph_outputs) or it.note == IN_BRANCH for it in inner):
        return []
    return [it for it in inner if it.status == NO_COUNTERPART and it.ref_tensors]


def pair_unnamed(items: Sequence[Any], ref: Any, cand: Any, feeds: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
                 chunks: Callable[[Any, list[str]], list[list[str]]]) -> Pairing | None:
    """Pair the rows of two files that share no tensor names (:func:`unnamed_rows`) in place.

    Args:
        items: the rows the names and scopes gave (``ref_tensors`` set on every row).
        ref, cand: the two :class:`~layertap.comparing.onnx_side.OrtSide` s.
        feeds: the first sample's feed of each side.
        chunks: ``(side, names) -> lists of names``, each read by one run.

    Returns:
        What was paired, or ``None`` when the rows were not the files' to pair this way (or none
        agrees in value with the candidate: then no row is paired).
    """
    rows = unnamed_rows(items, {o.name for o in ref.proto.graph.output})
    if not rows:
        return None
    wanted = {t for it in rows for t in it.ref_tensors}
    used = {t for it in items if it.mc.path for t in it.tensors}  # the model's outputs may pair again inside
    found = {p.ref: p for p in pair_prints(_side_prints(ref, feeds[0], wanted.__contains__, chunks),
                                           _side_prints(cand, feeds[1], lambda t: t not in used, chunks))}
    if not any(p.close for p in found.values()):
        return None
    for it in rows:
        if all(t in found for t in it.ref_tensors):
            it.tensors, it.status, it.note = tuple(found[t].cand for t in it.ref_tensors), None, None
        else:
            it.note = "no tensor of the candidate pairs with it by graph order, shape, op type or value (folded into a neighbour there?)"
    paired = sum(it.status is None for it in rows)
    return Pairing(paired, len(rows), len(found), sum(p.close for p in found.values()))


def _side_prints(side: Any, feed: dict[str, np.ndarray], keep: Callable[[str], bool],
                 chunks: Callable[[Any, list[str]], list[list[str]]]) -> dict[str, Print]:
    """The prints of one side's activations that ``keep`` keeps and its runtime can hand out."""
    graph = side.proto.graph
    exposable = side.runner.exposable()
    tensors = [(t, op) for t, op in activations(graph, GraphFacts(graph).weights)
               if keep(t) and (exposable is None or t in exposable)]
    runs = side.runner.runs  # the runs compare counts are the rows' own (this one is in the pairing's note)
    try:
        return read_prints(tensors, lambda names: side.run(names, feed), lambda names: chunks(side, names))
    finally:
        side.runner.runs = runs
