"""Module scopes lent to a file that lost them, from a fresh export of the same model.

The dynamo exporter writes each node's module scopes into its ``metadata_props``
and names its tensors after torch.export's nodes (``conv2d_3``, ``relu_2``,
``getitem_12``). Tools that rewrite the file keep the tensor names but often drop
the metadata: ONNX Runtime's ``quant_pre_process`` (the step its quantisation
guide runs first) and any file saved by ONNX Runtime's optimizer come back with
no scope at all, so a comparison with the model sees only the output.

The model is at hand whenever a comparison has a PyTorch reference, and the same
model exported again names the same tensors. :func:`lend_scopes` gives each node
of the scope-less file the scopes of the export's node making the tensor of the
same name, where the two shapes agree; nodes the tools inserted (quantisers,
casts) get none and are placed by data flow (:mod:`.placing`) as in any file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..metadata import CLASS_HIERARCHY_KEY, FUSED_FROM_KEY, NAME_SCOPES_KEY, VALUE_SCOPES_KEY
from ..shapes import static_dims
from ..tensor_types import inferred_types

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: the share of a file's computing nodes that must find their node in the export (below it the
#: names are not the exporter's, or not this model's, and nothing is lent)
MIN_SHARE = 0.5
#: at most this share of the matched tensors may have another static shape in the export
MAX_CONFLICTS = 0.1
#: how many removed ops up the inputs a node's op is looked for (:meth:`Exported.owner`)
MAX_FOLDED = 3
#: ops a tool may drop, the op before them then making their output (a ReLU or a clip a
#: quantiser's range already applies, an identity)
REMOVABLE = frozenset({"Relu", "Clip", "Identity", "Dropout"})
#: ONNX Runtime's fusions that keep their first op's inputs, and that op
FUSED_FIRST = {"FusedConv": "Conv", "FusedGemm": "Gemm", "NhwcFusedConv": "Conv"}
#: what a fused node takes from the last op it fused (the value it makes); the rest is its first op's
_VALUE_KEYS = (NAME_SCOPES_KEY, CLASS_HIERARCHY_KEY)
_QUANTISED_OUTPUT = "_QuantizeLinear_Input"
_TOOL_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Cast", "Constant"})


@dataclass(frozen=True)
class ExportedNode:
    """What the exporter wrote about one node: its op, ``metadata_props`` (scopes, FX node...),
    input and output names and the outputs' static shapes (``None``: unknown or symbolic). Not its
    name: the exporter numbers some names by a counter that differs from one export to the next."""

    op_type: str
    metadata: tuple[tuple[str, str], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: tuple[tuple[int, ...] | None, ...]


class Exported:
    """An export's scoped nodes, found by the names of their outputs."""

    def __init__(self, nodes: Iterable[ExportedNode]) -> None:
        self.by_output: dict[str, tuple[ExportedNode, int]] = {}
        for n in nodes:
            for k, o in enumerate(n.outputs):
                if o:
                    self.by_output[o] = (n, k)

    @classmethod
    def of_model(cls, model: "onnx.ModelProto") -> "Exported":
        """The scoped nodes of a dynamo export already at hand (the float32 file a candidate was made from),
        with the static shapes its ``value_info`` declares.

        Example:
            >>> from onnx import helper
            >>> n = helper.make_node("Relu", ["x"], ["relu"])
            >>> _ = n.metadata_props.add(key=NAME_SCOPES_KEY, value="['', 'act', 'relu']")
            >>> e = Exported.of_model(helper.make_model(helper.make_graph([n], "g", [], [],
            ...     value_info=[helper.make_tensor_value_info("relu", 1, [2])])))
            >>> e.by_output["relu"][0].shapes
            ((2,),)
        """
        static = {vi.name: static_dims(vi) for vi in list(model.graph.value_info) + list(model.graph.output)}
        return cls(ExportedNode(n.op_type, tuple((p.key, p.value) for p in n.metadata_props),
                                tuple(n.input), tuple(n.output), tuple(static.get(t) for t in n.output))
                   for n in model.graph.node if any(p.key == NAME_SCOPES_KEY for p in n.metadata_props))

    def owner(self, node: "onnx.NodeProto") -> Owner | None:
        """The exported node whose op ``node`` is (``None``: none is).

        Found by ``node``'s first output, the exported node making the tensor of that name:

        * with ``node``'s op: that node;
        * else, where tools removed ops after it (:data:`REMOVABLE`: ONNX Runtime's quantiser
          folds a ReLU into the Conv before it, and the Conv then makes ``relu``), the node of
          ``node``'s op before them: the Conv is still the exported Conv, of its module, and
          ``relu`` names the removed ReLU's value (``Owner.removed``);
        * a fused op (ONNX Runtime's ``FusedConv``: a Conv and the activation after it) is
          the last op it fused, whose value it makes, and ``Owner.fused_from`` the first
          (:func:`~.folds.fold_fusions` then absorbs that op's module, as under TorchScript names);
        * else, ``node`` being a standard ONNX op: the exported node itself, which a tool
          expanded into several (a ``HardSwish`` function inlined into ``HardSigmoid`` and the
          ``Mul`` that makes ``hardswish``); ``Owner.expanded`` says so. Other fused ops get
          no owner.

        Node names are not used: the exporter numbers some of them by a counter
        (``node_Conv_505``) that differs from one export to the next.
        """
        name = node.output[0] if node.output else ""
        # ONNX Runtime's quantiser renames the maker of a graph output it quantises: ``logits_QuantizeLinear_Input``
        direct = self.by_output.get(name) or self.by_output.get(name.removesuffix(_QUANTISED_OUTPUT))
        op = FUSED_FIRST.get(node.op_type, node.op_type)
        hit = direct
        for _ in range(MAX_FOLDED + 1):
            if hit is None:
                return None
            if hit[0].op_type == op:
                removed = direct[0] if direct is not None and direct is not hit else None
                if op != node.op_type:  # fused: the node is the last op's, whose value it makes
                    return Owner(removed, direct[1], fused_from=hit[0]) if removed is not None and direct else None
                return Owner(hit[0], hit[1], removed)
            if hit[0].op_type not in REMOVABLE or not hit[0].inputs:
                break
            hit = self.by_output.get(hit[0].inputs[0])
        if direct is None or node.domain not in ("", "ai.onnx") or node.op_type in REMOVABLE:
            return None
        return Owner(direct[0], direct[1], expanded=True)


