"""ONNX Runtime's NCHWc layout in saved files, for ``lt.compare``.

ONNX Runtime's default optimisation level (``ORT_ENABLE_ALL``) on x86 rewrites Convs and
pools into kernels of the ``com.microsoft.nchwc`` domain that keep activations in a blocked
layout (``N, C/b, H, W, b``, padded to whole blocks) under new names (``reorder_token_k``);
a file saved from such a session (``optimized_model_filepath``) keeps them. Here: which
reference tensor each blocked tensor stands for, and the layout both ways.

numpy and onnx only (never torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..runtimes.ort_kernels import NCHWC_DOMAIN

if TYPE_CHECKING:  # pragma: no cover
    import onnx


def blocked_stand_ins(graph: "onnx.GraphProto", ref: "onnx.GraphProto") -> dict[str, str]:
    """Reference tensor -> the NCHWc-layout tensor that holds its value in a file ONNX Runtime
    saved at ``ORT_ENABLE_ALL`` (x86): such a node is named after the tensor it replaced
    (``/relu/Relu_output_0_nchwc`` for a Conv+Relu) and writes ``reorder_token_k`` in ORT's
    blocked layout, which :func:`unblock` turns back into NCHW.

    The name is the tensor of the node ORT converted first; what it fused in afterwards is
    followed in the reference: a Conv that took in the residual ``Add`` (its ``Sum`` input)
    holds that Add's output, and a fused ``activation`` the output of the activation after
    it. Where the reference does not read that way, the node stands for nothing.

    Example:
        >>> from onnx import helper
        >>> cand = helper.make_graph([helper.make_node("Conv", ["x", "w", "b", "r"], ["reorder_token_0"],
        ...     name="c_nchwc", domain="com.microsoft.nchwc", activation="Relu")], "g", [], [])
        >>> ref = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        ...     helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], "r", [], [])
        >>> blocked_stand_ins(cand, ref)
        {'y': 'reorder_token_0'}
    """
    import onnx

    made = {t for node in graph.node for t in node.output if t}
    readers: dict[str, list[Any]] = {}
    for node in ref.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)

    def after(tensor: str, op: str) -> str | None:
        """The output of the one ``op`` node that alone reads ``tensor`` in the reference."""
        nodes = readers.get(tensor, [])
        return nodes[0].output[0] if len(nodes) == 1 and nodes[0].op_type == op and nodes[0].output else None

    ref_made = {t: node for node in ref.node for t in node.output if t}
    out: dict[str, str] = {}
    for node in graph.node:
        if node.domain != NCHWC_DOMAIN or not node.name.endswith("_nchwc") or not node.output or not node.output[0]:
            continue
        tensor: str | None = node.name[: -len("_nchwc")]
        if not tensor or tensor not in ref_made:
            continue
        act = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "activation"), None)
        act = act.decode() if isinstance(act, bytes) else act
        if node.op_type == "Conv" and len(node.input) > 3 and node.input[3]:
            tensor = after(tensor, "Add")  # the residual Add fused in: the node holds the sum
            if tensor is not None and act is not None:
                tensor = after(tensor, str(act))
        elif act is not None and ref_made[tensor].op_type != act:
            tensor = after(tensor, str(act))
        if tensor is not None and tensor not in made:
            out[tensor] = node.output[0]
    return out


def blocked_tensors(graph: "onnx.GraphProto") -> set[str]:
    """Tensors a file holds in ORT's NCHWc layout (written by its NCHWc kernels)."""
    return {t for n in graph.node if n.domain == NCHWC_DOMAIN and n.op_type != "ReorderOutput" for t in n.output if t}


def unblock(a: np.ndarray, shape: Sequence[int], block: int) -> np.ndarray:
    """An NCHWc-layout array (``N, ceil(C/b)*b, H, W`` holding blocks of ``b`` channels
    innermost) as the NCHW array of ``shape``; ``a`` unchanged when it cannot be that.

    Example:
        >>> nchw = np.arange(2 * 4 * 3, dtype=np.float32).reshape(1, 4, 2, 3)
        >>> blocked = nchw.reshape(1, 2, 2, 2, 3).transpose(0, 1, 3, 4, 2).reshape(1, 4, 2, 3)
        >>> bool((unblock(blocked, (1, 4, 2, 3), 2) == nchw).all())
        True
    """
    if len(shape) != 4 or a.ndim != 4 or block < 1:
        return a
    n, c, h, w = (int(d) for d in shape)
    padded = -(-c // block) * block
    if a.shape != (n, padded, h, w):
        return a
    out = a.reshape(n, padded // block, h, w, block).transpose(0, 1, 4, 2, 3).reshape(n, padded, h, w)
    return np.ascontiguousarray(out[:, :c])


def block(a: np.ndarray, block: int) -> np.ndarray:
    """An NCHW array in the NCHWc layout (channels zero-padded to whole blocks): the inverse of :func:`unblock`.

    Example:
        >>> nchw = np.arange(1 * 3 * 2 * 2, dtype=np.float32).reshape(1, 3, 2, 2)
        >>> b = block(nchw, 2)
        >>> b.shape, bool((unblock(b, nchw.shape, 2) == nchw).all())
        ((1, 4, 2, 2), True)
    """
    if a.ndim != 4 or block < 1:
        return a
    n, c, h, w = a.shape
    padded = -(-c // block) * block
    if padded != c:
        a = np.concatenate([a, np.zeros((n, padded - c, h, w), a.dtype)], axis=1)
    return np.ascontiguousarray(a.reshape(n, padded // block, block, h, w).transpose(0, 1, 3, 4, 2).reshape(n, padded, h, w))
