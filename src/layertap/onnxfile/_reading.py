"""Reading module scopes off ONNX nodes: per node, the chain of enclosing module calls.

* torch.export-based exporter: node ``metadata_props`` ``pkg.torch.onnx.name_scopes``
  (read with :func:`ast.literal_eval`, never eval);
* TorchScript exporter: node names such as ``/layer2/layer2.0/relu_1/Relu``.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import onnx

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_CALL_SUFFIX_RE = re.compile(r"^(?P<base>.+)_(?P<call>\d+)$")

Chain = tuple[tuple[str, "int | None"], ...]  # (module path, explicit call or None), outer first


def read_chains(graph: "onnx.GraphProto") -> tuple[list[Chain | None], str]:
    """Per node: its chain of enclosing modules (root excluded), and the source.

    The source is ``"dynamo"``, ``"torchscript"`` or ``"none"``. Dynamo
    chains carry no call index (``None``); TorchScript ones do (``relu_1`` is
    call 1).

    Example:
        >>> from onnx import helper
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="/layer1/layer1.0/relu_1/Relu"),
        ...                        helper.make_node("Relu", ["y"], ["z"], name="/layer1/layer1.0/relu/Relu")], "g", [], [])
        >>> read_chains(g)
        ([(('layer1', 0), ('layer1.0', 0), ('layer1.0.relu', 1)), (('layer1', 0), ('layer1.0', 0), ('layer1.0.relu', 0))], 'torchscript')
    """
    dynamo = [_dynamo_scopes(n) for n in graph.node]
    if any(s is not None for s in dynamo):
        return [None if s is None else tuple((p, None) for p in s) for s in dynamo], "dynamo"
    parts = [_torchscript_parts(n.name) for n in graph.node]
    if any(p for p in parts):
        return _torchscript_chains(parts), "torchscript"
    return [None] * len(graph.node), "none"


def _dynamo_scopes(node: "onnx.NodeProto") -> list[str] | None:
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
    if not name.startswith("/"):
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