@dataclass(frozen=True)
class Owner:
    """An exported node and which of its outputs a file's node makes (``-1``: another tensor).

    ``removed``: the exported node that made the file node's output, when a tool removed it
    (the name stands for its value); ``expanded``: the file node is one of several a tool
    expanded the exported node into; ``fused_from``: the first exported node a fused file node
    computes (``node`` being the last).
    """

    node: ExportedNode
    output: int
    removed: ExportedNode | None = None
    expanded: bool = False
    fused_from: ExportedNode | None = None


@dataclass(frozen=True)
class Lending:
    """What :func:`lend_scopes` did: ``lent`` nodes of ``computing`` took scopes; ``refused``: why none did."""

    lent: int
    computing: int
    refused: str | None = None
    source: str = "a fresh dynamo export of the model"

    def note(self) -> str:
        """The report's one line on it."""
        if self.refused is not None:
            return (f"the ONNX file carries no module scopes, and {self.source} could not lend them "
                    f"({self.refused}): only the model output is compared")
        return (f"the ONNX file carries no module scopes (ONNX Runtime's quant_pre_process and optimizer drop them): "
                f"{self.lent} of its {self.computing} computing nodes took theirs from {self.source}, matched by "
                "tensor name and shape")


def has_scopes(model: "onnx.ModelProto") -> bool:
    """Whether any top-level node carries the dynamo exporter's scopes."""
    return any(p.key == NAME_SCOPES_KEY for n in model.graph.node for p in n.metadata_props)


