"""Graph edits on the exporter's own IR (``onnx_ir``), for both exporters.

A value is an object in onnx-ir: renaming it (``value.name = new``) renames it
everywhere it is used, subgraphs included, and moves an initializer's entry.
The edits give inputs and outputs the names layertap promises, make every
graph output a distinct value, name the batch symbols, and drop the export
wrapper's level from scopes and weight names. None of them touches tensor
data, so the weights stay where they are (torch tensors of a dynamo export,
files on disk of a TorchScript one).
"""

from __future__ import annotations

import ast
import itertools
import re
from typing import TYPE_CHECKING, Any, Sequence

from ..onnxfile.metadata import CLASS_HIERARCHY_KEY, NAME_SCOPES_KEY, NAMESPACE_KEY

if TYPE_CHECKING:  # pragma: no cover
    import onnx_ir as ir


def graph_inputs(graph: ir.Graph) -> list[ir.Value]:
    """The inputs a caller feeds (initializers that older exporters list as inputs excluded)."""
    return [v for v in graph.inputs if not v.is_initializer()]


def _values(graph: ir.Graph) -> dict[str, ir.Value]:
    """Every named value of ``graph`` and its subgraphs."""
    out: dict[str, ir.Value] = {}
    for g in (graph, *graph.subgraphs()):
        out.update((v.name, v) for v in g.inputs if v.name)
        out.update((name, v) for name, v in g.initializers.items())
        for node in g:
            out.update((v.name, v) for v in node.outputs if v.name)
    return out


def _fresh(base: str, taken: set[str] | dict[str, ir.Value]) -> str:
    for k in itertools.count(1):
        cand = f"{base}__{k}"
        if cand not in taken:
            return cand
    raise AssertionError("unreachable")


def name_inputs(graph: ir.Graph, names: Sequence[str]) -> None:
    """Rename the graph inputs (initializers excluded) to ``names``, in order.

    Example:
        >>> import onnx_ir as ir
        >>> x = ir.Value(name="xs_0")
        >>> node = ir.node("Relu", [x], name="relu")
        >>> g = ir.Graph([x], node.outputs, nodes=[node])
        >>> name_inputs(g, ["x"]); g.inputs[0].name
        'x'
    """
    inputs = graph_inputs(graph)
    if len(inputs) != len(names):
        raise ValueError(f"the exported graph has {len(inputs)} inputs, expected {len(names)}")
    taken = _values(graph)
    for v, new in zip(inputs, names):
        if v.name == new:
            continue
        other = taken.get(new)
        if other is not None and other is not v:
            # An intermediate already carries the wanted name: move it aside.
            other.name = _fresh(new, taken)
            taken[other.name] = other
        taken.pop(v.name or "", None)
        v.name = new
        taken[new] = v


