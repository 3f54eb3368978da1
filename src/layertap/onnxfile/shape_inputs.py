"""Inputs that shape inference reads: values that decide a shape, not values computed on.

ONNX Runtime infers each node's output shape when it loads a model, and for some ops that needs an
input's *data*: a ``Resize``'s ``scales``, a ``Reshape``'s ``shape``, a ``Slice``'s ``starts``... It
reads that data only from a constant it can see inline: an initializer held elsewhere (layertap's
weights held in memory, :mod:`.held`) makes the load fail ("Cannot parse data from external
tensors"), and a ``Cast`` pair placed on it (the ideal run's rounding, :mod:`.rounded`) hides the
constant. So every copy of a graph layertap builds leaves these tensors where they are and as they
are: inline, never rounded (they are parameters of the shape, which no converter computes in a lower
precision). Reads structure only; never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from .walk import model_nodes

if TYPE_CHECKING:  # pragma: no cover
    import onnx

#: op type -> the positions of the inputs whose data ONNX shape inference reads (default domain)
SHAPE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Resize": (1, 2, 3), "Upsample": (1,),
    "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "TopK": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "OneHot": (1,), "CenterCropPad": (1, 2),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (2, 3), "MaxUnpool": (2,),
}


def shape_read_tensors(model: "onnx.ModelProto") -> set[str]:
    """The tensors some node of ``model`` (subgraphs too) reads at a position whose data shape inference
    needs (:data:`SHAPE_INPUTS`).

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Resize", ["x", "", "scales"], ["y"]), h.make_node("Reshape", ["y", "s"], ["z"])],
        ...                  "g", [], [])
        >>> sorted(shape_read_tensors(h.make_model(g)))
        ['s', 'scales']
    """
    out: set[str] = set()
    for node in model_nodes(model):
        if node.domain not in ("", "ai.onnx"):
            continue
        for k in SHAPE_INPUTS.get(node.op_type, ()):
            if k < len(node.input) and node.input[k]:
                out.add(node.input[k])
    return out