def lend_scopes(model: "onnx.ModelProto", exported: Exported, source: str = Lending.source) -> Lending:
    """Give the top-level nodes of a scope-less ``model`` the metadata of the exported nodes they are.

    A node takes the ``metadata_props`` (module scopes, FX node) of the exported node whose
    op it is (:meth:`Exported.owner`), where the output's static shape agrees. Works in place on
    the in-memory ``model`` (node ``metadata_props`` only; graph, names and weights are
    unchanged; no file is touched), and only when at least :data:`MIN_SHARE` of the
    computing nodes (not quantisers, casts or constants) find their owner with at most
    :data:`MAX_CONFLICTS` of those of another shape; otherwise nothing changes and
    ``refused`` says why. ``source`` names where ``exported`` came from in the note.

    Example:
        >>> from onnx import helper, TensorProto
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["relu"], name="node_relu")], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        ...     [helper.make_tensor_value_info("relu", TensorProto.FLOAT, [2])])
        >>> m = helper.make_model(g)
        >>> scopes = ((NAME_SCOPES_KEY, "['', 'act', 'relu']"),)
        >>> lend_scopes(m, Exported([ExportedNode("Relu", scopes, ("x",), ("relu",), ((2,),))])).lent
        1
        >>> has_scopes(m)
        True
    """
    if has_scopes(model):
        return Lending(0, 0, "the file has scopes of its own", source)
    shapes = _static_shapes(model)
    computing = [n for n in model.graph.node if n.op_type not in _TOOL_OPS]
    matched: dict[int, tuple["onnx.NodeProto", Owner]] = {}
    conflicts = 0
    for node in computing:
        hit = exported.owner(node)
        if hit is None:
            continue
        mine = shapes.get(node.output[0]) if node.output else None
        theirs = hit.node.shapes[hit.output] if hit.output >= 0 else None
        if mine is not None and theirs is not None and mine != theirs:
            conflicts += 1
            continue
        matched[id(node)] = (node, hit)
    n = len(computing)
    if n == 0 or len(matched) < MIN_SHARE * n:
        return Lending(0, n, f"{len(matched)} of its {n} computing nodes are nodes the export makes", source)
    if conflicts > MAX_CONFLICTS * (len(matched) + conflicts):
        return Lending(0, n, f"{conflicts} of the {len(matched) + conflicts} nodes found in the export make "
                             "tensors of another shape", source)
    _join_expansions(model.graph, computing, matched)
    for node, hit in matched.values():
        meta = dict(hit.node.metadata)
        if hit.fused_from is not None:  # it reads its first op's inputs: what it took, and how, are that op's
            meta = {**dict(hit.fused_from.metadata), **{k: meta[k] for k in _VALUE_KEYS if k in meta}}
        for key, value in meta.items():
            _write(node, key, value)
        if hit.removed is not None:
            _write(node, VALUE_SCOPES_KEY, dict(hit.removed.metadata)[NAME_SCOPES_KEY])
        if hit.fused_from is not None:
            _write(node, FUSED_FROM_KEY, dict(hit.fused_from.metadata)[NAME_SCOPES_KEY])
    return Lending(len(matched), n, None, source)


def _join_expansions(graph: "onnx.GraphProto", computing: list["onnx.NodeProto"],
                     matched: dict[int, tuple["onnx.NodeProto", Owner]]) -> None:
    """A node with no owner whose results only an expanded node reads is part of that expansion
    (the ``HardSigmoid`` of an inlined ``HardSwish``), quantisers between them or not: it takes the same
    owner. In place on ``matched``."""
    readers: dict[str, list["onnx.NodeProto"]] = {}
    for node in graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    for node in reversed(computing):  # the expansion's last node first, then its helpers backwards
        if id(node) in matched or not node.output:
            continue
        users = {id(u): u for t in node.output for u in _through_tools(t, readers)}
        owners = {id(matched[k][1].node) for k in users if k in matched and matched[k][1].expanded}
        if len(users) >= 1 and len(owners) == 1 and all(k in matched for k in users):
            hit = matched[next(iter(users))][1]
            matched[id(node)] = (node, Owner(hit.node, -1, expanded=True))


def _through_tools(tensor: str, readers: dict[str, list["onnx.NodeProto"]], depth: int = 0) -> list["onnx.NodeProto"]:
    """The computing nodes reading ``tensor``, through the quantisers and casts tools put between."""
    out: list["onnx.NodeProto"] = []
    for u in readers.get(tensor, ()):
        if u.op_type in _TOOL_OPS and depth < 4:
            out += [w for t in u.output for w in _through_tools(t, readers, depth + 1)]
        else:
            out.append(u)
    return out


def _write(node: "onnx.NodeProto", key: str, value: str) -> None:
    entry = node.metadata_props.add()
    entry.key, entry.value = key, value


def _static_shapes(model: "onnx.ModelProto") -> dict[str, tuple[int, ...]]:
    static = {name: static_dims(vi) for name, vi in inferred_types(model).items()}
    return {name: dims for name, dims in static.items() if dims is not None}
