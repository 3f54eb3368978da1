"""``compare --node-data``: per-node values for Google's Model Explorer.

Model Explorer (``ai-edge-model-explorer``) overlays "node data" on a graph: a
JSON ``GraphNodeData`` (``{"name", "results": {node id: {"value", "bgColor"}},
...}``, see ``model_explorer.node_data_builder``). Its ONNX adapter uses the
ONNX node names as node ids, so the keys here are the file's node names. For a
program a runtime reads (a LiteRT ``.tflite``: its TFLite adapter's ids are the
ops' indices), the caller hands in the program's nodes as that adapter keys
them, each with the tensors it writes and its module call.

Three overlays are written, because one overlay holds one value per node:
``FILE.json`` the relative error (numeric; coloured by status), and beside
it ``FILE.status.json`` (pass / FAIL / absorbed ...) and ``FILE.module.json``
(the PyTorch module call the node belongs to). Never imports torch.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..files.writes import atomic_write_bytes, check_output_path
from ..onnxfile.modelfile import model_file
from ..onnxfile.scopemap import GraphFacts, ScopeMap
from ..text import field

if TYPE_CHECKING:  # pragma: no cover
    from ..onnxfile.modelfile import ModelFile

STATUS_COLORS = {"pass": "#b9e4c5", "FAIL": "#f2a7a7", "first": "#c0262d", "absorbed": "#e3e5ea",
                 "no counterpart": "#f4f5f7"}
NON_FINITE = 1e30  # JSON has no NaN/inf; a non-finite error is written as this value (and coloured FAIL)
SUFFIXES = (".json",)


def sibling_paths(path: str | os.PathLike) -> dict[str, Path]:
    """The three files ``--node-data FILE.json`` writes.

    Example:
        >>> {k: p.name for k, p in sibling_paths("out/err.json").items()}
        {'error': 'err.json', 'status': 'err.status.json', 'module': 'err.module.json'}
    """
    p = Path(path)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return {"error": p, "status": p.with_name(f"{stem}.status.json"), "module": p.with_name(f"{stem}.module.json")}


def check_node_data_path(path: str | os.PathLike, *, inputs: tuple = ()) -> dict[str, Path]:
    """Refuse unwritable or clashing node-data paths before any work."""
    paths = sibling_paths(path)
    for p in paths.values():
        check_output_path(p, inputs=inputs, suffixes=SUFFIXES)
    return paths


def node_data(report: Any, onnx_path: str | os.PathLike | ModelFile, nodes: Sequence[Any] | None = None
              ) -> dict[str, dict]:
    """The three ``GraphNodeData`` overlays (``error``, ``status``, ``module``) as dicts.

    Each node gets the row of the tensor it produces when that tensor was
    compared, else the row of the module call it belongs to (or of the
    nearest enclosing module that ran once). Only nodes of a compared call
    carry its values: nodes that compute weights (a TorchScript ``Identity``
    copying a shared weight, a quantised weight's ``DequantizeLinear``) get
    nothing, and nodes of the model's own code outside every module call only
    their module, ``(root)``, never the model output's error. ``nodes``: a program's
    nodes (each with ``id``, ``outputs``, ``module`` and ``call``; a runtime plug-in's
    ``explorer_nodes``) in place of the ONNX file's.

    Example:
        >>> import onnx, tempfile, os
        >>> from onnx import helper, TensorProto
        >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu_node")], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx"); onnx.save(helper.make_model(g), path)
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> r = CompareReport([CompareRow("act", "act", 0, "ReLU", [1], 0.5, 0.5, "FAIL", False, onnx=["y"])])
        >>> data = node_data(r, path)
        >>> data["error"]["results"], data["module"]["results"]["relu_node"]["value"]
        ({'relu_node': {'value': 0.5, 'bgColor': '#c0262d', 'textColor': '#ffffff'}}, 'act')
    """
    rows_of = _node_rows(report, onnx_path) if nodes is None else _program_node_rows(report, nodes)
    first = next((r for r in report.rows if field(r, "ok") is False), None)
    error: dict[str, dict] = {}
    status: dict[str, dict] = {}
    module: dict[str, dict] = {}
    for node, row in rows_of.items():
        if row is None:  # the model's own code between modules: no compared call's values
            module[node] = _result("(root)", None)
            continue
        st = field(row, "status", "-")
        key = "first" if row is first else st
        color = STATUS_COLORS.get(key)
        rel = field(row, "rel_err")
        if rel is not None:
            value = float(rel) if math.isfinite(rel) else NON_FINITE
            error[node] = _result(value, color, white_text=row is first)
        status[node] = _result("FAIL (first divergence)" if row is first else st, color, white_text=row is first)
        module[node] = _result(field(row, "name", "?") if field(row, "path") else "(root)", None)
    return {
        "error": _graph_node_data("layertap rel_err", error),
        "status": _graph_node_data("layertap status", status, labels=True),
        "module": _graph_node_data("layertap module", module, labels=True),
    }


def _graph_node_data(name: str, results: dict, labels: bool = False) -> dict:
    """Every field of ``GraphNodeData``, in its order, as its ``to_json_string`` writes them."""
    return {
        "results": results, "name": name, "thresholds": [], "gradient": [],
        "hideInAggregatedStatsTable": False, "hideInChildrenStatsTable": False,
        # label counts per group ("3 FAIL, 5 pass") only work for text values
        "showExpandedSummaryOnGroupNode": labels, "showLabelCountColumnsInChildrenStatsTable": labels,
    }


def _result(value: Any, color: str | None, white_text: bool = False) -> dict:
    out: dict[str, Any] = {"value": value}
    if color:
        out["bgColor"] = color
        if white_text:
            out["textColor"] = "#ffffff"
    return out


def _rows_by_tensor(rows: Any) -> dict[str, Any]:
    """Tensor name -> the row that compared it; a tensor several module calls share (a block's last ReLU) goes
    to the innermost."""
    by_tensor: dict[str, Any] = {}
    for r in rows:
        for t in field(r, "onnx") or []:
            if t not in by_tensor or len(field(r, "path") or "") > len(field(by_tensor[t], "path") or ""):
                by_tensor[t] = r
    return by_tensor


def _program_node_rows(report: Any, nodes: Sequence[Any]) -> dict[str, Any]:
    """A program's node id -> the row of the tensor it writes, else of its module call (or the nearest enclosing
    module that ran once); ``None``: in no module call."""
    by_tensor = _rows_by_tensor(report.rows)
    by_call = {(field(r, "path"), field(r, "call")): r for r in report.rows}
    single = _single_call_rows(report.rows)
    out: dict[str, Any] = {}
    for node in nodes:
        row = next((by_tensor[t] for t in node.outputs if t in by_tensor), None)
        if row is None and node.module is not None:
            row = _enclosing_row((node.module, node.call or 0), by_call, single)
        out[node.id] = row
    return out


def _node_rows(report: Any, onnx_path: str | os.PathLike | ModelFile) -> dict[str, Any]:
    """ONNX node name -> the compare row that describes it (``None``: in no module call's scope)."""
    model = model_file(onnx_path).model
    graph = model.graph
    by_tensor = _rows_by_tensor(report.rows)
    by_call = {(field(r, "path"), field(r, "call")): r for r in report.rows}
    single = _single_call_rows(report.rows)
    owners = _owners(model, getattr(report, "scope_map", None)) if by_call else {}
    weights = GraphFacts(graph).weight_nodes
    out: dict[str, Any] = {}
    for k, node in enumerate(graph.node):
        if not node.name or k in weights:
            continue  # Model Explorer invents ids for unnamed nodes; nothing stable to key by
        row = next((by_tensor[t] for t in node.output if t in by_tensor), None)
        if row is None and k in owners:
            row = _enclosing_row(owners[k], by_call, single)
        out[node.name] = row
    return out


def _owners(model: Any, smap: Any) -> dict[int, tuple[str, int]]:
    """Node index -> (module, call) that owns it. ``smap``: the ScopeMap the comparison read of this
    file (a report carries it), used when it knows every node of the file by name; else the file's
    scopes are read here. Matched by node name: that map may count nodes in a view with ``If``
    branches inlined, and the overlays are keyed by node name anyway."""
    names = [n.name for n in model.graph.node]
    if smap is None or not set(names) <= {n.name for n in smap.graph.node}:
        smap = ScopeMap.from_model(model)  # a fused decoder's is read on a copy with more nodes: by name too
    by_name = {smap.graph.node[i].name: owner for i, owner in smap.owners().items()}
    return {k: by_name[name] for k, name in enumerate(names) if name in by_name}


def _single_call_rows(rows: Any) -> dict[str, Any]:
    """Module path -> its row, for modules that ran exactly once."""
    seen: dict[str, list[Any]] = {}
    for r in rows:
        seen.setdefault(field(r, "path"), []).append(r)
    return {p: rs[0] for p, rs in seen.items() if len(rs) == 1}


def _enclosing_row(owner: tuple[str, int], by_call: dict, single: dict) -> Any:
    """The row of the owning call when it has a value, else of the nearest enclosing module
    that ran once (never the root: it encloses everything, so its output error says nothing
    of this node)."""
    row = by_call.get(owner)
    if row is not None and field(row, "rel_err") is not None:
        return row
    parts = owner[0].split(".")
    for i in range(len(parts) - 1, 0, -1):
        anc = single.get(".".join(parts[:i]))
        if anc is not None and field(anc, "rel_err") is not None:
            return anc
    return row


def write_node_data(report: Any, onnx_path: str | os.PathLike | ModelFile, path: str | os.PathLike,
                    nodes: Sequence[Any] | None = None) -> list[Path]:
    """Write the three overlays atomically (``onnx_path`` may be the file already read; ``nodes``: a program's, as
    :func:`node_data` takes them); returns the paths written."""
    paths = check_node_data_path(path, inputs=(getattr(onnx_path, "path", onnx_path),))
    data = node_data(report, onnx_path, nodes)
    for kind, p in paths.items():
        atomic_write_bytes(p, (json.dumps(data[kind], indent=1) + "\n").encode("utf-8"))
    return list(paths.values())
