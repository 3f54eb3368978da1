"""``lt.compare`` with an ONNX reference: two ONNX files (or one file run two ways),
layer by layer. Never imports torch.

Alignment (:func:`align_files`), per row of the reference:

* rows are the reference's module calls (completion order, inner first; a call fused into
  another, a Conv into its BatchNorm, just before it, as PyTorch ran them) when it carries
  module scopes, else every activation tensor it computes;
* a reference tensor whose name the candidate also computes is that tensor (converters keep
  names: onnxconverter-common's float16 ``Cast`` nodes, ORT-optimised and onnxslim files);
* else, where both files carry scopes, the candidate's call of the same module path and call
  index (another exporter's file) - unless that call hands out a tensor the reference computes
  under another name (ORT fused the node into a neighbour), which is not this call's value;
* a quantised candidate's tensor is read through its ``QuantizeLinear -> DequantizeLinear``
  pair: the ``DequantizeLinear`` output is the value the rest of the graph sees;
* a file ONNX Runtime saved at ``ORT_ENABLE_ALL`` holds many tensors in its blocked NCHWc
  layout under new names: each is found through the node named after the tensor it replaced,
  and read back as NCHW (:mod:`.nchwc`);
* the model's outputs pair by position (names may differ between exporters).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError, one_line
from ..metrics import Criterion
from ..onnxfile.branches import with_branches
from ..onnxfile.metadata import NAME_SCOPES_KEY, own_outputs
from ..onnxfile.scopemap import GraphFacts, ScopeMap, stand_ins
from ..onnxfile.scopemap.graph_facts import is_fusion
from ..onnxfile.scopemap.lent import Exported, has_scopes, lend_scopes
from ..onnxfile.scopemap.node_scopes import read_nodes
from ..onnxfile.shapes import declared_dims
from ..onnxfile.tensor_types import inferred_types
from ..runtimes.ort_kernels import nchwc_block_size
from ..samples.drawn import Sample as Given
from .align import Item, RowBuilder, pack_batches
from .background import Background
from .driver import Sample, module_filter, plan_batches
from .ideal import OnnxIdeal, OnnxIdealParts
from .judging import Judging
from .local_errors import LocalInputs, onnx_ref_inputs, ref_needs
from .nchwc import blocked_stand_ins
from .onnx_side import IF_BRANCHES, OrtSide, absorb_unexposable, check_feed_shapes
from .rows import ABSORBED, IN_BRANCH, NO_COUNTERPART, same_shape
from .structure import pair_unnamed
from .torch_side import ArrayStore, ModuleCall
from .weight_check import PendingCheck, WeightCheck, check_file_weights

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16


def _producers(graph: "onnx.GraphProto") -> dict[str, Any]:
    return {t: node for node in graph.node for t in node.output if t}


def align_files(ref: "onnx.ModelProto", cand: "onnx.ModelProto", wanted: Callable[[str], bool]) -> tuple[list[Item], dict[str, int], str]:
    """Rows of the reference and the candidate tensors answering them (see module doc).

    Args:
        ref, cand: the two graphs (weights not needed).
        wanted: which module paths (or tensor names) get rows.

    Returns:
        The items (``ref_tensors`` set, also on a row that found no counterpart), calls per
        module path (for ``PATH#k`` names) and the alignment mode (``"scopes"`` or ``"names"``).

    Example:
        >>> import onnx.helper as h
        >>> vi = lambda n: h.make_tensor_value_info(n, 1, [2])
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])], "g", [vi("x")], [vi("y")])
        >>> m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        >>> items, _, mode = align_files(m, m, lambda path: True)
        >>> [(it.mc.path, it.tensors) for it in items], mode
        ([('r', ('r',)), ('', ('y',))], 'names')
    """
    ref_map = ScopeMap.from_model(ref, branches=IF_BRANCHES)
    names = _NameLookup.of(ref, cand)
    if ref_map.source != "none":
        items, counts = _scope_items(ref_map, cand, names, wanted)
        mode = "scopes"
    else:
        items, counts, mode = _name_items(ref, names, wanted), {}, "names"
    items.append(output_item(ref, cand, len(items)))
    return items, counts, mode


@dataclass
class _NameLookup:
    """The candidate's tensor for a reference tensor of the same name (through Q/DQ and NCHWc)."""

    made: dict[str, Any]       # candidate tensor -> its node (inside If branches too)
    main: set[str]             # what the candidate's runtime can hand out (carried branch tensors too)
    ref_made: dict[str, Any]   # reference tensor -> its node
    inputs: set[str]
    through: dict[str, str]    # a tensor the candidate quantises -> its DequantizeLinear output
    blocked: dict[str, str]    # a tensor ORT holds in NCHWc -> the blocked tensor

    @classmethod
    def of(cls, ref: "onnx.ModelProto", cand: "onnx.ModelProto") -> "_NameLookup":
        # a tensor both files quantise the same way (one file run two ways) is compared as itself
        ref_through = stand_ins(ref.graph)
        through = {t: d for t, d in stand_ins(cand.graph).items() if ref_through.get(t) != d}
        blocked = blocked_stand_ins(cand.graph, ref.graph) if nchwc_block_size() else {}
        made, ref_made = (_producers(with_branches(m.graph, IF_BRANCHES)) for m in (cand, ref))  # If branches' nodes too
        return cls(made, set(_producers(cand.graph)), ref_made, {i.name for i in cand.graph.input}, through, blocked)

    def quantised_from(self, t: str) -> str:
        """The tensor a candidate's ``DequantizeLinear`` output ``t`` stands for (its quantiser's input); ``t`` itself otherwise."""
        for src, dq in self.through.items():
            if dq == t:
                return src
        return t

    def folded_activation(self, t: str) -> str:
        """The candidate tensor ``t`` as the module that computes it hands it out: a ``DequantizeLinear`` output
        whose quantiser took the place of a later ``Relu``/``Clip`` (its range clips as the activation did, and
        the activation's output name went to the tensor quantised) stands for a value with that activation
        applied, which the reference computes in another module: the value before the quantiser is this one's.
        Any other tensor is itself."""
        src = self.quantised_from(t)
        node = self.ref_made.get(src)
        return src if src != t and node is not None and node.op_type in _REMOVABLE_ACTIVATIONS and src in self.main else t

    def find(self, t: str) -> str | None:
        """The candidate tensor holding reference tensor ``t``'s value, or ``None``."""
        if t in self.main or t in self.inputs:
            return self.through.get(t, t)
        return self.blocked.get(t)


