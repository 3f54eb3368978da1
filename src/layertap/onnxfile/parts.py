"""The nodes of a module call as a graph of their own: one mechanism for every part.

:class:`PartCutter` copies some nodes of a model into a new graph whose inputs are the
tensors they read from outside and whose outputs are the tensors asked for; the weights
they read (initializers, and the nodes that compute weight-derived tensors such as a
shared weight's ``Identity``) come along by name. ``compare --local`` runs many such
pieces in one graph (each renamed under a prefix); ``repro`` writes one to a file with
:func:`save_part` (onnx-ir), where a big weight stays external data next to the part, read
from the source file's data (never the whole model loaded, never inlined).

Reads only the graph structure; never imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .scopemap import GraphFacts

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: an initializer of at least this many bytes is written as external data next to a part
EXTERNAL_THRESHOLD = 1024


@dataclass
class Piece:
    """Nodes of one call, copied and renamed, with their graph inputs and outputs.

    ``names``: original tensor name -> its name in the part (inputs and outputs).
    """

    nodes: list[Any]
    inputs: list[Any]
    outputs: list[Any]
    names: dict[str, str] = field(default_factory=dict)
    reads: list[int] = field(default_factory=list)  # source node indices copied


class PartCutter:
    """Cuts parts out of one model (see the module doc).

    Example:
        >>> import numpy as np, onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.full((2, 2), 2, np.float32), "w")
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("MatMul", ["r", "w"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [1, 2])], [h.make_tensor_value_info("y", 1, [1, 2])], [w])
        >>> cut = PartCutter(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
        >>> piece = cut.piece([1], {"r": (1, [1, 2])}, ["y"])
        >>> part = cut.model([piece])
        >>> [i.name for i in part.graph.input], [t.name for t in part.graph.initializer], [n.op_type for n in part.graph.node]
        (['r'], ['w'], ['MatMul'])
    """

    def __init__(self, model: "onnx.ModelProto", facts: GraphFacts | None = None) -> None:
        self.source = model
        self.graph = model.graph
        self.facts = facts if facts is not None else GraphFacts(model.graph)
        self.producer = {t: i for i, n in enumerate(model.graph.node) for t in n.output if t}
        self.inits = {i.name: i for i in model.graph.initializer}

    def piece(self, nodes: Sequence[int], inputs: Mapping[str, tuple[int, Sequence[int]]], outputs: Sequence[str], *,
              prefix: str = "", rename: Mapping[str, str] | None = None, cast: Mapping[str, int] | None = None) -> Piece:
        """``nodes`` (source indices) fed ``inputs`` (tensor -> (ONNX element type, shape)), answering ``outputs``.

        Every tensor the nodes make and every input is renamed ``prefix + name`` unless
        ``rename`` names it; ``cast``: inputs fed in another type than the nodes read
        (tensor -> the type they read): a ``Cast`` inside the part converts them.
        """
        import onnx

        rename = dict(rename or {})
        names = {t: rename.get(t, prefix + t) for t in inputs}
        for i in nodes:
            names.update({t: rename.get(t, prefix + t) for t in self.graph.node[i].output if t})
        reads = dict(names)
        cast_nodes = []
        for t, to in (cast or {}).items():
            reads[t] = f"{names[t]}/lt_cast"
            cast_nodes.append(onnx.helper.make_node("Cast", [names[t]], [reads[t]], name=f"{names[t]}/lt_cast", to=to))
        copied = []
        for i in nodes:
            node = onnx.NodeProto()
            node.CopyFrom(self.graph.node[i])
            node.name = prefix + node.name if node.name else ""
            node.input[:] = [reads.get(t, t) for t in node.input]
            node.output[:] = [names.get(t, t) for t in node.output]
            copied.append(node)
        ins = [onnx.helper.make_tensor_value_info(names[t], elem, list(shape)) for t, (elem, shape) in inputs.items()]
        outs = [onnx.helper.make_empty_tensor_value_info(names[t]) for t in outputs if t in names and t not in inputs]
        return Piece(cast_nodes + copied, ins, outs, {t: names[t] for t in [*inputs, *outputs] if t in names}, list(nodes))

    def model(self, pieces: Sequence[Piece], name: str = "layertap_part") -> "onnx.ModelProto":
        """One model running every piece, with the weights (and weight nodes) they read."""
        import onnx

        weight_nodes = [self.graph.node[i] for i in sorted(self.weight_nodes([i for p in pieces for i in p.reads]))]
        nodes = [*weight_nodes, *(n for p in pieces for n in p.nodes)]
        reads = list(dict.fromkeys(t for n in nodes for t in n.input))
        inits = [self.inits[t] for t in reads if t in self.inits]
        graph = onnx.helper.make_graph(nodes, name, [i for p in pieces for i in p.inputs],
                                       [o for p in pieces for o in p.outputs], inits)
        model = onnx.helper.make_model(graph, opset_imports=list(self.source.opset_import))
        model.ir_version = self.source.ir_version
        model.functions.extend(self.source.functions)
        return model

    def weight_nodes(self, nodes: Sequence[int]) -> set[int]:
        """Nodes outside ``nodes`` that compute weight-derived tensors they read (shared weights, constants)."""
        inside = set(nodes)
        out: set[int] = set()
        todo = [t for i in nodes for t in self.graph.node[i].input if t in self.facts.weights and t not in self.inits]
        while todo:
            t = todo.pop()
            i = self.producer.get(t)
            if i is None or i in inside or i in out:
                continue
            out.add(i)
            todo.extend(x for x in self.graph.node[i].input if x and x not in self.inits)
        return out


def save_part(part: "onnx.ModelProto", out: str | os.PathLike, source_folder: str | os.PathLike,
              threshold: int = EXTERNAL_THRESHOLD) -> list[Path]:
    """Write ``part`` to ``out`` with onnx-ir: an initializer of ``threshold`` bytes or more goes to
    ``OUT.data`` next to it (an external one read from the source's data in ``source_folder``, memory
    mapped, only its own bytes). Returns the files written; ``part`` is not changed.

    Example:
        >>> import os, tempfile, numpy as np, onnx, onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.ones((64, 64), np.float32), "w")
        >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [1, 64])], [h.make_tensor_value_info("y", 1, [1, 64])], [w])
        >>> d = tempfile.mkdtemp()
        >>> [p.name for p in save_part(h.make_model(g), os.path.join(d, "part.onnx"), d)]
        ['part.onnx', 'part.onnx.data']
        >>> float(onnx.numpy_helper.to_array(onnx.load(os.path.join(d, "part.onnx")).graph.initializer[0]).sum())
        4096.0
    """
    import onnx_ir as ir

    out = Path(out)
    data = out.with_name(out.name + ".data")
    model = ir.serde.deserialize_model(part)
    ir.external_data.set_base_dir(model.graph, Path(source_folder))
    ir.save(model, out, external_data=data.name, size_threshold_bytes=threshold)
    if data.is_file() and data.stat().st_size == 0:
        data.unlink()
    return [p for p in (out, data) if p.is_file()]
