"""Folds and rewrites: where the exporter's optimizer moved a module's value.

BatchNorm folded into the preceding Conv (both exporters do it in eval mode):

* dynamo: the fused Conv carries the BatchNorm's scope and the rule name
  ``FuseBatchNormIntoConv``; its weight initializer keeps the Conv's parameter
  name (``layer1.0.conv1.weight``), which names the absorbed Conv module.
* TorchScript: the fused Conv keeps the Conv's name while its output is the
  BatchNorm's value. A TorchScript Conv whose weight is not an initializer
  named ``<conv path>.weight`` (folded weights get anonymous names such as
  ``onnx::Conv_196``) is treated as folded, and the BatchNorm is guessed by
  name (:func:`guess_batchnorm`). A wrong guess errs on the safe side: the Conv
  is refused, never answered with the BatchNorm's value.

Other onnxscript rewrites (dynamo) replace a pattern of nodes by new ones that
carry the metadata of one of the originals, so a node may compute what used to
be spread over two modules (``ReshapeReshape`` merged GPT-2's attention reshape
into ``c_proj``). Unless a rule is known to touch only its own node, the input
and output of every call at that node are not trusted (:func:`distrust_rewrites`).
Some rewrites leave no rule name behind: ``TransposeTranspose`` deletes an
``x.transpose(1, 0)`` ending one module and the one starting the next, so the
next node reads a tensor its FX node never took. :func:`distrust_bypassed_edges`
catches those from the ``pkg.torch.onnx.fx_node`` text.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from .calls import Call, innermost
from .graph_facts import FIRST_NODE_FUSIONS, GraphFacts, activation, is_fusion, rules
from .node_scopes import NodeScopes, join, tensor_op

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from .placing import Suspect

FX_NODE_KEY = "pkg.torch.onnx.fx_node"
_FX_NAME_RE = re.compile(r"%([A-Za-z_]\w*)")
BN_FOLD_RULES = {"FuseBatchNormIntoConv", "FuseBatchNormIntoConvTranspose", "FuseBatchNormIntoGemm"}
_FOLD_OPS = {"Conv", "ConvTranspose", "Gemm"}
_CONV_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
# ONNX Runtime's ConvBnFusion (run by quantisation's pre-processing) names the bias it makes after the BatchNorm's
_ORT_BN_BIAS = re.compile(r"^ConvBnFusion_BN_B_(.+)\.bias(?:_.*)?$")
# onnxscript rules that rewrite one node into one node computing the same value
# from the same inputs (or into Identity): module boundaries are untouched.
LOCAL_RULES = frozenset({
    "MaterializeReshapeShape", "Flatten2Reshape", "CastIdentity", "ExpandIdentity", "TransposeIdentity",
    "NormalizePadFormatConv", "NormalizePadFormatConvInteger", "RemoveOptionalBiasFromConv",
    "RemoveOptionalBiasFromConvTranspose", "RemoveOptionalBiasFromQLinearConv", "RemoveOptionalBiasFromGemm",
})


def fold_dynamo(graph: "onnx.GraphProto", calls: list[Call], ns: NodeScopes | None = None) -> None:
    """Add a refused call for each Conv absorbed into its BatchNorm (named by the weight).

    A fused node whose first op was such a Conv (ONNX Runtime's ``FusedConv`` in a file whose
    scopes :mod:`.lent` gave back: kind ``"value"``, its first op's chain in ``ns.name_chains``)
    folded it into that op's BatchNorm, which :func:`fold_fusions` then absorbs in turn.
    """
    added: list[Call] = []
    for i, node in enumerate(graph.node):
        fused = node.op_type in FIRST_NODE_FUSIONS and ns is not None and ns.kinds[i] == "value"
        if (node.op_type not in _FOLD_OPS and not fused) or not BN_FOLD_RULES & set(rules(node)):
            continue
        owner = innermost(calls, i)
        first = ns.name_chains[i] if fused and ns is not None else None
        if first:
            owner = Call(first[-1][0], 0, [i])  # stands for the BatchNorm: only its path is read
        if owner is None:
            continue
        conv = param_module(plain_weight_name(node.input[1]) if len(node.input) > 1 else "")
        if conv and conv != owner.path:
            added.append(Call(
                conv, _next_call(calls + added, conv), [i],
                note=f"folded into node {node.name} with {owner.path} (BatchNorm fused into the Conv by the exporter); "
                     f"the Conv's own output is not in the graph",
                absorbed_by=owner.path,
            ))
        owner.input_note = f"its input, the output of {conv or 'the preceding Conv'}, was folded into node {node.name}"
    calls.extend(added)


def fold_torchscript(graph: "onnx.GraphProto", calls: list[Call], facts: GraphFacts, ns: NodeScopes) -> None:
    """A Conv with an anonymous constant weight had a BatchNorm folded in (see module doc).

    The Conv is the call's one exporter-named node (other nodes of the call
    were made by a quantizer around it), or, when a tool replaced the Conv
    altogether, the call's value tensor still carries the Conv's name
    (``/conv1/Conv_output_0``) and no initializer carries the module's weight name.
    """
    # Paths that own a node directly: a BatchNorm with an activation child (timm's
    # BatchNormAct2d) has nodes under its scope even when its own BatchNormalization was folded.
    owning = {c.path for c in (innermost(calls, i) for i in range(len(graph.node))) if c is not None}
    inits = [i.name for i in graph.initializer]
    added: list[Call] = []
    for owner in list(calls):
        node = _folded_conv(graph, owner, calls, facts, ns, inits)
        if node is None:
            continue
        named = _fused_batchnorm(node)
        bn, by = (named, "ONNX Runtime's ConvBnFusion") if named else (guess_batchnorm(owner.path), "the exporter")
        if bn is not None and bn in owning:
            continue  # the BatchNorm has nodes of its own: nothing was folded into this Conv
        if bn is None:
            owner.note = (
                f"a BatchNorm was folded into node {node.name} by {by}, so that node's output is the "
                "BatchNorm's value, not this Conv's"
            )
            continue
        owner.note = (
            f"folded into node {node.name} with {bn} (BatchNorm fused into the Conv by {by}); "
            f"that node's output is {bn}'s value, not this Conv's"
        )
        owner.absorbed_by = bn
        input_note = f"its input, the output of {owner.path}, was folded into node {node.name}"
        after = _call_after(calls, bn, owner.first)
        if after is not None:  # the BatchNorm's call exists through its children: the fused node joins it
            after.nodes = sorted({*owner.nodes, *after.nodes})
            after.input_note = after.input_note or input_note
            continue
        added.append(Call(bn, owner.call, list(owner.nodes), input_note=input_note))
    calls.extend(added)


def _call_after(calls: list[Call], path: str, index: int) -> Call | None:
    """The call of ``path`` whose first node comes next after node ``index``."""
    later = [c for c in calls if c.path == path and c.first > index]
    return min(later, key=lambda c: c.first) if later else None


_QUANT_WEIGHT_SUFFIXES = ("_DequantizeLinear_Output", "_quantized")


def plain_weight_name(name: str) -> str:
    """A weight's name without the quantizer's suffixes: ``conv1.weight_DequantizeLinear_Output`` -> ``conv1.weight``."""
    for suffix in _QUANT_WEIGHT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _folded_conv(graph: "onnx.GraphProto", c: Call, calls: list[Call], facts: GraphFacts, ns: NodeScopes,
                 inits: list[str]) -> "onnx.NodeProto | None":
    """The Conv node of call ``c`` when its weight is anonymous (a BatchNorm was folded in), else ``None``."""
    if c.note is not None or not c.nodes:
        return None
    own = [i for i in c.nodes if ns.kinds[i] == "own"]
    if len(own) == 1 and graph.node[own[0]].op_type in _CONV_OPS and not is_fusion(graph.node[own[0]]) \
            and innermost([c2 for c2 in calls if c2.note is None], own[0]) is c:
        node = graph.node[own[0]]
        weight = plain_weight_name(node.input[1] if len(node.input) > 1 else "")
        folded = weight != c.path + ".weight" and node.input[1] in facts.weights
        return node if folded else None
    if own:
        return None
    values = [i for i in c.nodes if ns.kinds[i] == "value"]
    if values and tensor_op(graph.node[values[-1]].output[0]) in _CONV_OPS \
            and innermost([c2 for c2 in calls if c2.note is None], values[-1]) is c:
        mine = c.path + ".weight"
        return None if any(n == mine or n.startswith(mine + "_") for n in inits) else graph.node[values[-1]]
    return None


def fold_fusions(graph: "onnx.GraphProto", calls: list[Call], ns: NodeScopes, facts: GraphFacts) -> None:
    """Nodes whose op fused several ops (ONNX Runtime): the last module wins, the others are absorbed.

    Under TorchScript names the fused node's name is its first op's and its
    output tensor's name its last op's (:mod:`.node_scopes`); the node computes
    the last module's value, and the modules named only by the node (conv1, and
    bn1 folded into it earlier) are refused with ``absorbed_by`` = the last.
    Without that tensor name nothing says which modules the ops came from, so
    the calls the node's output leaves are refused. Unless the op keeps its
    first node's inputs (``FusedConv``, ``FusedGemm``), it may also have
    swallowed the last ops of the modules it reads from: their outputs there
    are refused too.
    """
    known = {c.path for c in calls}
    by_key = {(c.path, c.call): c for c in calls}
    added: list[Call] = []
    for i, node in enumerate(graph.node):
        if not is_fusion(node):
            continue
        what = _describe(node)
        value = ns.chains[i] if ns.kinds[i] == "value" else None
        if value:
            last = value[-1][0]
            for path, k in _absorbed(graph, node, ns.name_chains[i] or (), value, known, facts):
                why = (f"fused into node {node.name or node.op_type} ({what}) with {last}: that node's output is "
                       f"{last}'s value, not this module's")
                c = by_key.get((path, k))
                if c is None:
                    added.append(Call(path, k, [i], note=why, input_note=why, absorbed_by=last))
                else:
                    c.note, c.absorbed_by = c.note or why, last
            for c in calls:
                if c.path == last and c.has(i) and c.input_note is None and \
                        (ns.name_chains[i] != value or node.op_type not in FIRST_NODE_FUSIONS):
                    c.input_note = f"its input was fused into node {node.name or node.op_type} ({what})"
        else:
            for c in calls:
                if c.has(i) and c.note is None and set(node.output) & set(facts.boundary(c.nodes)):
                    c.note = (f"node {node.name or node.op_type} ({what}) fuses several operations and this file does "
                              "not record which modules they came from")
        if node.op_type not in FIRST_NODE_FUSIONS and not _skip_norm_without_bias(node):
            why = (f"its output is read by node {node.name or node.op_type} ({what}), which ONNX Runtime fused from "
                   "several nodes that may include this module's last operations")
            reads = {t for t in node.input if t and t not in facts.weights}
            for c in calls:
                if not c.has(i) and c.note is None and reads & set(facts.boundary(c.nodes)):
                    c.note = why
    calls.extend(added)


def _absorbed(graph: "onnx.GraphProto", node: "onnx.NodeProto", named: tuple, value: tuple, known: set[str],
              facts: GraphFacts) -> list[tuple[str, int]]:
    """Modules only the fused node's own name names (plus a BatchNorm folded into its Conv)."""
    paths = {p for p, _ in value}
    out = [(p, k) for p, k in named if p not in paths]
    if out and node.op_type in _CONV_OPS | FIRST_NODE_FUSIONS and len(node.input) > 1:
        conv, k = out[-1]
        bn = guess_batchnorm(conv)
        if node.input[1] != conv + ".weight" and node.input[1] in facts.weights and bn and bn not in known:
            out.append((bn, k))
    return out