def _scope_items(ref_map: Any, cand: "onnx.ModelProto", names: _NameLookup,
                 wanted: Callable[[str], bool]) -> tuple[list[Item], dict[str, int]]:
    """One row per reference module call (fused calls first): by tensor name, else the candidate's call."""
    cand_call = _CandidateCalls(cand, ref_map)
    elsewhere = _elsewhere(names.ref_made, names.made, names.through)
    items: list[Item] = []
    counts: dict[str, int] = {}
    for cp in ref_map.counterparts():
        if not wanted(cp.path):
            continue
        counts[cp.path] = ref_map.calls(cp.path)
        mc = ModuleCall(len(items), cp.path, cp.call, _op(names.ref_made, cp.tensors))
        items.append(_scope_item(mc, cp, cand_call, names.find, elsewhere, names.folded_activation, names.quantised_from))
    return fused_first(items), counts


class _CandidateCalls:
    """The candidate's own module calls; its scopes are read only when some tensor is not found by name."""

    def __init__(self, cand: "onnx.ModelProto", ref_map: Any = None) -> None:
        self.cand, self.ref_map = cand, ref_map
        self.calls: dict[tuple[str, int], Any] | None = None
        self.made: dict[tuple[str, int], set[str]] = {}  # the tensors each candidate call's nodes make

    def __call__(self, path: str, call: int) -> Any:
        if self.calls is None:
            cand_map = ScopeMap.from_model(self.cand, branches=IF_BRANCHES)
            self.calls = {(c.path, c.call): c for c in cand_map.counterparts()} if cand_map.source != "none" else {}
            for key in self.calls:
                self.made[key] = _made(cand_map, *key)
        return self.calls.get(self._paired(path, call))

    def _paired(self, path: str, call: int) -> tuple[str, int]:
        """The candidate's call of ``path`` making most of the tensors the reference's call ``call`` makes: a
        tool may have put a shared module's calls in another order (the candidate's call numbers count in its
        own graph order); by number where no call shares a name."""
        mine = [k for k in self.made if k[0] == path]
        if self.ref_map is None or len(mine) < 2:
            return path, call
        theirs = _made(self.ref_map, path, call)
        best = max(mine, key=lambda k: (len(self.made[k] & theirs), k == (path, call)))
        return best if self.made[best] & theirs else (path, call)


