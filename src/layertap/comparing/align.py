"""``lt.compare``'s alignment: pair each PyTorch module call with its ONNX
tensors (the plan), split the plan into ORT runs (batches) and turn aligned
values into :class:`~layertap.comparing.CompareRow` rows.

Used by :mod:`layertap.comparing`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import numpy as np

from ..metrics import Criterion, ErrorStats
from ..runtimes.ort_kernels import as_float32
from ..text import fmt_shape
from .rows import ABSORBED, FAIL, NO_COUNTERPART, PASS, CompareRow, merge_stats, pair_tensors, same_shape, stat_fields
from .torch_side import ArrayStore, ModuleCall

if TYPE_CHECKING:  # pragma: no cover
    from .judging import Judging

T = TypeVar("T")

# How many following sibling module calls a failing call is checked against
# before it is called a fusion (Conv -> BatchNorm -> ReLU is the longest
# chain exporters fold).
_FUSE_WINDOW = 2
_NO_SCOPE_NOTE = "no ONNX node in its scope (a no-op in eval mode, or folded into constants)"


@dataclass
class Item:
    """A module call and the ONNX tensors that answer it (empty when none)."""

    mc: ModuleCall
    tensors: tuple[str, ...] = ()
    status: str | None = None  # preset for calls that will not be compared
    note: str | None = None
    # why the tensors are only candidates (an optimizer rewrite may have moved the value):
    # they count only when they equal the reference's value
    unverified: str | None = None
    ref_tensors: tuple[str, ...] = ()  # an ONNX reference's own tensors for this row
    fused_into: str | None = None  # an absorbed call: the module path whose value holds it
    fused_call: int | None = None  # ... and that module's call, where it is not this call's number
    onnx_call: int | None = None  # the candidate's own number of the call (its graph's order), where it differs
    #: the tensors are the call's flattened outputs in order (a program's taps by index): paired by position
    ordered: bool = False

    @property
    def graph_call(self) -> int:
        """The call's number among the candidate's calls of its module (its scope map's ``call``)."""
        return self.mc.call if self.onnx_call is None else self.onnx_call


def _is_absorption(note: str) -> bool:
    low = note.lower()
    return any(w in low for w in ("fold", "fus", "absorb", "merge"))


def _fused_away(cp: Any) -> bool:
    """Whether a counterpart with no tensor (nor a candidate one) is a call the file fused into another node."""
    return bool(cp.absorbed_by or (cp.note and _is_absorption(cp.note)))


def call_counts(calls: Sequence[ModuleCall]) -> dict[str, int]:
    """How many times PyTorch ran each module path."""
    counts: dict[str, int] = {}
    for mc in calls:
        counts[mc.path] = max(counts.get(mc.path, 0), mc.call + 1)
    return counts


def plan_items(calls: list[ModuleCall], root: ModuleCall, smap: Any, outputs: list[str], include_root: bool,
               shapes: tuple[Callable[[ModuleCall], Any], Callable[[str], Any]] | None = None) -> list[Item]:
    """Pair each PyTorch module call with its ONNX tensors, or say why it has none.

    ``smap`` answers ``counterparts()`` and ``calls(path)`` (a :class:`ScopeView`). ``shapes``: a PyTorch
    call's first output shape and an ONNX tensor's static shape (``None`` when unknown), which put the calls
    of a module run several times in PyTorch's order where the graph lists them otherwise (:func:`in_call_order`).
    """
    torch_calls = call_counts(calls)
    found = _with_real_absorbers(smap.counterparts(), calls, torch_calls)
    counterparts = {(c.path, c.call): c for c in found}
    if shapes is not None:
        counterparts = in_call_order(counterparts, calls, *shapes)
    n_calls: dict[str, int] = {}
    for c in found:
        n_calls[c.path] = n_calls.get(c.path, 0) + 1
    items: list[Item] = []
    for mc in calls:
        item = Item(mc)
        cp = counterparts.get((mc.path, mc.call))
        onnx_calls = n_calls.get(mc.path, 0)
        if cp is None and onnx_calls == 0:
            item.status, item.note = NO_COUNTERPART, _NO_SCOPE_NOTE
        elif onnx_calls != torch_calls[mc.path]:
            item.status = NO_COUNTERPART
            item.note = (
                f"PyTorch ran it {torch_calls[mc.path]} time(s), the ONNX graph shows {onnx_calls} call(s); "
                "calls cannot be aligned"
            )
        elif cp is None:
            item.status = NO_COUNTERPART
        elif not cp.tensors and cp.unverified:
            item.tensors, item.unverified = tuple(cp.unverified), cp.note
        elif not cp.tensors:
            item.status = ABSORBED if _fused_away(cp) else NO_COUNTERPART
            item.note = f"fused into {cp.absorbed_by}; compared there" if cp.absorbed_by else cp.note
            item.fused_into = cp.absorbed_by if item.status == ABSORBED else None
        else:
            item.tensors = tuple(cp.tensors)
        if cp is not None and getattr(cp, "call", mc.call) != mc.call:
            item.onnx_call = cp.call
        if mc.note and not item.status:
            item.status, item.note, item.tensors, item.unverified = NO_COUNTERPART, mc.note, (), None
        items.append(item)
    if include_root:
        items.append(Item(root, tuple(outputs)))
    return items


def absorbed_modules(smap: Any) -> frozenset[str]:
    """The modules whose every call the file holds no value of (fused into a later node: a Conv whose
    BatchNorm was folded in): their rows say so and compare nothing, so a forward keeps only their shapes.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> cp = lambda path, tensors, absorbed_by: NS(path=path, tensors=tensors, unverified=None, absorbed_by=absorbed_by, note=None)
        >>> sorted(absorbed_modules(NS(counterparts=lambda: [cp("conv", [], "bn"), cp("bn", ["t"], None),
        ...                                                  cp("head", [], "norm"), cp("head", ["u"], None)])))
        ['conv']
    """
    paths: dict[str, bool] = {}
    for cp in smap.counterparts():
        gone = not cp.tensors and not cp.unverified and _fused_away(cp)
        paths[cp.path] = paths.get(cp.path, True) and gone
    return frozenset(p for p, gone in paths.items() if gone and p)


def in_call_order(counterparts: dict[tuple[str, int], Any], calls: list[ModuleCall], torch_shape: Callable[[ModuleCall], Any],
                  onnx_shape: Callable[[str], Any]) -> dict[tuple[str, int], Any]:
    """``counterparts`` with the calls of a module PyTorch ran several times put in PyTorch's order, where the
    graph lists them in another: its calls are told apart by their place in the graph, and calls on independent
    inputs (a detection head shared by the levels of a feature pyramid) may come in any order there. Where the
    graph's order pairs a call with a tensor of another shape and exactly one order pairs every call with its
    own shape, that order holds for the module and for the modules inside it (their calls follow its calls).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> mc = lambda k, path, call: ModuleCall(k, path, call, "Conv2d")
        >>> calls = [mc(0, "head", 0), mc(1, "head", 1)]
        >>> cps = {("head", 0): NS(tensors=["a"]), ("head", 1): NS(tensors=["b"])}
        >>> out = in_call_order(cps, calls, lambda m: [(1, 8), (1, 4)][m.call], {"a": (1, 4), "b": (1, 8)}.get)
        >>> out[("head", 0)].tensors, out[("head", 1)].tensors
        (['b'], ['a'])
    """
    by_path: dict[str, list[ModuleCall]] = {}
    for mc in calls:
        by_path.setdefault(mc.path, []).append(mc)
    out = dict(counterparts)
    done: set[str] = set()
    for path in sorted(by_path, key=lambda p: p.count(".")):  # outer modules first: their order holds inside
        runs = sorted(by_path[path], key=lambda m: m.call)
        if len(runs) < 2 or any(path.startswith(d + ".") for d in done):
            continue
        order = _shape_order(runs, [out.get((path, m.call)) for m in runs], torch_shape, onnx_shape)
        if order is None:
            continue
        done.add(path)
        for inner in [p for p in by_path if p == path or p.startswith(path + ".")]:
            if len(by_path[inner]) == len(runs):
                moved = {k: out.get((inner, order[k])) for k in range(len(runs))}
                out.update({(inner, k): cp for k, cp in moved.items() if cp is not None})
    return out


def _shape_order(runs: list[ModuleCall], cps: list[Any], torch_shape: Callable[[ModuleCall], Any],
                 onnx_shape: Callable[[str], Any]) -> list[int] | None:
    """PyTorch call k -> the graph's call holding its shape, where the graph's own order mismatches a shape and
    the shapes, all known and distinct, pair every call one way only; else ``None``."""
    if any(cp is None or not getattr(cp, "tensors", None) for cp in cps):
        return None
    mine = [torch_shape(m) for m in runs]
    theirs = [onnx_shape(cp.tensors[0]) for cp in cps]
    if any(s is None for s in mine + theirs) or len(set(mine)) < len(mine) or set(mine) != set(theirs):
        return None
    if all(tuple(a) == tuple(b) for a, b in zip(mine, theirs)):
        return None
    return [theirs.index(s) for s in mine]


def _with_real_absorbers(counterparts: list[Any], calls: list[ModuleCall], torch_calls: dict[str, int]) -> list[Any]:
    """Counterparts whose absorbing module (a BatchNorm the scopes could only guess by
    name, ``conv1 -> bn1``) is renamed to the module PyTorch really ran right after the
    Conv: DenseNet's ``conv0`` is followed by ``norm0``, not ``bn0``."""
    renames: dict[str, str] = {}
    for cp in counterparts:
        guess = cp.absorbed_by
        if not guess or guess in torch_calls or guess in renames:
            continue
        real = _next_norm(calls, cp.path, torch_calls, {c.path for c in counterparts})
        if real is not None:
            renames[guess] = real
    if not renames:
        return counterparts
    out = []
    for cp in counterparts:
        fields: dict[str, Any] = {}
        if cp.path in renames:
            fields["path"] = renames[cp.path]
        if cp.absorbed_by in renames:
            fields["absorbed_by"] = renames[cp.absorbed_by]
            if cp.note:
                fields["note"] = cp.note.replace(cp.absorbed_by, renames[cp.absorbed_by])
        out.append(dataclasses.replace(cp, **fields) if fields else cp)
    return out


def _next_norm(calls: list[ModuleCall], conv: str, torch_calls: dict[str, int], in_file: set[str]) -> str | None:
    """The normalisation module PyTorch ran right after ``conv`` (the same one every
    time it ran), when the file has no scope of its own for it."""
    found: set[str] = set()
    for k, mc in enumerate(calls):
        if mc.path != conv:
            continue
        nxt = calls[k + 1] if k + 1 < len(calls) else None
        if nxt is None or "Norm" not in nxt.type or nxt.path in in_file:
            return None
        found.add(nxt.path)
    if len(found) != 1:
        return None
    norm = found.pop()
    return norm if torch_calls.get(norm) == torch_calls.get(conv) else None


def pack_batches(items: Sequence[T], cost: Callable[[T], tuple[int, int]], max_tensors: int | None,
                 budget: int) -> list[list[T]]:
    """Contiguous batches of ``items`` by ``cost(item) -> (tensors, bytes)``.

    A batch closes before an item that would take it past ``max_tensors``
    tensors or ``budget`` bytes; an item over the budget on its own gets a
    batch of its own, and items without tensors never start one.

    Example:
        >>> pack_batches([1, 2, 3, 4], lambda i: (1, i), None, 5)
        [[1, 2], [3], [4]]
    """
    out: list[list[T]] = [[]]
    n_tensors = n_bytes = 0
    for item in items:
        k, b = cost(item)
        over = (max_tensors is not None and n_tensors + k > max_tensors) or n_bytes + b > budget
        if k and n_tensors and over:
            out.append([])
            n_tensors = n_bytes = 0
        out[-1].append(item)
        n_tensors += k
        n_bytes += b
    return [b for b in out if b]


def _as_ref_type(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """A float16 candidate judged in the reference's float type (one row at a time, so a
    batch's values are not held twice)."""
    if ref.dtype != got.dtype and np.issubdtype(ref.dtype, np.floating) and np.issubdtype(got.dtype, np.floating):
        if ref.dtype == np.float32 and got.dtype == np.float16:
            return as_float32(got)
        return got.astype(ref.dtype)
    return got


def _ambiguous(shapes: list[tuple]) -> bool:
    """Several outputs of one shape: position and shape cannot tell them apart."""
    return len(set(shapes)) < len(shapes)


#: the note of a call whose candidate tensor differs (see :meth:`RowBuilder.row` and :func:`blame_rewritten`)
REWRITE_DIFFERS = "its candidate tensor differs from the reference's value beyond the tolerance"


def blame_rewritten(rows: Sequence[CompareRow]) -> list[CompareRow]:
    """One sample's rows, where each failing candidate-only call (a rewrite or an inserted
    node at its edge, whose tensor differs) says what the next compared module shows.

    Such a call is a ``FAIL`` on its own numbers: a differing tensor is never passed over,
    since a residual sum after it can dilute the error below the tolerance at the next
    module. When the next module fails too, the divergence starts at this call; when it
    agrees, either the error was diluted or the rewrite moved the value, and the note
    says both.

    Example:
        >>> from .rows import PASS
        >>> rows = [CompareRow("attn", "attn", 0, "Attention", [1], 0.5, 0.5, FAIL, False, note=REWRITE_DIFFERS),
        ...         CompareRow("norm2", "norm2", 0, "LayerNorm", [1], 1.0, 1.0, FAIL, False)]
        >>> [(r.name, r.status, "starts here" in (r.note or "")) for r in blame_rewritten(rows)]
        [('attn', 'FAIL', True), ('norm2', 'FAIL', False)]
    """
    out = list(rows)
    for i, row in enumerate(out):
        if row.ok is not False or REWRITE_DIFFERS not in (row.note or ""):
            continue
        after = next((r for r in out[i + 1:] if r.ok is not None), None)
        if after is None:
            continue
        if after.ok:
            more = (f"the next compared module ({after.name}) agrees: the error shrinks after this call (a residual "
                    "sum or a normalisation can dilute it), or the rewrite moved this value")
        else:
            more = f"so does the next compared module ({after.name}), so the divergence starts here"
        out[i] = dataclasses.replace(row, note=f"{row.note}; {more}")
    return out


NOT_RUN = "empty on both sides: its If branch did not run on this sample"


class RowBuilder:
    """Turns aligned values into rows; detects folds the scopes did not report."""

    def __init__(self, items: list[Item], store: ArrayStore, criterion: Criterion, torch_calls: dict[str, int],
                 *, find_fusions: bool = True, branches: frozenset[str] = frozenset(), judging: Judging | None = None,
                 ideal: ArrayStore | None = None) -> None:
        self.items = items
        self.branches = branches  # candidate tensors carried out of If branches: empty when theirs did not run
        self.store = store
        self.criterion = criterion
        # judged at the candidate's precision: the rule, and the ideal run's values (keyed as ``store``)
        self.judging = judging
        self.ideal = ideal
        self.find_fusions = find_fusions
        self.torch_calls = torch_calls
        self.adopted: dict[int, tuple[ErrorStats, list[str], str]] = {}
        self.position = {item.mc.key: i for i, item in enumerate(items)}
        self.onnx_of: dict[tuple[int, int], str] = {}  # (call key, output index) -> ONNX tensor compared
        # (id(ref), id(candidate)) -> the pair and its statistics: a tensor several calls hand out (a
        # block's output is its last ReLU's and its layer's) is judged once; the pair is held, so ids stay unique
        self._judged: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray | None, ErrorStats]] = {}

    def name(self, mc: ModuleCall) -> str:
        return self.call_name(mc.path, mc.call)

    def call_name(self, path: str, call: int) -> str:
        """``PATH``, or ``PATH#k`` for a module that ran more than once; ``output`` for the root."""
        if path == "":
            return "output"
        return f"{path}#{call}" if self.torch_calls.get(path, 1) > 1 else path

    def row(self, item: Item, values: dict[str, np.ndarray]) -> CompareRow:
        mc = item.mc
        shapes = self.store.shapes(mc.key)
        base: dict[str, Any] = dict(name=self.name(mc), path=mc.path, call=mc.call, type=mc.type, shape=list(shapes[0]) if shapes else None)
        if item.status is not None:
            adopted = self.adopted.get(mc.key)
            if adopted is not None and item.status == NO_COUNTERPART:
                got, onnx_names, donor = adopted
                return CompareRow(**base, **stat_fields(got), status=PASS if got.ok else FAIL,
                                  ok=got.ok, onnx=onnx_names, note=f"compared at {donor}'s ONNX tensor (fused)")
            # a fused call is fused into the same call of its absorber (conv1#k into bn1#k)
            into = self.call_name(item.fused_into, mc.call if item.fused_call is None else item.fused_call) \
                if item.fused_into else None
            return CompareRow(**base, max_abs=None, rel_err=None, status=item.status, ok=None, note=item.note,
                              fused_into=into)
        onnx_arrays = [values[n] for n in item.tensors]
        ref = self.store.get(mc.key)
        if self.branches and self.branches.intersection(item.tensors) and all(np.size(a) == 0 for a in [*ref, *onnx_arrays]):
            return CompareRow(**base, max_abs=None, rel_err=None, status=NO_COUNTERPART, ok=None,
                              onnx=list(item.tensors), note=NOT_RUN)
        if self.judging is not None:
            fmt = self.judging.row_format(item.tensors)
            base["precision"] = fmt.family if fmt is not None else None
        stats, names, why = self._compare(ref, onnx_arrays, item.tensors, mc, self.ideal_of(mc.key, ref),
                                          ordered=item.ordered)
        if item.unverified is not None:
            return self._checked(item, base, stats, names)
        if stats is None:
            # Same inputs, other output shapes: the file does not compute the model's result.
            # For an inner module the scope mapping may be at fault, so that is only "no counterpart".
            status, ok = (FAIL, False) if mc.path == "" else (NO_COUNTERPART, None)
            return CompareRow(**base, max_abs=None, rel_err=None, status=status, ok=ok, onnx=list(item.tensors), note=why)
        if not stats.ok and self.find_fusions:
            fused = self._fused_into(item, onnx_arrays)
            if fused is not None:
                donee, fstats, fnames = fused
                self.adopted[donee.mc.key] = (fstats, fnames, base["name"])
                return CompareRow(**base, **stat_fields(stats), status=ABSORBED, ok=None, onnx=names,
                                  note=f"ONNX tensor holds {self.name(donee.mc)}'s value (fused)",
                                  fused_into=self.name(donee.mc))
        # a note the candidate gives a compared call (a graph break in its module) stays beside the numbers
        note = "; ".join(n for n in (why, item.note) if n) or None
        return CompareRow(**base, **stat_fields(stats), status=PASS if stats.ok else FAIL,
                          ok=stats.ok, onnx=names, note=note)

    def _checked(self, item: Item, base: dict[str, Any], stats: ErrorStats | None, names: list[str]) -> CompareRow:
        """A candidate-only call's tensor (a rewrite or an inserted node at its edge): compared like
        any other when it has the reference's shape; a differing one is a FAIL, never passed over."""
        if stats is None:
            return CompareRow(**base, max_abs=None, rel_err=None, status=NO_COUNTERPART, ok=None,
                              note=f"{item.unverified}; its candidate tensor does not match the reference's shape either")
        if stats.ok:
            return CompareRow(**base, **stat_fields(stats), status=PASS, ok=True, onnx=names,
                              note="a rewrite or a node inserted without scope at its edge makes its tensor only a "
                                   "candidate, and it equals the reference's value (checked numerically)")
        # blame_rewritten() adds what the next compared module shows
        return CompareRow(**base, **stat_fields(stats), status=FAIL, ok=False, onnx=names,
                          note=f"{REWRITE_DIFFERS}, and {item.unverified}")

    def ideal_of(self, key: int, ref: list[np.ndarray]) -> list[np.ndarray] | None:
        """The ideal run's values of call ``key``, when it has them in the reference's shapes."""
        if self.ideal is None or not self.ideal.has(key):
            return None
        ideal = self.ideal.get(key)
        if len(ideal) != len(ref) or any(np.shape(i) != np.shape(r) for i, r in zip(ideal, ref)):
            return None
        return ideal

    def _compare(
        self, ref: list[np.ndarray], got: list[np.ndarray], names: Sequence[str], mc: ModuleCall | None = None,
        ideal: list[np.ndarray] | None = None, *, ordered: bool = False,
    ) -> tuple[ErrorStats | None, list[str], str | None]:
        ref_shapes, got_shapes = [tuple(r.shape) for r in ref], [tuple(g.shape) for g in got]
        # graph outputs come in the model's flattened output order, as do a program's taps of one call
        # (``ordered``); an inner call's tensors in a graph do not
        if mc is not None and mc.path and not ordered and _ambiguous(ref_shapes):
            pairs = self._pairs_by_flow(mc, ref_shapes, got_shapes, names)
            if not pairs:
                return None, [], (
                    "its outputs have equal shapes and the graph does not tell which ONNX tensor holds which "
                    "element (no child module's tensor is among them)"
                )
        else:
            pairs = pair_tensors(ref_shapes, got_shapes)
        if not pairs:
            return None, [], (
                f"shapes differ: ONNX {', '.join(fmt_shape(g.shape) for g in got)} vs "
                f"PyTorch {', '.join(fmt_shape(r.shape) for r in ref) or 'nothing'}"
            )
        if mc is not None:
            self.onnx_of.update(((mc.key, i), names[j]) for i, j in pairs)
        stats = []
        for i, j in pairs:
            r, g = ref[i], got[j]
            if r.shape != g.shape:
                g = g.reshape(r.shape)
            stats.append(self._judge(r, g, ideal[i] if ideal is not None else None, names[j]))
        why = None
        if len(pairs) < len(got):
            why = f"compared {len(pairs)} of {len(got)} ONNX tensors (others have no PyTorch tensor of that shape)"
        return merge_stats(stats), [names[j] for _, j in pairs], why

    def _judge(self, ref: np.ndarray, got: np.ndarray, ideal: np.ndarray | None = None, name: str | None = None) -> ErrorStats:
        key = (id(ref), id(got), id(ideal))
        hit = self._judged.get(key)
        if hit is None:
            hit = self._judged[key] = (ref, got, ideal, self.judge_pair(ref, got, ideal, name))
        return hit[3]

    def judge_pair(self, ref: np.ndarray, got: np.ndarray, ideal: np.ndarray | None = None, name: str | None = None) -> ErrorStats:
        """One reference tensor against the candidate's tensor ``name`` (and the ideal run's value, judged at
        the candidate's precision), every time it is asked (:meth:`_judge` asks once per pair)."""
        got32 = _as_ref_type(ref, got)
        if self.judging is None:
            return self.criterion.judge(ref, got32)
        fmt = self.judging.formats.of(name) if name is not None else None
        return self.judging.judge(self.criterion, ref, got32, ideal, fmt)

    def forget_values(self) -> None:
        """Let go of the arrays judged so far (after each batch: its values go)."""
        self._judged.clear()

    def _pairs_by_flow(
        self, mc: ModuleCall, ref_shapes: list[tuple], got_shapes: list[tuple], names: Sequence[str]
    ) -> list[tuple[int, int]]:
        """Pair equal-shaped outputs by data flow: element i is the tensor object some child call
        returned, and that child's compared ONNX tensor is one of ``names``. Whatever stays
        unresolved pairs only when one PyTorch and one ONNX tensor of its shape are left."""
        pairs: dict[int, int] = {}
        for i, src in enumerate(mc.sources or []):
            name = self._flow_name(src)
            if name in names and names.index(name) not in pairs.values():
                pairs[i] = names.index(name)
        left_ref = [i for i in range(len(ref_shapes)) if i not in pairs]
        left_got = [j for j in range(len(got_shapes)) if j not in pairs.values()]
        for i in left_ref:
            same_ref = [k for k in left_ref if ref_shapes[k] == ref_shapes[i]]
            same_got = [j for j in left_got if same_shape(ref_shapes[i], got_shapes[j])]
            if len(same_ref) == 1 and len(same_got) == 1:
                pairs[i] = same_got[0]
        return sorted(pairs.items(), key=lambda p: p[1])

    def _flow_name(self, src: tuple[int, int] | None) -> str | None:
        """The ONNX tensor compared for the call output ``src``, following pass-through calls down."""
        seen = 0
        while src is not None and seen < 64:
            name = self.onnx_of.get(src)
            if name is not None:
                return name
            pos = self.position.get(src[0])
            if pos is None:
                return None
            sources = self.items[pos].mc.sources or []
            src = sources[src[1]] if src[1] < len(sources) else None
            seen += 1
        return None

    def _fused_into(self, item: Item, onnx_arrays: list[np.ndarray]) -> tuple[Item, ErrorStats, list[str]] | None:
        """A later sibling call whose PyTorch value the ONNX tensor holds."""
        mc = item.mc
        if mc.path == "":
            return None
        parent = mc.path.rpartition(".")[0]
        seen = 0
        for later in self.items[self.position[mc.key] + 1:]:
            lp = later.mc.path
            if lp == "" or (parent and not lp.startswith(parent + ".")):
                break  # left the parent: no sibling follows
            if lp.rpartition(".")[0] != parent:
                continue  # a deeper call inside a sibling
            seen += 1
            if seen > _FUSE_WINDOW:
                break
            ref = self.store.get(later.mc.key)
            if not ref:
                continue
            stats, names, _ = self._compare(ref, onnx_arrays, item.tensors, ideal=self.ideal_of(later.mc.key, ref))
            if stats is not None and stats.ok:
                return later, stats, names
        return None
