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
from typing import TYPE_CHECKING

from ._calls import Call, innermost
from ._graph import GraphFacts, rules
from ._reading import join

if TYPE_CHECKING:  # pragma: no cover
    import onnx

FX_NODE_KEY = "pkg.torch.onnx.fx_node"
_FX_NAME_RE = re.compile(r"%([A-Za-z_]\w*)")
_BN_FOLD_RULES = {"FuseBatchNormIntoConv", "FuseBatchNormIntoConvTranspose", "FuseBatchNormIntoGemm"}
_FOLD_OPS = {"Conv", "ConvTranspose", "Gemm"}
# onnxscript rules that rewrite one node into one node computing the same value
# from the same inputs (or into Identity): module boundaries are untouched.
LOCAL_RULES = frozenset({
    "MaterializeReshapeShape", "Flatten2Reshape", "CastIdentity", "ExpandIdentity", "TransposeIdentity",
    "NormalizePadFormatConv", "NormalizePadFormatConvInteger", "RemoveOptionalBiasFromConv",
    "RemoveOptionalBiasFromConvTranspose", "RemoveOptionalBiasFromQLinearConv", "RemoveOptionalBiasFromGemm",
})


def fold_dynamo(graph: "onnx.GraphProto", calls: list[Call]) -> None:
    """Add a refused call for each Conv absorbed into its BatchNorm (named by the weight)."""
    added: list[Call] = []
    for i, node in enumerate(graph.node):
        if node.op_type not in _FOLD_OPS or not _BN_FOLD_RULES & set(rules(node)):
            continue
        owner = innermost(calls, i)
        if owner is None:
            continue
        conv = param_module(node.input[1] if len(node.input) > 1 else "")
        if conv and conv != owner.path:
            added.append(Call(
                conv, _next_call(calls + added, conv), [i],
                note=f"folded into node {node.name} with {owner.path} (BatchNorm fused into the Conv by the exporter); "
                     f"the Conv's own output is not in the graph",
                absorbed_by=owner.path,
            ))
        owner.input_note = f"its input, the output of {conv or 'the preceding Conv'}, was folded into node {node.name}"
    calls.extend(added)


def fold_torchscript(graph: "onnx.GraphProto", calls: list[Call], facts: GraphFacts) -> None:
    """A Conv with an anonymous constant weight had a BatchNorm folded in (see module doc)."""
    # Paths that own a node directly: a BatchNorm with an activation child (timm's
    # BatchNormAct2d) has nodes under its scope even when its own BatchNormalization was folded.
    owning = {c.path for c in (innermost(calls, i) for i in range(len(graph.node))) if c is not None}
    added: list[Call] = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        owner = innermost(calls, i)
        if owner is None or len(owner.nodes) != 1:
            continue  # a Conv module is exactly its Conv node
        weight = node.input[1]
        if weight == owner.path + ".weight" or weight not in facts.weights:
            continue
        bn = guess_batchnorm(owner.path)
        if bn is not None and bn in owning:
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
        owner.absorbed_by = bn
        input_note = f"its input, the output of {owner.path}, was folded into node {node.name}"
        after = _call_after(calls, bn, i)
        if after is not None:  # the BatchNorm's call exists through its children: the fused node joins it
            after.nodes = sorted([i, *after.nodes])
            after.input_note = after.input_note or input_note
            continue
        added.append(Call(bn, _next_call(calls + added, bn), [i], input_note=input_note))
    calls.extend(added)


def _call_after(calls: list[Call], path: str, index: int) -> Call | None:
    """The call of ``path`` whose first node comes next after node ``index``."""
    later = [c for c in calls if c.path == path and c.first > index]
    return min(later, key=lambda c: c.first) if later else None


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
        moved = [r for r in rules(node) if r not in LOCAL_RULES and r not in _BN_FOLD_RULES]
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