def _made(smap: Any, path: str, call: int) -> set[str]:
    """What identifies a call's nodes across two files: the tensors they make, and each node's FX node (the last
    of its dynamo scopes; a tool that renames a node's output keeps the node's metadata)."""
    out: set[str] = set()
    for i in smap.call_nodes(path, call)[0]:
        node = smap.graph.node[i]
        out.update(node.output)
        scopes = next((p.value for p in node.metadata_props if p.key == NAME_SCOPES_KEY), None)
        if scopes is not None:
            out.add("fx:" + scopes.rpartition(",")[2].strip(" '\"]"))
    return out


def _name_items(ref: "onnx.ModelProto", names: _NameLookup, wanted: Callable[[str], bool]) -> list[Item]:
    """One row per float activation the reference computes (no module scopes), paired by name."""
    weights = GraphFacts(ref.graph).weights
    types = inferred_types(ref)
    graph_outputs = {o.name for o in ref.graph.output}
    ran = set(_producers(ref.graph))  # a branch tensor the reference's runtime did not carry out has no row
    items: list[Item] = []
    for node in with_branches(ref.graph, IF_BRANCHES).node:
        for t in node.output:
            if t not in ran or t in weights or t in graph_outputs or not wanted(t) or not _is_float(types.get(t)):
                continue
            got = names.find(t)
            mc = ModuleCall(len(items), t, 0, node.op_type)
            if got is None:
                hidden = t in names.made  # inside a branch the candidate's runtime did not carry out
                items.append(Item(mc, status=NO_COUNTERPART, ref_tensors=(t,), note=IN_BRANCH if hidden else
                                  "the candidate computes no tensor of this name"))
            else:
                items.append(Item(mc, (got,), ref_tensors=(t,)))
    return items


def output_item(ref: "onnx.ModelProto", cand: "onnx.ModelProto", key: int) -> Item:
    """The model's outputs: by name, then the rest by position where the declared shapes agree.

    Example:
        >>> import onnx.helper as h
        >>> def m(*outs):
        ...     vi = lambda n, s: h.make_tensor_value_info(n, 1, s)
        ...     return h.make_model(h.make_graph([], "g", [], [vi(n, s) for n, s in outs]))
        >>> it = output_item(m(("y", [1, 4]), ("aux", [1, 2])), m(("logits", [1, 4]), ("y", [1, 4])), 3)
        >>> it.ref_tensors, it.tensors, it.note
        (('y',), ('y',), "1 of the reference's 2 outputs paired (by name, then by position and shape): aux has no counterpart")
    """
    ref_out, cand_out = own_outputs(ref), own_outputs(cand)
    pairs = _output_pairs(ref_out, cand_out, _output_dims(ref), _output_dims(cand))
    mc = ModuleCall(key, "", 0, "output")
    if not pairs:
        return Item(mc, status=NO_COUNTERPART, ref_tensors=tuple(ref_out), note=(
            f"the reference has {len(ref_out)} outputs, the candidate {len(cand_out)}; none pairs by name or by position and shape"))
    pairs.sort(key=lambda p: ref_out.index(p[0]))
    item = Item(mc, tuple(c for _, c in pairs), ref_tensors=tuple(r for r, _ in pairs))
    if len(pairs) < len(ref_out):
        left = [r for r in ref_out if r not in item.ref_tensors]
        item.note = (f"{len(pairs)} of the reference's {len(ref_out)} outputs paired (by name, then by position and shape): "
                     f"{', '.join(left)} {'has' if len(left) == 1 else 'have'} no counterpart")
    return item


