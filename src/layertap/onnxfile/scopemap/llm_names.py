"""Fused LLM graphs (ONNX Runtime GenAI's model builder, ORT contrib ops) under PyTorch module paths.

The builder names nodes after the Hugging Face modules, with its own spelling:
``/model/layers.0/attn/qkv_proj/MatMul_Q4`` (``self_attn``; one MatMul, or an
int4 ``MatMulNBits``, for the three projections), ``/model/layers.2/final_norm_layernorm``
(``model.norm``), and fused ops that hide two module values in one node:

* ``SkipSimplifiedLayerNormalization`` adds the residual and normalises: its
  output 0 is the norm's value, its output 3 the residual sum. The skip-norm that
  opens layer N+1 (or the final norm) therefore carries decoder layer N's output.
* ``GroupQueryAttention`` reads the packed ``qkv_proj`` output: ``q_proj``,
  ``k_proj`` and ``v_proj`` are slices of it on the last axis (widths from the
  head counts: ``num_heads`` and ``kv_num_heads`` heads of one head size).

:func:`expose_fused_values_in_place` adds the few nodes that make those values tensors
(a ``Slice`` per projection, the final norm's residual output; :func:`with_fused_values`: on a
copy); they feed nothing the file's own outputs depend on. :func:`fused_calls` then maps every node to its
module with the exporter-independent :class:`~layertap.onnxfile.calls.Call` record.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..kvcache import attention_heads
from .calls import Call

if TYPE_CHECKING:  # pragma: no cover
    import onnx

FUSED_OPS = frozenset({"GroupQueryAttention", "SkipSimplifiedLayerNormalization", "MatMulNBits",
                       "SimplifiedLayerNormalization", "MultiHeadAttention", "RotaryEmbedding"})
_LAYER_RE = re.compile(r"^/model/layers\.\d+/")
_FINAL_NORM_RE = re.compile(r"^/model/layers\.\d+/final_norm_layernorm/")
_RENAMES = {"attn": "self_attn"}
_SKIP_NORM = "SkipSimplifiedLayerNormalization"


def is_fused_llm(graph: "onnx.GraphProto") -> bool:
    """Whether a graph is a builder-style fused decoder (``/model/layers.N/...`` names, contrib ops).

    Example:
        >>> from onnx import helper
        >>> n = helper.make_node("SkipSimplifiedLayerNormalization", ["a", "b", "w"], ["y"],
        ...                      name="/model/layers.0/post_attention_layernorm/SkipLayerNorm", domain="com.microsoft")
        >>> is_fused_llm(helper.make_graph([n], "g", [], [])), is_fused_llm(helper.make_graph([], "g", [], []))
        (True, False)
    """
    names = any(_LAYER_RE.match(n.name) for n in graph.node)
    return names and any(n.op_type in FUSED_OPS for n in graph.node)


def module_path(node_name: str) -> str | None:
    """The PyTorch module path a builder node name stands for; ``None`` outside modules.

    Example:
        >>> module_path("/model/layers.0/attn/qkv_proj/MatMul_Q4"), module_path("/model/layers.2/final_norm_layernorm/SkipLayerNorm")
        ('model.layers.0.self_attn.qkv_proj', 'model.norm')
        >>> module_path("/lm_head/MatMul"), module_path("/model/attn_mask_reformat/attn_mask_subgraph/Sub"), module_path("Sub_3")
        ('lm_head', None, None)
    """
    if _FINAL_NORM_RE.match(node_name):
        return "model.norm"
    if not node_name.startswith("/") or "attn_mask_reformat" in node_name or "constant_nodes" in node_name:
        return None
    parts = [_RENAMES.get(p, p) for p in node_name.split("/")[1:-1]]
    return ".".join(parts) or None


def expose_fused_values_in_place(graph: "onnx.GraphProto") -> bool:
    """Edit ``graph`` in place: add the nodes that make the values fused ops hide into tensors (see
    the module text); whether any were added (none when they are there already).

    ``q_proj``/``k_proj``/``v_proj``: a ``Slice`` of each packed ``qkv_proj`` output, placed right
    after it; the last skip-norm: its residual output (output 3). For a graph a caller only reads,
    :func:`with_fused_values` leaves it as it is.
    """
    slices, last = _fused_edits(graph)
    if last is not None:
        while len(last.output) < 3:
            last.output.append("")
        last.output.append(last.name.rsplit("/", 1)[0] + "/output_3")
    if not slices:
        return last is not None
    nodes = []
    for k, node in enumerate(graph.node):
        nodes.append(node)
        nodes.extend(slices.get(k, ()))
    graph.ClearField("node")
    graph.node.extend(nodes)
    return True


def with_fused_values(graph: "onnx.GraphProto") -> "onnx.GraphProto":
    """``graph`` with the values its fused ops hide made tensors: ``graph`` itself when there is
    nothing to add, else a copy (``graph`` is left as it was).

    Example:
        >>> from onnx import helper
        >>> n = helper.make_node("SkipSimplifiedLayerNormalization", ["a", "b", "w"], ["y"],
        ...                      name="/model/layers.2/final_norm_layernorm/SkipLayerNorm", domain="com.microsoft")
        >>> g = helper.make_graph([n], "g", [], [])
        >>> list(with_fused_values(g).node[0].output), list(g.node[0].output)
        (['y', '', '', '/model/layers.2/final_norm_layernorm/output_3'], ['y'])
        >>> exposed = with_fused_values(g)
        >>> with_fused_values(exposed) is exposed
        True
    """
    import onnx

    slices, last = _fused_edits(graph)
    if not slices and last is None:
        return graph
    out = onnx.GraphProto()
    out.CopyFrom(graph)
    expose_fused_values_in_place(out)
    return out


def _fused_edits(graph: "onnx.GraphProto") -> "tuple[dict[int, list[onnx.NodeProto]], onnx.NodeProto | None]":
    """What exposing the fused values adds: ``Slice`` nodes after the node at each index, and the
    last skip-norm that lacks its residual output (``None``: none to add)."""
    slices: dict[int, list[onnx.NodeProto]] = {}
    if not any(n.op_type == "Slice" and n.name.endswith("/q_proj/Slice") for n in graph.node):
        attention = {n.input[0]: n for n in graph.node if n.op_type in ("GroupQueryAttention", "MultiHeadAttention") and n.input}
        for k, node in enumerate(graph.node):
            gqa = attention.get(node.output[0]) if node.output else None
            if gqa is not None and node.name.rsplit("/", 2)[-2] == "qkv_proj":
                widths = _qkv_widths(graph, node, gqa)
                if widths is not None:
                    slices[k] = _slices(node, widths)
    skips = [n for n in graph.node if n.op_type == _SKIP_NORM]
    last = skips[-1] if skips and _FINAL_NORM_RE.match(skips[-1].name) and len(skips[-1].output) < 4 else None
    return slices, last


def _qkv_widths(graph: "onnx.GraphProto", qkv: "onnx.NodeProto", attn: "onnx.NodeProto") -> tuple[int, int] | None:
    """(query width, key/value width) of a packed projection: heads x head size from the attention node."""
    found = attention_heads(graph, attn, qkv)
    if found is None:
        return None
    heads, kv_heads, head = found
    return heads * head, kv_heads * head


def _slices(qkv: "onnx.NodeProto", widths: tuple[int, int]) -> list["onnx.NodeProto"]:
    from onnx import TensorProto
    from onnx import helper as h

    q, kv = widths
    scope = qkv.name.rsplit("/", 2)[0]  # /model/layers.0/attn
    out = []
    for proj, start, end in (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv)):
        base = f"{scope}/{proj}/Slice"
        consts = []
        for what, value in (("starts", start), ("ends", end), ("axes", -1)):
            tensor = h.make_tensor(f"{base}/{what}", TensorProto.INT64, [1], [value])
            consts.append(h.make_node("Constant", [], [f"{base}/{what}/output_0"], name=f"{base}/{what}", value=tensor))
        out.extend(consts)
        out.append(h.make_node("Slice", [qkv.output[0]] + [c.output[0] for c in consts], [f"{base}/output_0"], name=base))
    return out


def fused_calls(graph: "onnx.GraphProto") -> tuple[list[Call], list[str | None]]:
    """One call per module of a fused decoder (after :func:`expose_fused_values_in_place`), and each node's module.

    A module's value is the first output of its last node in graph order (a container's:
    its last child's), except where a fused op holds it: a decoder layer's output is the
    residual output of the next skip-norm, a projection's its ``Slice``.
    """
    node_paths = [module_path(n.name) for n in graph.node]
    members: dict[str, list[int]] = {}
    for i, (node, path) in enumerate(zip(graph.node, node_paths)):
        if path is None or node.op_type == "Constant":
            continue
        parts = path.split(".")
        for k in range(1, len(parts) + 1):
            members.setdefault(".".join(parts[:k]), []).append(i)
    residuals = _layer_outputs(graph, node_paths)
    packed = {p: nodes for p, nodes in members.items() if p.endswith(".qkv_proj")}
    calls = []
    for path, nodes in members.items():
        scope, _, leaf = path.rpartition(".")
        if path in packed and f"{scope}.q_proj" in members:
            continue  # the packed projection is read as its three slices
        if leaf in ("q_proj", "k_proj", "v_proj") and f"{scope}.qkv_proj" in packed:
            nodes = sorted(set(nodes) | set(packed[f"{scope}.qkv_proj"]))  # each slice's local error is the MatMul's
        last = graph.node[nodes[-1]]
        # a decoder layer's value comes out of the next layer's (or the final) norm node, which stays that norm's
        tensor = residuals.get(path, last.output[0] if last.output else "")
        calls.append(Call(path, 0, nodes, tensors=(tensor,) if tensor else ()))
    return calls, node_paths


def skip_norm_inputs(graph: "onnx.GraphProto") -> dict[str, str]:
    """Residual output (3) of each skip-norm -> its norm module: the sum the PyTorch norm takes as input.

    Example:
        >>> from onnx import helper
        >>> n = helper.make_node("SkipSimplifiedLayerNormalization", ["a", "b", "w"], ["y", "", "", "sum"],
        ...                      name="/model/layers.0/post_attention_layernorm/SkipLayerNorm", domain="com.microsoft")
        >>> skip_norm_inputs(helper.make_graph([n], "g", [], []))
        {'sum': 'model.layers.0.post_attention_layernorm'}
    """
    out = {}
    for node in graph.node:
        path = module_path(node.name)
        if node.op_type == _SKIP_NORM and len(node.output) > 3 and node.output[3] and path:
            out[node.output[3]] = path
    return out


def _layer_outputs(graph: "onnx.GraphProto", node_paths: list[str | None]) -> dict[str, str]:
    """Decoder layer path -> the skip-norm residual output that carries that layer's output."""
    out: dict[str, str] = {}
    for node, path in zip(graph.node, node_paths):
        if node.op_type != _SKIP_NORM or len(node.output) < 4 or not node.output[3] or path is None:
            continue
        m = re.match(r"^(?P<stack>.*\.layers)\.(?P<n>\d+)\.", path + ".")
        if path == "model.norm":
            layers = sorted({int(p.split(".")[2]) for p in node_paths if p and p.startswith("model.layers.")})
            if layers:
                out[f"model.layers.{layers[-1]}"] = node.output[3]
        elif m and path.endswith("input_layernorm") and int(m.group("n")) > 0:
            out[f"{m.group('stack')}.{int(m.group('n')) - 1}"] = node.output[3]
    return out