def name_outputs(graph: ir.Graph, names: Sequence[str]) -> int:
    """Give the graph outputs ``names`` (in order) and make each a distinct value.

    An output that is a graph input, an initializer, or the same value as an
    earlier output gets an ``Identity`` node of its own (onnx-ir's
    ``OutputFixPass`` rule, extended to initializers): ONNX outputs are
    identified by name, and an output aliasing an input is mis-handled by
    ONNX Runtime (pytorch#167848). Every other output is renamed in place,
    which adds no node and so blocks no ORT fusion.

    Returns:
        The number of ``Identity`` nodes inserted.

    Example:
        >>> import onnx_ir as ir
        >>> x = ir.Value(name="x")
        >>> relu = ir.node("Relu", [x])
        >>> g = ir.Graph([x], [relu.outputs[0], relu.outputs[0], x], nodes=[relu])
        >>> name_outputs(g, ["output", "relu", "x:input"])
        2
        >>> [o.name for o in g.outputs], [n.op_type for n in g]
        (['output', 'relu', 'x:input'], ['Relu', 'Identity', 'Identity'])
    """
    import onnx_ir as ir  # noqa: PLC0415 -- onnx_ir (0.9 s) loads only for a graph edit

    if len(graph.outputs) != len(names):
        raise ValueError(f"the exported graph has {len(graph.outputs)} outputs, expected {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"output names are not unique: {list(names)}")
    sources = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    clash = sources & set(names)
    if clash:
        raise ValueError(f"output name {sorted(clash)[0]!r} is also an input name")
    taken = _values(graph)
    # Values that already carry a wanted name move aside first, so the renames
    # below cannot give two values one name.
    for name in sorted(set(names) & set(taken)):
        v = taken.pop(name)
        v.name = _fresh(name, set(taken) | set(names))
        taken[v.name] = v
    claimed: set[int] = set()
    inserted = 0
    for pos, new in enumerate(names):
        cur = graph.outputs[pos]
        if cur.is_graph_input() or cur.is_initializer() or id(cur) in claimed:
            node = ir.node("Identity", [cur], name=f"layertap_identity_{pos}")
            out = node.outputs[0]
            out.name, out.shape, out.type = new, cur.shape, cur.type
            graph.append(node)
            graph.outputs[pos] = out
            inserted += 1
            cur = out
        else:
            cur.name = new
        claimed.add(id(cur))
    return inserted


def name_batch_symbols(graph: ir.Graph, input_names: Sequence[str]) -> dict[str, str]:
    """Rename the exporter's symbols for each input's first dimension, in every shape.

    One symbol shared by every input becomes ``batch``; otherwise each symbol
    becomes ``batch_<first input that carries it>``. Symbols in expressions
    (``2*s0``) are rewritten too.

    Returns:
        old symbol -> new name.

    Example:
        >>> import onnx_ir as ir
        >>> x = ir.Value(name="x", shape=ir.Shape(["s0", 3]), type=ir.TensorType(ir.DataType.FLOAT))
        >>> cat = ir.node("Concat", [x, x], attributes={"axis": 0})
        >>> cat.outputs[0].shape = ir.Shape(["2*s0", 3])
        >>> g = ir.Graph([x], cat.outputs, nodes=[cat])
        >>> name_batch_symbols(g, ["x"]), str(g.outputs[0].shape)
        ({'s0': 'batch'}, '[2*batch,3]')
    """
    import onnx_ir as ir  # noqa: PLC0415 -- onnx_ir (0.9 s) loads only for a graph edit

    firsts: dict[str, str] = {}
    for v in graph_inputs(graph):
        if v.shape is not None and len(v.shape) and isinstance(v.shape[0], ir.SymbolicDim) and v.shape[0].value:
            firsts.setdefault(v.shape[0].value, v.name or "")
    if not firsts:
        return {}
    if len(firsts) == 1:
        mapping = {next(iter(firsts)): "batch"}
    else:
        mapping = {sym: f"batch_{name}" for sym, name in firsts.items()}
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(s) for s in mapping) + r")(?![\w.])")

    def renamed(d: Any) -> Any:
        if isinstance(d, ir.SymbolicDim) and d.value:
            return ir.SymbolicDim(pattern.sub(lambda m: mapping[m.group(1)], d.value))
        return d

    for g in (graph, *graph.subgraphs()):
        values = [*g.inputs, *g.outputs, *(o for node in g for o in node.outputs)]
        for v in values:
            if v.shape is not None and any(isinstance(d, ir.SymbolicDim) for d in v.shape):
                v.shape = ir.Shape([renamed(d) for d in v.shape])
    return mapping