def _output_pairs(ref_out: list[str], cand_out: list[str], ref_dims: dict[str, Any],
                  cand_dims: dict[str, Any]) -> list[tuple[str, str]]:
    """(reference, candidate) output pairs: equal names, then the others in order where shapes may agree."""
    pairs = [(n, n) for n in ref_out if n in cand_out]
    ref_left = [n for n in ref_out if n not in cand_out]
    cand_left = [n for n in cand_out if n not in ref_out]
    for r in ref_left:
        c = next((c for c in cand_left if _dims_agree(ref_dims.get(r), cand_dims.get(c))), None)
        if c is not None:
            pairs.append((r, c))
            cand_left = cand_left[cand_left.index(c) + 1:]
    return pairs


def _output_dims(model: "onnx.ModelProto") -> dict[str, Any]:
    return {o.name: declared_dims(o) for o in model.graph.output}


def _dims_agree(a: Any, b: Any) -> bool:
    """Whether two declared shapes can be one value's (unknown ranks and symbolic sizes agree with anything)."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return same_shape(tuple(d for d in a if isinstance(d, int)), tuple(d for d in b if isinstance(d, int)))
    return all(not isinstance(x, int) or not isinstance(y, int) or x == y for x, y in zip(a, b))


_REMOVABLE_ACTIVATIONS = {"Relu", "Clip"}


def _elsewhere(ref_made: dict[str, Any], cand_made: dict[str, Any], through: dict[str, str]) -> set[str]:
    """Tensors the reference computes whose name, in the candidate, holds another node's value.

    The QDQ quantizer removes a ``Relu``/``Clip`` whose input it quantises (the
    ``QuantizeLinear`` clips instead) and gives the activation's output name to the
    node before it: that tensor is then the earlier module's value, as the
    candidate's scopes say, so it is not counted here.
    """
    out = set(ref_made)
    for t, node in ref_made.items():
        made = cand_made.get(t)
        if node.op_type in _REMOVABLE_ACTIVATIONS and t in through and made is not None and made.op_type != node.op_type:
            out.discard(t)
    return out


def _scope_item(mc: ModuleCall, cp: Any, cand_call: Callable[[str, int], Any], by_name: Callable[[str], str | None],
                ref_made: set[str], unfolded: Callable[[str], str] = lambda t: t,
                plain: Callable[[str], str] = lambda t: t) -> Item:
    """One reference module call: by tensor name first, then by the candidate's own call."""
    if not cp.tensors:
        status = ABSORBED if cp.absorbed_by else NO_COUNTERPART
        note = f"fused into {cp.absorbed_by} in the reference; compared there" if cp.absorbed_by else f"reference: {cp.note}"
        return Item(mc, status=status, note=note, fused_into=cp.absorbed_by)
    named = [by_name(t) for t in cp.tensors]
    if all(n is not None for n in named):
        return Item(mc, tuple(n for n in named if n is not None), ref_tensors=tuple(cp.tensors))
    ccp = cand_call(cp.path, cp.call)
    if ccp is None:
        note = "the candidate has neither its tensors nor a call of this module"
    elif not ccp.tensors:
        note = f"candidate: {ccp.note or 'no tensor for this call'}"
    elif foreign := [plain(t) for t in ccp.tensors if plain(t) in ref_made and plain(t) not in cp.tensors]:
        note = (f"the candidate's call hands out {foreign[0]}, which the reference computes in another call "
                "(nodes fused across modules), so its own value is not in the candidate")
    else:
        return Item(mc, tuple(unfolded(t) for t in ccp.tensors), ref_tensors=tuple(cp.tensors))
    return Item(mc, status=NO_COUNTERPART, note=note, ref_tensors=tuple(cp.tensors))


