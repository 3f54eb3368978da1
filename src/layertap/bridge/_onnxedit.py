"""Graph edits applied to an exported ModelProto (onnx only, no torch).

The exporters name graph inputs and outputs after FX nodes or TorchScript
values (``linear``, ``4``, ``xs_0_orig``); these helpers give them the names
layertap promises, make every graph output a distinct tensor, name the batch
symbols, and record where each output came from. They never touch tensor
data, so they work on a model loaded with ``load_external_data=False``.
"""

from __future__ import annotations

import ast
import itertools
import re
from typing import Sequence

import onnx
from onnx import helper

from ..onnxfile.metadata import CLASS_HIERARCHY_KEY, NAME_SCOPES_KEY, NAMESPACE_KEY
from ..onnxfile.walk import all_tensors, graph_nodes


def all_value_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name defined or used in ``graph`` and its subgraphs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names |= {o.name for o in graph.output}
    for node in graph_nodes(graph):
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
    return names


def rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename tensor ``old`` to ``new`` wherever it is defined or used.

    Subgraphs (If/Loop bodies) see outer names implicitly, so they are
    rewritten too.

    Example:
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])])
        >>> rename_value(g, "y", "out")
        >>> g.node[0].output[0], g.output[0].name
        ('out', 'out')
    """
    for vi in itertools.chain(graph.input, graph.output, graph.value_info):
        if vi.name == old:
            vi.name = new
    for init in graph.initializer:
        if init.name == old:
            init.name = new
    for node in graph_nodes(graph):
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new


def name_inputs(graph: onnx.GraphProto, names: Sequence[str]) -> None:
    """Rename the graph inputs (initializers excluded) to ``names``, in order."""
    inputs = graph_inputs(graph)
    if len(inputs) != len(names):
        raise ValueError(f"the exported graph has {len(inputs)} inputs, expected {len(names)}")
    taken = all_value_names(graph)
    for vi, new in zip(inputs, names):
        if vi.name == new:
            continue
        if new in taken:
            # An intermediate already carries the wanted name: move it aside.
            rename_value(graph, new, _fresh(new, taken))
        old = vi.name
        rename_value(graph, old, new)
        taken.add(new)


def name_outputs(graph: onnx.GraphProto, names: Sequence[str]) -> int:
    """Give the graph outputs ``names`` (in order) and make each a distinct tensor.

    An output that is a graph input, an initializer, or the same tensor as an
    earlier output gets an ``Identity`` node of its own: ONNX outputs are
    identified by tensor name, so two outputs sharing a tensor cannot both
    carry their own name, and an output aliasing an input is mis-handled by
    ONNX Runtime (pytorch#167848). Every other output is renamed in place,
    which adds no node and so blocks no ORT fusion.

    Returns:
        The number of ``Identity`` nodes inserted.

    Example:
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", 1, [2])],
        ...     [helper.make_tensor_value_info(n, 1, [2]) for n in ("y", "y", "x")])
        >>> name_outputs(g, ["output", "relu", "x:input"])
        2
        >>> [o.name for o in g.output], [n.op_type for n in g.node]
        (['output', 'relu', 'x:input'], ['Relu', 'Identity', 'Identity'])
    """
    if len(graph.output) != len(names):
        raise ValueError(f"the exported graph has {len(graph.output)} outputs, expected {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"output names are not unique: {list(names)}")
    sources = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    clash = sources & set(names)
    if clash:
        raise ValueError(f"output name {sorted(clash)[0]!r} is also an input name")
    taken = all_value_names(graph)
    # Intermediates that already carry a wanted name move aside first, so the
    # renames below cannot merge two tensors.
    for name in sorted(set(names) & taken):
        rename_value(graph, name, _fresh(name, taken | set(names)))
        taken = all_value_names(graph)
    claimed: set[str] = set()
    inserted = 0
    for pos, new in enumerate(names):
        cur = graph.output[pos].name
        if cur in sources or cur in claimed:
            graph.node.append(helper.make_node("Identity", [cur], [new], name=f"layertap_identity_{pos}"))
            graph.output[pos].name = new
            inserted += 1
        elif cur != new:
            # Later outputs naming the same tensor follow the rename and then
            # find it claimed, so they get their Identity.
            rename_value(graph, cur, new)
        claimed.add(new)
    return inserted


def name_batch_symbols(model: onnx.ModelProto, input_names: Sequence[str]) -> dict[str, str]:
    """Rename the exporter's symbols for each input's first dimension.

    One symbol shared by every input becomes ``batch``; otherwise each symbol
    becomes ``batch_<first input that carries it>``. Symbols in expressions
    (``2*s0``) are rewritten too.

    Returns:
        old symbol -> new name.
    """
    graph = model.graph
    firsts: dict[str, str] = {}
    for vi in graph_inputs(graph):
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].dim_param and dims[0].dim_param not in firsts:
            firsts[dims[0].dim_param] = vi.name
    if not firsts:
        return {}
    if len(firsts) == 1:
        mapping = {next(iter(firsts)): "batch"}
    else:
        mapping = {sym: f"batch_{name}" for sym, name in firsts.items()}
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(s) for s in mapping) + r")(?![\w.])")
    for vi in itertools.chain(graph.input, graph.output, graph.value_info):
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_param = pattern.sub(lambda m: mapping[m.group(1)], d.dim_param)
    return mapping


def strip_wrapper_scope(graph: onnx.GraphProto, prefixes: Sequence[str]) -> int:
    """Make module scopes, node names and weight names read as the user's module paths.

    The exporters see the user's model as a child of the export wrapper, so
    every scope starts with the wrapper's attribute (``_fn.layer1.0.conv1``,
    ``/model/layer1/layer1.0/conv1/Conv``, ``model.fc.weight``). Without the
    prefix, ``layertap layers``/``add-outputs --module`` and ``compare`` see
    the same paths as ``model.named_modules()``. Renames that would clash
    with an existing name are skipped (the name stays as it was).

    Returns:
        The number of nodes whose scope was rewritten.

    Example:
        >>> n = helper.make_node("Relu", ["x"], ["/model/fc/Relu_output_0"], name="/model/fc/Relu")
        >>> g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", 1, [2])],
        ...                       [helper.make_tensor_value_info("/model/fc/Relu_output_0", 1, [2])])
        >>> strip_wrapper_scope(g, ["model"])
        1
        >>> g.node[0].name, g.node[0].output[0]
        ('/fc/Relu', '/fc/Relu_output_0')
    """
    changed = 0
    node_names = {n.name for n in graph.node}
    for node in graph.node:
        scoped = _strip_dynamo_scopes(node, prefixes)
        new = _strip_path(node.name, prefixes, sep="/")
        if new != node.name and new not in node_names:
            node_names.discard(node.name)
            node_names.add(new)
            node.name = new
            scoped = True
        changed += scoped
    taken = all_value_names(graph)
    mapping: dict[str, str] = {}
    for name in sorted(taken):
        new = _strip_path(name, prefixes, sep="/" if name.startswith("/") else ".")
        if new != name and new not in taken and new not in mapping.values():
            mapping[name] = new
    rename_values(graph, mapping)
    return changed


def rename_values(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """:func:`rename_value` for many names in one pass over the graph."""
    if not mapping:
        return
    for vi in itertools.chain(graph.input, graph.output, graph.value_info):
        vi.name = mapping.get(vi.name, vi.name)
    for init in graph.initializer:
        init.name = mapping.get(init.name, init.name)
    for node in graph_nodes(graph):
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: graph inputs that are not initializers.

    (Older exporters list every initializer as a graph input too.)
    """
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def shape_of(vi: onnx.ValueInfoProto) -> list[int | str] | None:
    """Declared shape: ints and symbol names (``?`` for unknown dims)."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]


def external_locations(model: onnx.ModelProto) -> set[str]:
    """File names that initializers keep their data in (external data)."""
    found: set[str] = set()
    for t in all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in t.external_data if e.key == "location")
    return found


# -- internals ---------------------------------------------------------------


def _strip_path(name: str, prefixes: Sequence[str], sep: str) -> str:
    """``_fn.layer1`` -> ``layer1``, ``/model/fc/Gemm`` -> ``/fc/Gemm`` (``sep`` is ``.`` or ``/``)."""
    lead = sep if sep == "/" else ""
    for p in prefixes:
        head = f"{lead}{p}{sep}"
        if name.startswith(head) and len(name) > len(head):
            return lead + name[len(head):]
    return name


def _strip_dynamo_scopes(node: onnx.NodeProto, prefixes: Sequence[str]) -> bool:
    """Rewrite the dynamo exporter's scope metadata of one node; True if changed.

    ``name_scopes`` is ``['', '_fn', '_fn.layer1', ..., fx_name]`` and
    ``class_hierarchy`` the matching classes (``TapWrapper`` for ``''``, the
    op last); ``namespace`` joins the pairs as ``path: class``. The model's own
    level (``_fn``) becomes the root and takes the wrapper's place.
    """
    props = {p.key: p for p in node.metadata_props}
    if NAME_SCOPES_KEY not in props or CLASS_HIERARCHY_KEY not in props:
        return False
    try:
        scopes = ast.literal_eval(props[NAME_SCOPES_KEY].value)
        classes = ast.literal_eval(props[CLASS_HIERARCHY_KEY].value)
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
    props[NAME_SCOPES_KEY].value = repr([path for path, _ in levels])
    props[CLASS_HIERARCHY_KEY].value = repr([cls for _, cls in levels])
    if NAMESPACE_KEY in props:
        props[NAMESPACE_KEY].value = "/".join(f"{path}: {cls}" for path, cls in levels)
    return True


def _fresh(base: str, taken: set[str]) -> str:
    for k in itertools.count(1):
        cand = f"{base}__{k}"
        if cand not in taken:
            return cand
    raise AssertionError("unreachable")
