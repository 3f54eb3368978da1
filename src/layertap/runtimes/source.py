"""The model an engine opens: a graph in memory, its big weights held beside it as arrays.

Every runtime opens a :class:`SessionSource`: compare exposes other tensors per batch and runs
parts of the graph (``--local``), ``lt.run`` and dataset extraction expose their taps. The
weights are taken out of the model once (:meth:`SessionSource.with_weights_held`) and each
engine reads them in place (ONNX Runtime: ``add_external_initializers``), so a session parses
only the graph. :func:`open_source` is the one place a file's weights are taken out.

Nothing here edits the model it is given: sessions get serialised copies with the outputs
asked for (:meth:`SessionSource.serialized`), and a changed graph is a new source
(:meth:`SessionSource.with_model`). Never imports torch, nor any runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..onnxfile.held import is_held, without_big_weights
from ..onnxfile.modelfile import ModelFile, model_file
from ..onnxfile.scopemap.graph_facts import is_quantizer
from ..onnxfile.walk import model_nodes

if TYPE_CHECKING:  # pragma: no cover
    import onnx


class SessionSource:
    """A model in memory as engines open it: the graph, the arrays of the weights held apart
    (:attr:`held`, by name), the folder of its external data files, and the file it was read from.

    ``SessionSource(model, folder)`` is a view of ``model`` as it is (small models: its inline
    weights go with each session); :meth:`with_weights_held` takes a model's big weights out once.
    ``model`` is never edited here.

    Args:
        model: the graph (weights inline, in the folder's data files, or held: :attr:`held`).
        folder: where its external data files lie.
        held: the arrays of the initializers that refer to memory (:mod:`layertap.onnxfile.held`).
        origin: the file ``model`` was read from, while its nodes and weights are still the file's
            (only outputs added): a runtime that reads files itself (OpenVINO) reads that instead
            of the graph serialised again with its weights.

    Example:
        >>> import onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> src = SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."))
        >>> [o.name for o in src.model.graph.output], src.held, src.quantised
        (['y'], {}, False)
    """

    def __init__(self, model: "onnx.ModelProto", folder: Path, *, held: Mapping[str, np.ndarray] | None = None,
                 origin: Path | None = None) -> None:
        self.model = model
        self.folder = folder
        self.held: dict[str, np.ndarray] = dict(held or {})
        self.origin = origin
        self._quantised: bool | None = None

    @classmethod
    def with_weights_held(cls, model: "onnx.ModelProto", folder: Path, *, origin: Path | None = None,
                          threshold: int = 1024) -> "SessionSource":
        """A source on a new graph of ``model`` whose inline weights of ``threshold`` bytes or more are
        held as arrays (:func:`~layertap.onnxfile.held.without_big_weights`); ``model`` is left as it
        was: drop it to free its weights' memory.

        Example:
            >>> import onnx.helper as h, onnx.numpy_helper as nh
            >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
            >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
            ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
            >>> model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
            >>> src = SessionSource.with_weights_held(model, Path("."))
            >>> src.model.graph.initializer[0].HasField("raw_data"), list(src.held), model.graph.initializer[0].HasField("raw_data")
            (False, ['w'], True)
        """
        small, held = without_big_weights(model, threshold)
        return cls(small, folder, held=held, origin=origin)

    def with_model(self, model: "onnx.ModelProto", *, origin: Path | None = None) -> "SessionSource":
        """Another graph over this source's weights (an edited copy of :attr:`model`); its ``origin``
        is none unless given: an edited graph is no longer the file's."""
        return type(self)(model, self.folder, held=self.held, origin=origin)

    @property
    def quantised(self) -> bool:
        """Whether the graph quantises (a ``QuantizeLinear``/``DequantizeLinear``): only then do a
        runtime's int8 kernels run, and a float graph never pays for a check of them."""
        if self._quantised is None:
            self._quantised = any(is_quantizer(n) for n in model_nodes(self.model))
        return self._quantised

    def serialized(self, outputs: Sequence["str | onnx.ValueInfoProto"] = (), *, only: bool = False) -> bytes:
        """The model's bytes with ``outputs`` (names, typed or not) after its own outputs (``only``:
        instead of them); :attr:`model` is not touched.

        The extra outputs are a second message appended to the bytes: a protobuf parser merges a
        repeated message field seen twice into one list, so the graph is serialised as it is.

        Example:
            >>> import onnx, onnx.helper as h
            >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])], "g",
            ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
            >>> src = SessionSource(h.make_model(g), Path("."))
            >>> [o.name for o in onnx.load_from_string(src.serialized(["r"])).graph.output]
            ['y', 'r']
            >>> [o.name for o in onnx.load_from_string(src.serialized(["r"], only=True)).graph.output], len(src.model.graph.output)
            (['r'], 1)
        """
        import onnx

        extra = onnx.ModelProto()
        for o in outputs:
            extra.graph.output.append(o if isinstance(o, onnx.ValueInfoProto) else onnx.helper.make_empty_tensor_value_info(o))
        base = self.model
        if only and len(base.graph.output):
            base = onnx.ModelProto()
            base.CopyFrom(self.model)  # the graph without its big weights: a small copy
            del base.graph.output[:]
        return base.SerializeToString() + (extra.SerializeToString() if outputs else b"")

    def inlined(self, model: "onnx.ModelProto | None" = None) -> "onnx.ModelProto":
        """A copy of ``model`` (default :attr:`model`; a part graph built from its nodes) whose weights are all
        inline: those held in memory and those in external files next to it. For a runtime that reads a graph
        from bytes alone (OpenVINO, a runtime plug-in's interpreter).

        Example:
            >>> import onnx.helper as h, onnx.numpy_helper as nh
            >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
            >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
            ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
            >>> src = SessionSource.with_weights_held(h.make_model(g), Path("."))
            >>> src.model.graph.initializer[0].data_location, src.inlined().graph.initializer[0].data_location
            (1, 0)
        """
        import onnx
        from onnx import numpy_helper

        out = onnx.ModelProto()
        out.CopyFrom(self.model if model is None else model)
        for t in out.graph.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            arr = self.held.get(t.name)
            if arr is None:
                arr = numpy_helper.to_array(t, base_dir=str(self.folder))
            t.CopyFrom(numpy_helper.from_array(arr, t.name))
        return out

    def weights_of(self, part: "onnx.ModelProto") -> dict[str, np.ndarray]:
        """The held arrays another graph built from this one's nodes (a part of it) reads.

        Example:
            >>> import onnx.helper as h, onnx.numpy_helper as nh
            >>> w = nh.from_array(np.eye(512, dtype=np.float32), "w")
            >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
            ...     [h.make_tensor_value_info("x", 1, [1, 512])], [h.make_tensor_value_info("y", 1, [1, 512])], [w])
            >>> src = SessionSource.with_weights_held(h.make_model(g), Path("."))
            >>> part = h.make_model(h.make_graph([], "part", [], [], list(src.model.graph.initializer)))
            >>> list(src.weights_of(part))
            ['w']
        """
        wanted = {t.name for t in part.graph.initializer if is_held(t)}
        return {n: a for n, a in self.held.items() if n in wanted}


def open_source(source: "str | os.PathLike | ModelFile") -> tuple[SessionSource, "ModelFile"]:
    """A file's source, its weights taken out once, and the :class:`~layertap.onnxfile.modelfile.ModelFile`
    that describes the file (its graph is the source's).

    A path is read here (:func:`~layertap.onnxfile.modelfile.read_model`: graph only, the
    external-data checks every command makes). A ``ModelFile`` a caller read is left as it was,
    unless its reader handed it over (:meth:`~layertap.onnxfile.modelfile.ModelFile.hand_over`):
    then its ``model`` becomes the weightless graph, so its weights are held once.

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> src, mf = open_source(write_tiny_model(tempfile.mkdtemp()))
        >>> src.origin == mf.path, mf.model is src.model
        (True, True)
    """
    given = isinstance(source, ModelFile)
    mf = model_file(source)
    src = SessionSource.with_weights_held(mf.model, mf.folder, origin=mf.path)
    if given and mf.handed_over:
        mf.handed_over = False
        mf.model = _copy(src.model)  # its reader keeps the graph; the weights are the source's now
    return src, ModelFile(mf.path, src.model, mf.external)


def _copy(model: "onnx.ModelProto") -> "onnx.ModelProto":
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