def fused_first(items: list[Item]) -> list[Item]:
    """Items in the order PyTorch ran the calls: a call fused into a later module (a Conv into
    its BatchNorm) comes just before that module's call, as it ran, even where the file's graph
    order lists the fused node's scope first (the dynamo exporter's).

    Example:
        >>> mk = lambda k, path, into=None: Item(ModuleCall(k, path, 0, "-"), fused_into=into)
        >>> [it.mc.path for it in fused_first([mk(0, "bn1"), mk(1, "conv1", "bn1"), mk(2, "relu")])]
        ['conv1', 'bn1', 'relu']
    """
    at = {(it.mc.path, it.mc.call): i for i, it in enumerate(items) if it.fused_into is None}

    def place(i: int) -> tuple[int, int, int]:
        into = items[i].fused_into
        j = at.get((into, items[i].mc.call)) if into is not None else None
        return (i, 1, i) if j is None else (j, 0, i)  # just before its absorber, else where it was

    return [items[i] for i in sorted(range(len(items)), key=place)]


def _op(made: dict[str, Any], tensors: Sequence[str]) -> str:
    node = made.get(tensors[0]) if tensors else None
    return node.op_type if node is not None else "-"


def _is_float(vi: Any) -> bool:
    if vi is None:
        return True  # untyped: keep it, the comparison tells
    return vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type in _FLOAT_TYPES


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def feed_for(side: OrtSide, sample: Given) -> dict[str, np.ndarray]:
    """A sample (dict by name, or arrays in input order) as the feed of ``side``."""
    inputs = side.inputs
    names = [n for n, _ in inputs]
    if isinstance(sample, dict):
        unknown = [k for k in sample if k not in names]
        if unknown:
            raise InputSpecError(f"'{side.path}' has no input {unknown[0]!r} (its inputs: {', '.join(names)})")
        missing = [n for n in names if n not in sample]
        if missing:
            raise InputSpecError(f"no value for input {missing[0]!r} of '{side.path}' (its inputs: {', '.join(names)})")
        values = [sample[n] for n in names]
    else:
        values = list(sample)
        if len(values) != len(names):
            raise InputSpecError(f"'{side.path}' takes {len(names)} input(s) ({', '.join(names)}), got {len(values)}")
    feed = {}
    for (name, dtype), v in zip(inputs, values):
        a = np.asarray(v)
        feed[name] = a.astype(dtype) if dtype and a.dtype != np.dtype(dtype) else a
    check_feed_shapes(feed, side.runner.input_shapes())
    return feed