def _describe(node: "onnx.NodeProto") -> str:
    act = activation(node)
    return f"{node.op_type} with activation {act}" if act else node.op_type


def _skip_norm_without_bias(node: "onnx.NodeProto") -> bool:
    # SkipLayerNormalization adds its two inputs before normalising; a fifth input
    # would be a bias it took from the Linear before it
    return node.op_type == "SkipLayerNormalization" and (len(node.input) < 5 or not node.input[4])


def distrust_rewrites(graph: "onnx.GraphProto", calls: list[Call], facts: GraphFacts) -> None:
    """Refuse the input/output of calls that a cross-node rewrite may have moved.

    For a node rewritten by a rule outside :data:`LOCAL_RULES` (BatchNorm folds
    are handled by :func:`fold_dynamo`): a call whose boundary tensor the node
    makes gets ``note``; a call whose entering tensor the node reads gets
    ``input_note``.

    Example:
        >>> from onnx import helper
        >>> n = [helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Reshape", ["b", "s"], ["c"])]
        >>> _ = n[1].metadata_props.add(key="pkg.onnxscript.rewriter.rule_name", value="ReshapeReshape")
        >>> s = helper.make_tensor("s", 7, [1], [-1])
        >>> g = helper.make_graph(n, "g", [], [helper.make_tensor_value_info("c", 1, None)], [s])
        >>> calls = [Call("attn", 0, [0, 1]), Call("attn.proj", 0, [1])]
        >>> distrust_rewrites(g, calls, GraphFacts(g))
        >>> [(c.path, c.note is None, c.input_note is None) for c in calls]
        [('attn', False, True), ('attn.proj', False, False)]
    """
    for i, node in enumerate(graph.node):
        moved = [r for r in rules(node) if r not in LOCAL_RULES and r not in BN_FOLD_RULES]
        if not moved:
            continue
        why = (
            f"node {node.name or node.op_type} was rewritten by the exporter's optimizer (rule {moved[0]}), which can "
            "merge nodes of neighbouring modules"
        )
        for c in calls:
            if not c.has(i):
                continue
            if c.note is None and set(node.output) & set(facts.boundary(c.nodes)):
                c.note = f"{why}; its value is not trusted as this call's output"
                c.rewritten = True
            if c.input_note is None and set(node.input) & set(facts.entering(c.nodes)):
                c.input_note = f"{why}; its input is not trusted as this call's input"


