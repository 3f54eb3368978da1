"""``lt.onnx_layers``: every tensor of an ONNX file with its op, type and module."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..tables import Column, Table
from ..text import fmt_shape
from .branches import has_subgraphs, subgraph_types
from .modelfile import ModelFile, model_file
from .scopemap import ScopeMap, expose_fused_values_in_place, is_fused_llm
from .shapes import declared_dims
from .tensor_types import TensorTyper, tensor_types

if TYPE_CHECKING:  # pragma: no cover
    import onnx


@dataclass(frozen=True)
class TensorRow:
    """One tensor: graph input or node output."""

    name: str
    op: str             # producing op type, "input" for graph inputs
    node: str | None    # producing node name
    dtype: str | None
    shape: list[Any] | None  # ints and symbolic dim names; None when unknown
    module: str | None  # PyTorch module path whose value this is (None: root or unknown)
    call: int | None    # call index of that module
    graph: str | None = None  # the subgraph computing it (``then_branch of If 'pick'``); None: the main graph


class OnnxLayers(Table):
    """Tensors of an ONNX file, graph order.

    ``source`` says where module paths came from: ``dynamo``, ``torchscript``
    or ``none``.

    Example:
        >>> import tempfile, layertap as lt
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> table = lt.onnx_layers(write_tiny_model(tempfile.mkdtemp()))
        >>> isinstance(table, lt.OnnxLayers), table.source, [r.module for r in table.rows]
        (True, 'torchscript', [None, 'act', 'neg'])
    """

    title = "ONNX tensors"
    report_kind = "onnx_layers"
    columns = [
        Column("name", "Tensor", name=True),
        Column("op", "Op"),
        Column("module", "Module", name=True),
        Column("call", "Call", justify="right", drop=1),
        Column("dtype", "Dtype", drop=2),
        Column("shape", "Shape", fmt=fmt_shape),
        Column("graph", "Subgraph", drop=3),
    ]

    def __init__(self, rows=(), notes=(), source: str = "none") -> None:
        super().__init__(rows, notes)
        self.source = source

    def summary(self) -> dict[str, Any]:
        out = {"source": self.source}
        out.update(super().summary())
        return out


def onnx_layers(path: "str | os.PathLike | ModelFile", *, typer: TensorTyper | None) -> OnnxLayers:
    """List the tensors of an ONNX file (weights are not read), or of a file already read (an
    OpenVINO IR's tensors as :func:`~layertap.runtimes.openvino.ir_file` reads them; left as it
    was). ``typer`` types what shape inference leaves open (``lt.onnx_layers``:
    :func:`layertap.runtimes.onnx_layers` hands in ONNX Runtime).

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> path = str(write_tiny_model(tempfile.mkdtemp()))  # y = -relu(x); modules act, neg
        >>> [(r.name, r.op, r.module) for r in onnx_layers(path, typer=None)]
        [('x', 'input', None), ('/act/Relu_output_0', 'Relu', 'act'), ('y', 'Neg', 'neg')]
    """
    mf = model_file(path)
    types = tensor_types(mf.model, mf.folder, typer=typer)  # the typing add_outputs uses (ORT for fused ops)
    model = _with_fused_values(mf.model)
    graph = model.graph
    scopes = ScopeMap.from_model(model)
    owners = scopes.owners()
    inits = {i.name for i in graph.initializer}
    rows = [
        TensorRow(i.name, "input", None, *_type_of(types.get(i.name)), None, None)
        for i in graph.input if i.name not in inits
    ]
    sub_types = subgraph_types(model) if has_subgraphs(graph) else {}
    inner = _branch_owners(model) if sub_types else {}
    for k, node in enumerate(graph.node):
        rows.extend(_branch_rows(node, (k,), sub_types, inner))
        module, call = owners.get(k, (None, None))
        for t in node.output:
            if t:
                owner = (module or None, call if module else None)
                rows.append(TensorRow(t, node.op_type, node.name or None, *_type_of(types.get(t)), *owner))
    notes = []
    if scopes.source == "none":
        notes.append("no module scopes in this file (neither torch.onnx dynamo metadata nor TorchScript node names)")
    if inits:
        notes.append(f"{len(inits)} initializers (weights) not listed")
    return OnnxLayers(rows, notes, source=scopes.source)


def _with_fused_values(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """``model``, or for a fused decoder a copy with the values its ops hide made tensors: listed as
    the tensors its module taps read (:func:`~layertap.onnxfile.scopemap.expose_fused_values_in_place`)."""
    import onnx

    if not is_fused_llm(model.graph):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out if expose_fused_values_in_place(out.graph) else model


def _branch_owners(model: "onnx.ModelProto") -> dict[str, tuple[str, int]]:
    """Module and call of each tensor of the subgraphs, read with them inlined (``ScopeMap(branches=True)``)."""
    smap = ScopeMap.from_model(model, branches=True)
    owners = smap.owners()
    return {t: owners[k] for k, n in enumerate(smap.graph.node) if k in owners and owners[k][0] for t in n.output if t}


def _branch_rows(node: "onnx.NodeProto", at: tuple, sub_types: dict, owners: dict) -> list[TensorRow]:
    """Rows of the tensors inside ``node``'s subgraphs (at any depth), before the node's own
    outputs; ``at``: the path of ``node``'s graph, then ``node``'s index in it."""
    rows: list[TensorRow] = []
    for attr in node.attribute:
        if not attr.HasField("g"):
            continue
        path = (*at[:-1], (at[-1], attr.name))
        where = f"{attr.name} of {node.op_type} {node.name or '(unnamed)'!r}"
        types = sub_types.get(path, {})
        for k, inner in enumerate(attr.g.node):
            rows.extend(_branch_rows(inner, (*path, k), sub_types, owners))
            for t in inner.output:
                if t:
                    module, call = owners.get(t, (None, None))
                    rows.append(TensorRow(t, inner.op_type, inner.name or None, *_type_of(types.get(t)), module, call, where))
    return rows


def _type_of(vi) -> tuple[str | None, list[Any] | None]:
    """dtype and shape of a value info; a sequence shows as ``sequence(float32)`` with its elements' shape."""
    if vi is None:
        return None, None
    if vi.type.WhichOneof("value") == "sequence_type" and vi.type.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
        import onnx

        inner = onnx.ValueInfoProto()
        inner.type.CopyFrom(vi.type.sequence_type.elem_type)
        dtype, shape = _type_of(inner)
        return f"sequence({dtype or '?'})", shape
    if vi.type.WhichOneof("value") != "tensor_type":
        return None, None
    import onnx

    tt = vi.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else None
    dims = declared_dims(vi)
    return dtype, None if dims is None else [d if isinstance(d, int) else (d or "?") for d in dims]