def cand_feed(ref: OrtSide, cand: OrtSide, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference's feed for the candidate: by name, else by position (another exporter's names)."""
    ref_names, cand_names = [n for n, _ in ref.inputs], [n for n, _ in cand.inputs]
    if set(ref_names) == set(cand_names):
        return feed_for(cand, feed)
    if len(ref_names) != len(cand_names):
        raise InputSpecError(
            f"the reference takes {len(ref_names)} input(s) ({', '.join(ref_names)}) but the candidate takes "
            f"{len(cand_names)} ({', '.join(cand_names)}): not variants of one model"
        )
    try:
        return feed_for(cand, [feed[n] for n in ref_names])
    except InputSpecError as e:
        raise InputSpecError(f"candidate: {e} (its inputs were matched by position to {', '.join(ref_names)})") from None


# ---------------------------------------------------------------------------
# the reference side
# ---------------------------------------------------------------------------
class OnnxReference:
    """An ONNX file in ORT as the reference of :mod:`.driver`: rows aligned once by
    :func:`align_files`, its tensors computed per batch and sample."""

    holds_values = False
    cand_scopes = None  # the candidate's scopes are read only for a tensor not found by name, inside align_files

    def __init__(self, ref: OrtSide, cand: OrtSide, samples: Sequence[Given], *, criterion: Criterion,
                 modules: Sequence[str] | None, batch_outputs: int | None, memory_budget: int,
                 allow_different_weights: bool, judging: Judging | None = None) -> None:
        self.side, self.cand, self.own_runs = ref, cand, (ref,)
        self.judging = judging
        # a candidate a tool stripped of scopes takes the reference's, where it is the dynamo export it came from
        self.lending = (lend_scopes(cand.proto, Exported.of_model(ref.proto), "the reference file")
                        if has_scopes(ref.proto) and not has_scopes(cand.proto)
                        and read_nodes(cand.proto.graph, is_fusion).source == "none" else None)
        # judged at the candidate's precision: the reference's graph rounded as the candidate holds its values
        self.ideal = OnnxIdeal(ref, judging.formats) if judging is not None and ref.runner.file is None else None
        self._ideal_run: Background[dict[str, np.ndarray]] | None = None  # started by values(), read by ideal_values()
        self._parts: OnnxIdealParts | None = None  # the local split's ideal parts (local=True), made on first use
        self._parts_lost: str | None = None  # why they could not be run
        # the weight check runs beside the planning and the sessions' builds; the driver waits for it
        # before the candidate runs, and a file the rows cannot be planned for is first checked for
        # other weights
        self._weights = PendingCheck(lambda stop: _weights(ref, cand, stop), allow_different_weights)
        with self._weights.named_first():
            self._plan(samples, criterion, modules, batch_outputs, memory_budget)

    def _plan(self, samples: Sequence[Given], criterion: Criterion,
              modules: Sequence[str] | None, batch_outputs: int | None, memory_budget: int) -> None:
        ref, cand = self.side, self.cand
        self.feeds = [feed_for(ref, s) for s in samples]
        self.cand_feeds = [cand_feed(ref, cand, f) for f in self.feeds]
        self.n_samples = len(self.feeds)
        wanted, _ = module_filter(modules or None)
        self.items, counts, self.mode = align_files(ref.proto, cand.proto, wanted)
        absorb_unexposable(self.items, ref, reference=True)
        absorb_unexposable(self.items, cand)
        self.pairing = pair_unnamed(self.items, ref, cand, (self.feeds[0], self.cand_feeds[0]),
                                    lambda side, names: _chunks(side, names, self.feeds[0], memory_budget))
        _check_variants(self.items, ref.path, cand.path, self.mode)
        sizes = _sizes(ref.proto, self.feeds[0])

        def cost(it: Item) -> tuple[int, int]:  # both sides' values of a batch are held at once
            tensors = it.ref_tensors if it.status is None else ()
            return len(tensors), 2 * sum(sizes.get(t, 1 << 20) for t in tensors)

        self.batches = plan_batches(self.items, cost, batch_outputs, memory_budget)
        self._batch_names: dict[tuple[int, int], list[str]] = {}
        self.store = ArrayStore(memory_budget)
        self.builder = RowBuilder(self.items, self.store, criterion, counts, find_fusions=False, branches=cand.carried,
                                  judging=self.judging, ideal=ArrayStore(memory_budget) if self.ideal is not None else None)
        self.known = set(_producers(ref.proto.graph))

    def sample(self, index: int, budget: int) -> Sample:
        """Sample ``index``: the one plan, with its feeds (nothing runs until :meth:`values`)."""
        return Sample(self.items, self.builder, self.batches, self.cand_feeds[index], self.feeds[index])

    def prepare(self, batch: list[Item], parts: Any) -> None:
        """Build the session that runs :meth:`values` of ``batch`` (ahead of it, beside the candidate's), and
        the ideal run's on the session-build thread after the candidate's (three builds on two threads)."""
        names = self._names(batch, parts)
        ideal_names = self._names(batch, None) if self.ideal is not None else []
        ideal = self.ideal
        built = Background(lambda: ideal.prepare(ideal_names), name="layertap-session-build") \
            if ideal is not None and ideal_names else None
        try:
            if names:
                self.side.prepare(names)
        finally:
            if built is not None:
                built.wait()  # a failed reference build leaves no build behind
        if built is not None:
            self._ideal_failed(built)

    def _ideal_failed(self, job: Background[Any]) -> Any:
        """``job``'s result, or ``None`` when the ideal run failed: an aid, never a gate, so the comparison
        goes on without it, by the fixed rule (:attr:`Judging.fallback`, said in the report's notes)."""
        try:
            return job.result()
        except Exception as e:  # noqa: BLE001 - whatever the ideal copy meets, the compare itself stands
            assert self.judging is not None
            self.judging.give_up(e)
            if self.ideal is not None:
                self.ideal.close()  # the job that failed has ended: nothing runs in it
            self.ideal = None
            return None

    def values(self, sample: Sample, batch: list[Item], parts: Any) -> dict[str, np.ndarray]:
        """The reference's tensors of a batch (and those feeding its calls' parts, for local errors); the
        ideal run's of the batch start beside them, on the session-build thread (:meth:`ideal_values`)."""
        names = self._names(batch, parts)
        if self.ideal is not None:
            ideal, ideal_names, feed = self.ideal, self._names(batch, None), sample.ref_feed or {}
            self._ideal_run = Background(lambda: ideal.run(ideal_names, feed), name="layertap-session-build")
        return self.side.run(names, sample.ref_feed or {}) if names else {}

    def ideal_values(self, sample: Sample, batch: list[Item]) -> dict[str, np.ndarray]:
        """The ideal run's tensors of a batch, by the reference's names (the run :meth:`values` started)."""
        pending, self._ideal_run = self._ideal_run, None
        return (self._ideal_failed(pending) or {}) if pending is not None else {}

    def _names(self, batch: list[Item], parts: Any) -> list[str]:
        """The tensors a batch's run exposes: once per batch (:attr:`batches` are this plan's, for every sample)."""
        key = (id(batch), id(parts))
        names = self._batch_names.get(key)
        if names is None:
            names = list(dict.fromkeys(t for it in batch if it.status is None for t in it.ref_tensors))
            if parts is not None:
                names += [t for t in ref_needs(parts, batch, self.known) if t not in names]
                alone = self._alone()
                names += [t for t in (alone.needs(batch) if alone is not None else ()) if t in self.known and t not in names]
            self._batch_names[key] = names
        return names

    def _alone(self) -> OnnxIdealParts | None:
        """The reference's own parts at the candidate's format (``local=True`` judged at it), made on first use."""
        if self.ideal is None or self.judging is None or self._parts_lost:
            return None
        if self._parts is None:
            self._parts = OnnxIdealParts(self.side, self.judging.formats)
        return self._parts

    def local_inputs(self, sample: Sample, batch: list[Item], ref_values: dict[str, np.ndarray],
                     cand_values: dict[str, np.ndarray]) -> LocalInputs:
        pairs_of, ref_of = onnx_ref_inputs(batch, ref_values, cand_values, sample.ref_feed or {}, sample.feed)
        parts = self._alone()
        values = {**(sample.ref_feed or {}), **ref_values}

        def alone(wants: Sequence[tuple[Item, Sequence[str]]]) -> dict[int, dict[str, np.ndarray]]:
            if parts is None or self._parts_lost:
                return {}
            try:
                return parts.run(wants, values)
            except Exception as e:  # noqa: BLE001 - an aid, never a gate: the rows keep the whole run's verdict
                self._parts_lost = one_line(e, limit=300)
                return {}

        return pairs_of, ref_of, lambda it, row: it.tensors, alone if parts is not None else None

    def notes(self, candidate: Any, rounding: bool) -> list[str]:
        notes = [self.lending.note()] if self.lending is not None and self.lending.refused is None else []
        if self.pairing is not None:
            notes.append(self.pairing.note())
        elif self.mode == "names":
            notes.append("the reference carries no module scopes: rows are its tensors, matched by name")
        notes += [it.note for it in self.items if not it.mc.path and it.status is None and it.note]
        if self._parts_lost:
            notes.append(f"no local split at the candidate's precision ({self._parts_lost}): rows keep the whole run's verdict")
        return notes + self.side.notes("reference", rounding) + candidate.notes("candidate", rounding)

    def start_weight_check(self) -> None:
        pass  # it started with the reference, beside the planning

    def checked_weights(self, beside: Callable[[], Any] | None = None) -> WeightCheck:
        """The weight check, once ``beside()`` ran too; raises :class:`~.weights.DifferentWeightsError` for two checkpoints."""
        return self._weights.result(beside)

    def close(self) -> None:
        self._weights.cancel()
        if self._ideal_run is not None:
            self._ideal_run.wait()  # its session closes below
            self._ideal_run = None
        self.store.close()
        builder = getattr(self, "builder", None)  # None: the plan failed
        if builder is not None and builder.ideal is not None:
            builder.ideal.close()
        if self.ideal is not None:
            self.ideal.close()
        if self._parts is not None:
            self._parts.close()
        self.side.close()


def _weights(ref: OrtSide, cand: OrtSide, stop: threading.Event | None = None) -> WeightCheck:
    """The weight check of two files; one file run two ways holds one set of weights."""
    try:
        if os.path.samefile(ref.path, cand.path):
            return WeightCheck(ref="reference", cand="candidate")
    except OSError:
        pass
    return check_file_weights(ref.runner.source, cand.runner.source, stop)


def refuse_same_run(a: Path, b: Path, ref_runtime: Any, cand_runtime: Any) -> None:
    """REF and CAND must differ: two files, or one file run two ways (runtimes, providers, precisions,
    optimisations)."""
    try:
        same = os.path.samefile(a, b)
    except OSError:
        same = False
    how = [(rt.describe(), rt.optimize) for rt in (ref_runtime, cand_runtime)]
    if same and how[0] == how[1]:
        raise LayertapError(
            f"REF and CAND are the same file '{a}' run the same way; compare two runs by giving --cand-runtime, "
            "--cand-providers / --providers, or --no-ort-opt / --ref-no-ort-opt"
        )


def _check_variants(items: list[Item], ref_path: Path, cand_path: Path, mode: str) -> None:
    """Refuse two files that share no module call or tensor name: not variants of one model."""
    inner = [it for it in items if it.mc.path and it.note != IN_BRANCH]
    if not inner or any(it.tensors for it in inner):
        return
    what = "module calls" if mode == "scopes" else "tensors"
    first = ", ".join(it.mc.path for it in inner[:3]) + (", ..." if len(inner) > 3 else "")
    raise OnnxFileError(
        f"'{ref_path}' and '{cand_path}' do not look like variants of one model: none of the reference's "
        f"{len(inner)} {what} ({first}) has a counterpart in the candidate (compared by module scope and tensor name, "
        "then by graph order, shape and the first sample's values)"
    )


def _chunks(side: OrtSide, names: list[str], feed: dict[str, np.ndarray], budget: int) -> list[list[str]]:
    """``names`` in runs of at most ``budget`` bytes (estimated as :func:`_sizes` does)."""
    sizes = _sizes(side.proto, feed)
    return pack_batches(names, lambda t: (1, sizes.get(t, 1 << 20)), None, budget)


def _sizes(model: "onnx.ModelProto", feed: dict[str, np.ndarray]) -> dict[str, int]:
    """Estimated bytes per tensor from shape inference; symbolic sizes take the feed's largest batch."""
    batch = max((a.shape[0] for a in feed.values() if a.ndim), default=1)
    out = {}
    for name, vi in inferred_types(model).items():
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        n = 1
        for d in tt.shape.dim:
            n *= d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else batch
        out[name] = n * 4
    return out


