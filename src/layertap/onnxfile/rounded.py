"""A file's graph with chosen tensors rounded to a number format: the *ideal run* at that format.

``lt.compare`` judges a reduced-precision candidate (a float16 or int8 file, OpenVINO at
bfloat16) against the reference computation with every value the candidate holds in a lower
precision rounded to it, and nothing else changed: what the format costs, without what the
file or the runtime adds. For an ONNX reference that computation is the reference's own graph
with rounding after each such tensor:

* a float16/bfloat16 tensor: ``Cast`` to that type and back to float32;
* a quantised tensor: the quantiser's arithmetic in float32, ``(clip(round(x / s) + z, qmin,
  qmax) - z) * s`` (plain ``Div``/``Round``/``Clip`` nodes, so no runtime fuses them into its
  integer kernels), with the candidate's scale and zero point;
* a weight (initializer): its values rounded once, here, in numpy.

Each rounded tensor keeps its name (the producer's output is renamed), so the ideal run is read
by the reference's tensor names, and every reader (subgraphs too) reads the rounded value. A
tensor that decides a shape (:mod:`.shape_inputs`: a ``Resize``'s scales, a ``Range``'s bounds) is
left as it is and where it is, so the copy loads wherever the file loads. The
input model is never changed: :func:`rounded_model` returns a new graph and its held weights.
Never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from ..numformats import Format
from .held import hold_in_memory
from .shape_inputs import shape_read_tensors
from .tensor_types import constant_tensor, inferred_types
from .walk import fresh_name
from .weights import initializer_array

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_LOW_TYPES = {"float16": 10, "bfloat16": 16}  # onnx.TensorProto.FLOAT16, BFLOAT16
_FLOAT = 1  # onnx.TensorProto.FLOAT


def rounded_model(model: "onnx.ModelProto", folder: Path, held: Mapping[str, np.ndarray], formats: Mapping[str, Format],
                  weight_round: Callable[[str, np.ndarray], np.ndarray | None] | None = None, *,
                  cast_round: Callable[[np.ndarray, str], np.ndarray] | None = None,
                  ) -> tuple["onnx.ModelProto", dict[str, np.ndarray]]:
    """A copy of ``model`` with each float32 tensor named in ``formats`` rounded to its format (see the
    module doc), and the arrays of its weights held in memory; ``model`` and ``held`` are left as they were.

    Args:
        model, folder, held: the reference file in memory (``held``: the arrays of its weights taken
            out of it, by name; others are inline or in the data files in ``folder``).
        formats: tensor name -> the format the candidate holds it in (activations, graph inputs,
            ``Constant`` outputs and initializers alike).
        weight_round: for an initializer, its rounded values (``None``: round it by ``formats``); lets a
            caller quantise a weight on the candidate's grid rather than with a scale made for other values.
        cast_round: a float32 array rounded to ``float16``/``bfloat16`` and back (default numpy's,
            :meth:`~layertap.numformats.Format.rounded`; a runtime's is faster on big weights).

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Mul", ["x", "x"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("z", 1, [2])])
        >>> model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        >>> ideal, held = rounded_model(model, Path("."), {}, {"y": Format("float16")})
        >>> [n.op_type for n in ideal.graph.node], [n.op_type for n in model.graph.node]
        (['Mul', 'Cast', 'Cast', 'Relu'], ['Mul', 'Relu'])
    """
    import onnx

    source = model
    model = onnx.ModelProto()
    model.CopyFrom(source)
    types = inferred_types(model)

    def is_float32(name: str) -> bool:
        vi = types.get(name)
        return vi is not None and vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type == _FLOAT

    # a value that decides a shape (Resize scales, Range bounds) is no computed value: left as it is, inline
    shaping = shape_read_tensors(model)
    wanted = {t: f for t, f in formats.items() if f.low and is_float32(t) and t not in shaping}
    rounded = _rounded_weights_in_place(model, folder, held, wanted, weight_round, cast_round or _cast_round)
    _RoundingNodes(model.graph, wanted, types).insert()
    return model, rounded


def _rounded_weights_in_place(model: "onnx.ModelProto", folder: Path, held: Mapping[str, np.ndarray],
                              wanted: Mapping[str, Format], weight_round: Callable[[str, np.ndarray], np.ndarray | None] | None,
                              cast_round: Callable[[np.ndarray, str], np.ndarray]) -> dict[str, np.ndarray]:
    """``held`` with each initializer of ``model`` (the copy) in ``wanted`` replaced by its rounded values,
    held in memory too (whether the file kept it inline, in memory or in its data file)."""
    out = dict(held)
    for t in model.graph.initializer:
        fmt = wanted.get(t.name)
        if fmt is None:
            continue
        value = np.asarray(initializer_array(t, out, folder), np.float32)
        rounded = weight_round(t.name, value) if weight_round is not None else None
        if rounded is None:
            # the converter's cap on stored weights: numpy's rounding holds it; the runtime's faster cast does not
            rounded = fmt.rounded(value) if fmt.is_quantised or fmt.clamp is not None else cast_round(value, fmt.name)
        out[t.name] = np.require(rounded, np.float32, "C").reshape(value.shape)  # a scalar stays a scalar
        hold_in_memory(t, out[t.name])
    return out


def _cast_round(value: np.ndarray, low: str) -> np.ndarray:
    return Format(low).rounded(value)


class _RoundingNodes:
    """The nodes that round each wanted activation, placed right after its producer."""

    def __init__(self, graph: "onnx.GraphProto", wanted: Mapping[str, Format], types: Mapping[str, "onnx.ValueInfoProto"]) -> None:
        self.graph = graph
        self.wanted = {t: f for t, f in wanted.items() if t not in {i.name for i in graph.initializer}}
        self.types = types
        self.taken = {t for n in graph.node for t in (*n.input, *n.output)} | {i.name for i in graph.input} \
            | {i.name for i in graph.initializer}
        self.extra: list[onnx.TensorProto] = []

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def insert(self) -> None:
        nodes: list[onnx.NodeProto] = []
        inputs = {i.name for i in self.graph.input}
        renamed: dict[str, str] = {}
        for name in [i.name for i in self.graph.input if i.name in self.wanted]:
            rounded = self.fresh(f"{name}::rounded")
            made = self.rounding(name, rounded, self.wanted[name])
            if made:
                nodes += made
                renamed[name] = rounded
        for node in self.graph.node:
            for k, t in enumerate(node.input):
                if t in renamed:
                    node.input[k] = renamed[t]
            after = []
            if node.op_type == "Constant" and node.output and self._held_capped(node, self.wanted.get(node.output[0])):
                nodes.append(node)
                continue
            for k, t in enumerate(node.output):
                if t in self.wanted and t not in inputs:
                    exact = self.fresh(f"{t}::exact")
                    made = self.rounding(exact, t, self.wanted[t])
                    if made:
                        node.output[k] = exact
                        after += made
            nodes.append(node)
            nodes += after
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self.graph.initializer.extend(self.extra)

    @staticmethod
    def _held_capped(node: "onnx.NodeProto", fmt: Format | None) -> bool:
        """A ``Constant`` (a weight, as paddle2onnx writes them) the candidate holds capped: its value in the copy
        replaced by the rounded one, in place (no ``Cast`` pair can write a converter's cap); whether it was."""
        from onnx import numpy_helper

        tensor = constant_tensor(node)
        if fmt is None or fmt.clamp is None or fmt.is_quantised or tensor is None or tensor.data_type != _FLOAT:
            return False
        tensor.CopyFrom(numpy_helper.from_array(fmt.rounded(numpy_helper.to_array(tensor)), tensor.name))
        return True

    def rounding(self, src: str, dst: str, fmt: Format) -> list["onnx.NodeProto"]:
        """Nodes computing ``dst`` = ``src`` rounded to ``fmt`` (none when it cannot be written here)."""
        from onnx import helper

        if fmt.name in _LOW_TYPES:
            low = self.fresh(f"{dst}::{fmt.name}")
            return [helper.make_node("Cast", [src], [low], to=_LOW_TYPES[fmt.name], name=self.fresh(f"layertap_round/{dst}/to")),
                    helper.make_node("Cast", [low], [dst], to=_FLOAT, name=self.fresh(f"layertap_round/{dst}/back"))]
        if not fmt.is_quantised:
            return []
        shape = self._param_shape(dst, fmt)
        if shape is None:
            return []
        s, z = self.constant(f"{dst}::scale", np.asarray(fmt.scale, np.float32).reshape(shape)), \
            self.constant(f"{dst}::zero_point", np.asarray(fmt.zero_point, np.float32).reshape(shape))
        lo, hi = self.constant(f"{dst}::qmin", np.float32(fmt.qmin)), self.constant(f"{dst}::qmax", np.float32(fmt.qmax))
        steps = [("Div", [src, s]), ("Round", None), ("Add", [None, z]), ("Clip", [None, lo, hi]), ("Sub", [None, z]),
                 ("Mul", [None, s])]
        out, prev = [], src
        for i, (op, args) in enumerate(steps):
            target = dst if i == len(steps) - 1 else self.fresh(f"{dst}::q{i}")
            ins = [prev] if args is None else [prev if a is None else a for a in args]
            out.append(helper.make_node(op, ins, [target], name=self.fresh(f"layertap_round/{dst}/{op}")))
            prev = target
        return out

    def _param_shape(self, name: str, fmt: Format) -> list[int] | None:
        """How a per-channel scale broadcasts against tensor ``name`` (``[]`` per tensor; ``None``:
        the tensor's rank is unknown)."""
        if not np.ndim(np.asarray(fmt.scale)):
            return []
        vi = self.types.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        rank = len(vi.type.tensor_type.shape.dim)
        shape = [1] * rank
        shape[(fmt.axis or 0) % rank] = -1
        return shape

    def constant(self, base: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.extra.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name