def distrust_suspects(calls: list[Call], suspects: "Sequence[Suspect]", facts: GraphFacts) -> None:
    """Refuse the output (input) of calls at a tensor where a placed island meets them (:mod:`.placing`).

    A refused output is still a candidate (``rewritten``) when the suspect says so: the
    tensor is there, only whether the island ends this module is unknown, so a caller
    that knows the true value can check it numerically (GPT-2's ``c_attn`` before the
    optimizer's ``Split``).
    """
    out = {s.tensor: s.why for s in suspects if s.side == "out"}
    candidates = {s.tensor for s in suspects if s.side == "out" and s.candidate}
    into = {s.tensor: s.why for s in suspects if s.side == "in"}
    for c in calls:
        if not c.nodes:
            continue
        if c.note is None:
            hit = next((t for t in facts.boundary(c.nodes) if t in out), None)
            if hit is not None:
                c.note = f"its output {hit} is read by nodes another tool inserted: {out[hit]}"
                c.rewritten = hit in candidates
        if c.input_note is None:
            hit = next((t for t in facts.entering(c.nodes) if t in into), None)
            if hit is not None:
                c.input_note = f"its input {hit} is made by nodes another tool inserted: {into[hit]}"


def distrust_bypassed_edges(graph: "onnx.GraphProto", calls: list[Call], facts: GraphFacts) -> None:
    """Refuse calls at an edge where the graph skips FX nodes that a rewrite removed.

    Under dynamo an ONNX tensor named after an FX node holds that node's
    value, and ``pkg.torch.onnx.fx_node`` lists the FX values each node took.
    A node reading an FX-named tensor its own FX node never took means nodes
    in between were rewritten away (no rule name survives on a deleted node).
    The call that makes that tensor gets ``note`` and the call that reads it
    gets ``input_note``. A value-preserving merge (common subexpressions) is
    refused too: safe, and rare at module boundaries.

    Example:
        >>> from onnx import helper
        >>> def fx(node, text):
        ...     _ = node.metadata_props.add(key=FX_NODE_KEY, value=text)
        ...     return node
        >>> n = [fx(helper.make_node("Relu", ["x"], ["a"]), "%a : = call_function[relu](args = (%x,))"),
        ...      fx(helper.make_node("Neg", ["a"], ["n"]), "%n : = call_function[neg](args = (%t,))")]
        >>> g = helper.make_graph(n, "g", [], [helper.make_tensor_value_info("n", 1, None)])
        >>> calls = [Call("mha", 0, [0]), Call("lstm", 0, [1])]
        >>> distrust_bypassed_edges(g, calls, GraphFacts(g))
        >>> [(c.path, c.note is None, c.input_note is None) for c in calls]
        [('mha', False, True), ('lstm', True, False)]
    """
    took: dict[int, set[str]] = {}
    fx_values: set[str] = set()
    for i, node in enumerate(graph.node):
        text = next((p.value for p in node.metadata_props if p.key == FX_NODE_KEY), None)
        if text is None:
            continue
        fx_values.update(_FX_NAME_RE.findall(text)[:1])
        names = _FX_NAME_RE.findall(text)
        # a node with a rule name was rewritten on purpose and is judged by the
        # fold / rewrite checks (a folded Conv+BN node reads the Conv's input)
        if names and not rules(node):
            took[i] = set(names[1:])
    producer = {t: i for i, node in enumerate(graph.node) for t in node.output if t}
    for i, args in took.items():
        for t in graph.node[i].input:
            if not t or t in args or t not in fx_values or t in facts.weights or t not in producer:
                continue
            why = (
                f"node {graph.node[i].name or graph.node[i].op_type} reads {t}, which its FX node never took: the "
                "exporter's optimizer removed nodes in between (e.g. two transposes that cancel)"
            )
            for c in calls:
                inside_reader, inside_maker = c.has(i), c.has(producer[t])
                if inside_maker and not inside_reader and c.note is None:
                    c.note = f"{why}; its value is not trusted as this call's output"
                    c.rewritten = True
                if inside_reader and not inside_maker and c.input_note is None:
                    c.input_note = f"{why}; its input is not trusted as this call's input"