def strip_wrapper_scope(graph: ir.Graph, prefixes: Sequence[str]) -> int:
    """Make module scopes, node names and weight names read as the user's module paths.

    The exporters see the user's model as a child of the export wrapper, so
    every scope starts with the wrapper's attribute (``model.layer1.0.conv1``,
    ``/model/layer1/layer1.0/conv1/Conv``, ``model.fc.weight``). Without the
    prefix, ``layertap layers``/``add-outputs --module`` and ``compare`` see
    the same paths as ``model.named_modules()``. Exactly one level goes, so
    a module of the user's called ``model`` keeps its name. The graph's
    inputs and outputs are left alone: they already carry their final names
    (:func:`name_inputs`, :func:`name_outputs`). Renames that would clash
    with an existing name are skipped (the name stays as it was).

    Returns:
        The number of nodes whose scope was rewritten.

    Example:
        >>> import onnx_ir as ir
        >>> x = ir.Value(name="x")
        >>> n = ir.node("Relu", [x], name="/model/model/fc/Relu")
        >>> n.outputs[0].name = "/model/model/fc/Relu_output_0"
        >>> tap = ir.node("Relu", n.outputs, name="/model/model/act/Relu")
        >>> tap.outputs[0].name = "model.act"
        >>> g = ir.Graph([x], tap.outputs, nodes=[n, tap])
        >>> strip_wrapper_scope(g, ["model"])
        2
        >>> n.name, n.outputs[0].name, tap.outputs[0].name
        ('/model/fc/Relu', '/model/fc/Relu_output_0', 'model.act')
    """
    changed = 0
    node_names = {n.name for n in graph}
    for node in graph:
        scoped = _strip_dynamo_scopes(node.metadata_props, prefixes)
        new = _strip_path(node.name or "", prefixes, sep="/")
        if new != node.name and new not in node_names:
            node_names.discard(node.name)
            node_names.add(new)
            node.name = new
            scoped = True
        changed += scoped
    values = _values(graph)
    # Inputs and outputs already carry the names layertap gave them: a tap
    # ``model.layers.1.mlp`` of a model with a child ``model`` is the user's path, not the wrapper's.
    given = {v.name for v in (*graph_inputs(graph), *graph.outputs)}
    renames: dict[str, str] = {}
    for name in sorted(values):
        if name in given:
            continue
        new = _strip_path(name, prefixes, sep="/" if name.startswith("/") else ".")
        if new != name and new not in values and new not in renames.values():
            renames[name] = new
    for old, new in renames.items():
        values[old].name = new
    return changed


def shape_of(v: ir.Value) -> list[int | str] | None:
    """Declared shape: ints and symbol names (``?`` for unknown dims)."""
    if v.shape is None:
        return None
    return [d if isinstance(d, int) else (getattr(d, "value", None) or "?") for d in v.shape]


def _strip_path(name: str, prefixes: Sequence[str], sep: str) -> str:
    """``_fn.layer1`` -> ``layer1``, ``/model/fc/Gemm`` -> ``/fc/Gemm`` (``sep`` is ``.`` or ``/``)."""
    lead = sep if sep == "/" else ""
    for p in prefixes:
        head = f"{lead}{p}{sep}"
        if name.startswith(head) and len(name) > len(head):
            return lead + name[len(head):]
    return name


def _strip_dynamo_scopes(props: dict[str, str], prefixes: Sequence[str]) -> bool:
    """Rewrite the dynamo exporter's scope metadata of one node; True if changed.

    ``name_scopes`` is ``['', 'model', 'model.layer1', ..., fx_name]`` and
    ``class_hierarchy`` the matching classes (``TapWrapper`` for ``''``, the
    op last); ``namespace`` joins the pairs as ``path: class``. The model's own
    level (``model``, or ``_fn`` where a wrapper registered the model twice) becomes the root and takes the wrapper's place.
    """
    if NAME_SCOPES_KEY not in props or CLASS_HIERARCHY_KEY not in props:
        return False
    try:
        scopes = ast.literal_eval(props[NAME_SCOPES_KEY])
        classes = ast.literal_eval(props[CLASS_HIERARCHY_KEY])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    if not (isinstance(scopes, list) and isinstance(classes, list) and len(scopes) == len(classes) >= 3):
        return False
    levels = list(zip(scopes, classes))
    if not any(path in prefixes for path, _ in levels[:-1]):
        return False
    if levels[1][0] in prefixes:  # the wrapper's level gives way to the model's
        levels = [("", levels[1][1])] + levels[2:]
    levels = [(_strip_path(path, prefixes, "."), cls) for path, cls in levels[:-1]] + [levels[-1]]
    props[NAME_SCOPES_KEY] = repr([path for path, _ in levels])
    props[CLASS_HIERARCHY_KEY] = repr([cls for _, cls in levels])
    if NAMESPACE_KEY in props:
        props[NAMESPACE_KEY] = "/".join(f"{path}: {cls}" for path, cls in levels)
    return True
