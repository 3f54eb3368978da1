"""Reading module scopes off ONNX nodes: per node, the chain of enclosing module calls.

* torch.export-based exporter: node ``metadata_props`` ``pkg.torch.onnx.name_scopes``
  (read with :func:`ast.literal_eval`, never eval);
* TorchScript exporter: node names such as ``/layer2/layer2.0/relu_1/Relu``.

Files that other tools rewrote (ONNX Runtime's optimizer, the quantizers) keep
TorchScript names only in part. A node name is the exporter's own when its
last component is the node's op type (``.../conv1/Conv``, ``.../relu_1/Relu``);
other names (``gemm_input_reshape_token_20``, ``.../Conv_quant``,
``.../Relu_output_0_QuantizeLinear``) were made by a tool. Tensor names are
more faithful: a tool that replaces nodes usually keeps the name of the last
replaced node's output (``/layer1/layer1.0/relu/Relu_output_0`` on the
``FusedConv`` that fused conv1, bn1 and relu), so that name says whose value
the new node computes (:func:`read_nodes`, kind ``"value"``).

ONNX Runtime marks the names of some nodes it made: ``fused /fc2/Gemm`` (a Gemm
fused with the activation after it), ``/h.0/attn/MatMul/MatMulScaleFusion/``.
The exporter's name under the mark (:func:`exporter_name`) still says which
module the first fused op came from; without it, a module whose first call was
fused away would leave only ``/fc2_1/Gemm``, read as a module ``fc2_1``.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ...errors import LayertapWarning
from ..metadata import FUSED_FROM_KEY, NAME_SCOPES_KEY, VALUE_SCOPES_KEY

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: deeper module nesting is not read: every level holds its full path, so the
#: cost grows with depth x name length (no real model nests this deep)
MAX_SCOPE_DEPTH = 256
_CALL_SUFFIX_RE = re.compile(r"^(?P<base>.+)_(?P<call>\d+)$")
_OP_COMPONENT_RE = re.compile(r"^(?P<op>[A-Za-z][A-Za-z0-9]*?)(?:_\d+)?$")
_TS_TENSOR_RE = re.compile(r"^(?P<node>/.+/[A-Za-z][A-Za-z0-9]*(?:_\d+)?)_output_\d+$")
# a tool's name for a node it made from an exporter-named one: ``/fc/Gemm_MatMul_quant``, ``/fc/Gemm_Add``
_RENAMED_RE = re.compile(r"^[A-Z][A-Za-z0-9]*(?:_\d+)?_(?!output_)[A-Za-z]\w*$")
# ONNX Runtime's marks on the name of a node it fused: a "fused " prefix, "/<Rule>Fusion/" suffixes
_ORT_FUSED_PREFIX = "fused "
_ORT_FUSION_SUFFIX_RE = re.compile(r"/[A-Za-z]\w*Fusion/.*$")

Chain = tuple[tuple[str, "int | None"], ...]  # (module path, explicit call or None), outer first


@dataclass(frozen=True)
class NodeScopes:
    """Per node: its chain of modules and where that chain came from.

    ``kinds[i]`` is ``"own"`` (the exporter's metadata or node name: the node
    computes an op of that module), ``"value"`` (a TorchScript tensor name on a
    node a tool made or fused: the node's output is that module's value, its
    inputs may come from elsewhere), ``"renamed"`` (a tool replaced an
    exporter-named node and named the new ones after it, ``/fc/Gemm_MatMul_quant``:
    they compute part of that module) or ``None`` (no scope: a node another tool
    inserted; :mod:`.placing` places it by data flow). ``"unscoped"``: a
    TorchScript exporter node made outside any module (``Unsqueeze_161``).
    """

    chains: list[Chain | None]
    kinds: list[str | None]
    source: str
    name_chains: list[Chain | None]  # TorchScript: the chain of the node's own name, kept for fusions
    existing: frozenset[tuple[str, str]] = frozenset()
    #: dynamo: tensors named after an op a tool removed, and that op's chain (:data:`VALUE_SCOPES_KEY`)
    values: Mapping[str, Chain] = field(default_factory=dict)

    def tensor_chain(self, name: str) -> Chain | None:
        """The chain a tensor's name stands for: a TorchScript name (``/a/b/Relu_output_0``), or a dynamo
        name whose op a tool removed (:data:`~layertap.onnxfile.metadata.VALUE_SCOPES_KEY`); ``None`` otherwise."""
        if self.source == "dynamo":
            return self.values.get(name)
        parts = _tensor_parts(name) if self.source == "torchscript" else None
        return None if parts is None else _ts_resolve(_ts_levels(parts), set(self.existing))


def read_nodes(graph: "onnx.GraphProto", fused: Callable[["onnx.NodeProto"], bool]) -> NodeScopes:
    """Chains and their kinds for every node (see :class:`NodeScopes`).

    ``fused(node)`` says whether a node's op fused several ops (its own name
    then names the first of them, its output tensor the last).

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["/act/Relu_output_0"], name="/act/Relu"),
        ...     helper.make_node("Neg", ["/act/Relu_output_0"], ["/neg/Neg_output_0"], name="tool_made_7")], "g", [], [])
        >>> ns = read_nodes(g, lambda n: False)
        >>> ns.chains, ns.kinds, ns.tensor_chain("/act/Relu_output_0")
        ([(('act', 0),), (('neg', 0),)], ['own', 'value'], (('act', 0),))
    """
    dynamo = [_dynamo_scopes(n) for n in graph.node]
    if any(s is not None for s in dynamo):
        return _dynamo_nodes(graph, dynamo)
    own = [_torchscript_parts(n.name) if _own_name(n) else None for n in graph.node]
    made = [_tensor_parts(n.output[0]) if n.output else None for n in graph.node]
    if not any(own) and not any(made):
        return NodeScopes([None] * len(graph.node), [None] * len(graph.node), "none", [None] * len(graph.node))
    named = [_torchscript_parts(n.name) for n in graph.node]
    existing = _existing_levels(named + made)
    resolve = lambda parts: None if parts is None else _ts_resolve(_ts_levels(parts), existing)  # noqa: E731
    chains: list[Chain | None] = []
    kinds: list[str | None] = []
    for node, o, m in zip(graph.node, own, made):
        if o is not None and not (fused(node) and m is not None):
            chains.append(resolve(o))
            kinds.append("own")
        elif m is not None:
            chains.append(resolve(m))
            kinds.append("value")
        elif _renamed(node.name):
            chains.append(resolve(_torchscript_parts(node.name)))
            kinds.append("renamed")
        else:  # the exporter's own unscoped nodes (``Unsqueeze_161``) stay outside modules, as exported
            chains.append(None)
            kinds.append("unscoped" if _exporter_unscoped(node) else None)
    return NodeScopes(chains, kinds, "torchscript", [resolve(o) for o in own], frozenset(existing))


def _dynamo_nodes(graph: "onnx.GraphProto", dynamo: list[list[str] | None]) -> NodeScopes:
    """The dynamo exporter's scopes, and what :mod:`.lent` wrote beside scopes it lent: a tensor a removed
    op's name stands for (``values``), a fused node's first op (its ``name_chains``, kind ``"value"``)."""
    found: list[Chain | None] = [_chain(s) for s in dynamo]
    values = {n.output[0]: tuple((p, None) for p in v) for n in graph.node
              if n.output and (v := _dynamo_scopes(n, VALUE_SCOPES_KEY)) is not None}
    first = [_dynamo_scopes(n, FUSED_FROM_KEY) for n in graph.node]
    kinds: list[str | None] = ["value" if f is not None and c is not None else "own" if c is not None else None
                               for c, f in zip(found, first)]
    named = [c if f is None else _chain(f) for c, f in zip(found, first)]
    return NodeScopes(found, kinds, "dynamo", named, values=values)


def _chain(paths: list[str] | None) -> Chain | None:
    return None if paths is None else tuple((p, None) for p in paths)


def _exporter_unscoped(node: "onnx.NodeProto") -> bool:
    m = _OP_COMPONENT_RE.match(node.name)
    return m is not None and m.group("op") == node.op_type


def exporter_name(name: str) -> str:
    """A node name without the marks ONNX Runtime adds when it fuses that node.

    Example:
        >>> exporter_name("fused /fc2/Gemm"), exporter_name("/h.0/attn/MatMul/MatMulScaleFusion//MatmulTransposeFusion/")
        ('/fc2/Gemm', '/h.0/attn/MatMul')
        >>> exporter_name("/layer1/layer1.0/conv1/Conv")
        '/layer1/layer1.0/conv1/Conv'
    """
    while name.startswith(_ORT_FUSED_PREFIX):
        name = name[len(_ORT_FUSED_PREFIX):]
    return _ORT_FUSION_SUFFIX_RE.sub("", name) if name.startswith("/") else name


def _own_name(node: "onnx.NodeProto") -> bool:
    """Whether a node's name is the TorchScript exporter's (last component = its op type)."""
    name = exporter_name(node.name)
    if not name.startswith("/"):
        return False
    m = _OP_COMPONENT_RE.match(name.rsplit("/", 1)[-1])
    return m is not None and (m.group("op") == node.op_type or node.op_type.endswith(m.group("op")))


def _renamed(name: str) -> bool:
    """Whether a node name is a tool's name derived from an exporter's (``/fc/Gemm_Add``).

    Names derived from a tensor (``/relu/Relu_output_0_QuantizeLinear``) say
    whose value the node reads, not which module it belongs to: they are not.

    Example:
        >>> _renamed("/fc/Gemm_MatMul_quant"), _renamed("/fc/Gemm_1_Add"), _renamed("/relu/Relu_output_0_QuantizeLinear")
        (True, True, False)
    """
    return (name.startswith("/") and "_output_" not in name and bool(_RENAMED_RE.match(name.rsplit("/", 1)[-1]))
            and _torchscript_parts(name) is not None)


def tensor_op(name: str) -> str | None:
    """The op type a TorchScript tensor name was made by: ``/conv1/Conv_output_0`` -> ``Conv``."""
    m = _TS_TENSOR_RE.match(name)
    if not m:
        return None
    op = _OP_COMPONENT_RE.match(m.group("node").rsplit("/", 1)[-1])
    return op.group("op") if op else None


def _tensor_parts(name: str) -> list[str] | None:
    """``/layer1/layer1.0/relu/Relu_output_0`` -> ``['layer1', 'layer1.0', 'relu']``."""
    m = _TS_TENSOR_RE.match(name)
    return _torchscript_parts(m.group("node")) if m else None


def _existing_levels(parts_per_node: Sequence[list[str] | None]) -> set[tuple[str, str]]:
    return {lv for p in parts_per_node if p for lv in _ts_levels(p)}


def _dynamo_scopes(node: "onnx.NodeProto", key: str = NAME_SCOPES_KEY) -> list[str] | None:
    for p in node.metadata_props:
        if p.key == key:
            try:
                value = ast.literal_eval(p.value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) and value:
                # root first, FX node name last: modules are the middle
                return _capped([v for v in value[1:-1] if v], node.name)
            return None
    return None


def _torchscript_parts(name: str) -> list[str] | None:
    """``/layer1/layer1.0/conv1/Conv`` -> ``['layer1', 'layer1.0', 'conv1']`` (ONNX Runtime's marks removed)."""
    name = exporter_name(name)
    if not name.startswith("/"):
        return None
    parts = name.split("/")[1:]
    if any(not p for p in parts):
        return None
    return _capped(parts[:-1], name)


def _capped(scopes: list[str], name: str) -> list[str] | None:
    """``scopes``, or None (with a warning) when they nest deeper than :data:`MAX_SCOPE_DEPTH`."""
    if len(scopes) <= MAX_SCOPE_DEPTH:
        return scopes

    warnings.warn(
        f"node or tensor {name[:60]!r}... nests {len(scopes)} module levels (more than {MAX_SCOPE_DEPTH}); "
        "its module scope is ignored (tensor names still work)",
        LayertapWarning,
        stacklevel=2,
    )
    return None


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
            levels.append((join(container, prev), comp))
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
        path = join(resolved.get(container, container), base)
        resolved[join(container, comp)] = path
        out.append((path, call))
    return tuple(out)


def join(container: str, comp: str) -> str:
    """``join("layer1.0", "conv1") == "layer1.0.conv1"``; the root is ``""``."""
    return f"{container}.{comp}" if container else comp