def _next_call(calls: list[Call], path: str) -> int:
    return sum(1 for c in calls if c.path == path)


def param_module(name: str) -> str | None:
    """``layer1.0.conv1.weight`` -> ``layer1.0.conv1``; anonymous names -> None.

    Example:
        >>> param_module("layer1.0.conv1.weight"), param_module("val_12")
        ('layer1.0.conv1', None)
    """
    if name.endswith(".weight") and not name.startswith(("onnx::", "val_")):
        return name[: -len(".weight")]
    return None


def _fused_batchnorm(node: "onnx.NodeProto") -> str | None:
    """The BatchNorm ONNX Runtime's ``ConvBnFusion`` folded into ``node``, by the name of the bias it wrote."""
    found = _ORT_BN_BIAS.match(node.input[2]) if len(node.input) > 2 else None
    return found.group(1) if found else None


def guess_batchnorm(conv_path: str) -> str | None:
    """The BatchNorm conventionally right after a Conv: ``conv1 -> bn1``, ``0 -> 1``.

    Example:
        >>> guess_batchnorm("layer1.0.conv1"), guess_batchnorm("layer2.0.downsample.0"), guess_batchnorm("proj")
        ('layer1.0.bn1', 'layer2.0.downsample.1', None)
    """
    head, _, last = conv_path.rpartition(".")
    if last.isdigit():
        guess = str(int(last) + 1)
    elif "conv" in last:
        guess = last.replace("conv", "bn", 1)
    else:
        return None
    return join(head, guess)
