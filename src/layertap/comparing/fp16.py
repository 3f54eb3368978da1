"""``--fp16-block-list``: the ONNX nodes a float16 conversion should keep in float32.

From a comparison's rows: every compared call whose reference values leave the float16
range (``|x| > 65504``) or whose float16 values are not finite, and the first diverging
call. Each contributes the candidate's nodes of that call (its module scope, or the node
that makes its tensor when rows are tensor names) and the nodes that read its output,
so the values are never cast to float16 in between. The list is what
``onnxconverter_common.float16.convert_float_to_float16(node_block_list=...)`` takes:
converter node names are kept from the float32 file, so the candidate's names are the
float32 file's names. Never imports torch.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from ..files.writes import atomic_write_bytes

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.modelfile import ModelFile

FP16_MAX = 65504.0
_CONVERTER_OPS = {"Cast"}  # nodes the float16 converter adds; they are not in the float32 file


def needs_float32(row: Any) -> bool:
    """A compared row whose values do not fit float16.

    Example:
        >>> from types import SimpleNamespace as R
        >>> needs_float32(R(ok=False, finite=False, ref_max=10.0)), needs_float32(R(ok=True, finite=True, ref_max=9e4))
        (True, True)
    """
    return row.ok is not None and (row.finite is False or (row.ref_max or 0.0) > FP16_MAX)


def block_list(report: Any, cand: "onnx.ModelProto") -> list[str]:
    """Node names of ``cand`` to keep in float32, in graph order (see module doc)."""
    from ..onnxfile.scopes import ScopeMap

    rows = [r for r in report.rows if r.path and needs_float32(r)]
    first = report.first_divergence_row
    if first is not None and first.path and first not in rows:
        rows.append(first)
    graph = cand.graph
    smap = ScopeMap.from_model(cand)
    wanted = {(r.path, r.call) for r in rows}
    tensors = {t for r in rows for t in r.onnx}
    picked: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.op_type in _CONVERTER_OPS:
            continue
        if set(node.output) & tensors or set(node.input) & tensors:
            picked.add(i)
        elif smap.source != "none" and any(c in wanted for c in smap.calls_of_node(i)):
            picked.add(i)
    return [graph.node[i].name for i in sorted(picked) if graph.node[i].name]


def write_block_list(report: Any, ref: str | os.PathLike | None, cand: str | os.PathLike | ModelFile,
                     out: str | os.PathLike) -> list[str]:
    """Write :func:`block_list` of the candidate file (a path, or the file already read) as a JSON list,
    atomically; returns it."""
    from ..onnxfile.modelfile import model_file

    names = block_list(report, model_file(cand).model)
    atomic_write_bytes(out, (json.dumps(names, indent=1) + "\n").encode())
    return names
