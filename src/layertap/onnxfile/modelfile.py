"""Open ONNX files safely: never the weights, never data outside the model's folder.

Every ONNX-side entry point loads through :func:`load_model`, which reads the
graph with ``load_external_data=False`` (memory does not grow with weight
size) and checks each external-data reference before anything runs:

* the location is relative, has no ``..`` part, and (symlinks resolved) stays
  inside the model's folder: ONNX Runtime refuses escaping paths too, and a
  crafted file must not make layertap read ``/etc/shadow``;
* the file exists and is long enough for ``offset + length``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ..errors import LayertapWarning, OnnxFileError
from ..files import note_input

if TYPE_CHECKING:  # pragma: no cover
    import onnx


@dataclass(frozen=True)
class ExternalRef:
    """One tensor's external-data reference."""

    tensor: str
    location: str   # as written in the file, relative to the model's folder
    offset: int
    length: int | None


@dataclass
class ModelFile:
    """A loaded graph (weights left on disk) and where it came from.

    Example:
        >>> mf = load_model("resnet18.onnx")          # doctest: +SKIP
        >>> mf.folder, [r.location for r in mf.external][:1]   # doctest: +SKIP
        (PosixPath('/models'), ['resnet18.onnx.data'])
    """

    path: Path
    model: "onnx.ModelProto"
    external: list[ExternalRef]
    _taps: list[dict] | None = field(default=None, repr=False)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def data_files(self) -> list[str]:
        """Distinct external-data locations, in first-use order."""
        return list(dict.fromkeys(r.location for r in self.external))

    def taps_metadata(self) -> list[dict]:
        """The ``layertap.taps`` records written by ``lt.export`` (empty if none or unreadable)."""
        if self._taps is None:
            self._taps = taps_records(self.model)
        return self._taps


def taps_records(model: "onnx.ModelProto") -> list[dict]:
    """The ``layertap.taps`` records of a model; bad metadata warns and counts as none.

    The metadata comes from the file: a deeply nested or malformed value must
    not make the file unusable (its tensor names still work).

    Example:
        >>> import onnx, warnings
        >>> m = onnx.ModelProto()
        >>> onnx.helper.set_model_props(m, {"layertap.taps": "[" * 200_000})
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     taps_records(m)
        []
    """
    import json
    import warnings

    for p in model.metadata_props:
        if p.key == "layertap.taps":
            try:
                value = json.loads(p.value)
            except (ValueError, RecursionError) as e:
                value = e
            if not isinstance(value, list):
                why = f"{type(value).__name__}: {str(value)[:80]}" if isinstance(value, Exception) else "not a list"
                warnings.warn(f"ignoring the file's layertap.taps metadata ({why}); tensor names still work",
                              LayertapWarning, stacklevel=2)
                return []
            return [r for r in value if isinstance(r, dict) and isinstance(r.get("name"), str)]
    return []


def load_model(path: str | os.PathLike) -> ModelFile:
    """Read an ONNX file's graph without its weights; refuse unsafe or broken files."""
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if not p.exists():
        raise OnnxFileError(f"ONNX file '{p}' does not exist")
    if not p.is_file():
        raise OnnxFileError(f"'{p}' is not a file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except DecodeError as e:
        raise OnnxFileError(f"'{p}' is not an ONNX file, or it is truncated or corrupt (protobuf: {e})") from None
    except (OSError, ValueError, RuntimeError) as e:
        raise OnnxFileError(f"cannot read ONNX file '{p}': {e}") from None
    if not model.HasField("graph") or model.ir_version == 0 or not (len(model.graph.node) or len(model.graph.output)):
        raise OnnxFileError(f"'{p}' is not an ONNX model (no graph or IR version); is it truncated or another format?")
    _check_unique_names(p, model)
    refs = list(_external_refs(model))
    _check_external(p, refs)
    note_input(p)
    for loc in dict.fromkeys(r.location for r in refs):
        note_input(p.parent / loc, f"external data of '{p}'")
    return ModelFile(path=p, model=model, external=refs)


def _check_unique_names(path: Path, model: "onnx.ModelProto") -> None:
    """Refuse graphs that break ONNX's single-assignment rule (ORT misbehaves on them)."""
    import collections

    g = model.graph
    for kind, names in (("output", [o.name for o in g.output]), ("input", [i.name for i in g.input]),
                        ("initializer", [i.name for i in g.initializer])):
        dup = sorted(n for n, k in collections.Counter(names).items() if k > 1)
        if dup:
            raise OnnxFileError(f"'{path}' has duplicate graph {kind} names: {', '.join(dup[:5])}; it is not a valid ONNX model")
    seen: set[str] = set()
    for node in g.node:
        for out in node.output:
            if out and out in seen:
                raise OnnxFileError(f"'{path}': tensor {out!r} is produced twice (duplicate tensor name); it is not a valid ONNX model")
            seen.add(out)


def _external_refs(model: "onnx.ModelProto") -> Iterator[ExternalRef]:
    import onnx

    for t in all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {kv.key: kv.value for kv in t.external_data}
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise OnnxFileError(f"tensor {t.name!r} has a malformed external-data offset/length") from None
        yield ExternalRef(t.name, info.get("location", ""), offset, length)


def all_tensors(model: "onnx.ModelProto") -> Iterator["onnx.TensorProto"]:
    """Every TensorProto: initializers and attribute tensors, in subgraphs and functions too.

    Example:
        >>> from onnx import helper, numpy_helper
        >>> import numpy as np
        >>> g = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(np.zeros(1, np.float32), "w")])
        >>> [t.name for t in all_tensors(helper.make_model(g))]
        ['w']
    """
    graphs = [model.graph]
    node_lists = [f.node for f in model.functions]  # function bodies: their nodes, subgraphs included
    while graphs or node_lists:
        if graphs:
            g = graphs.pop()
            yield from g.initializer
            for s in g.sparse_initializer:
                yield s.values
                yield s.indices
            node_lists.append(g.node)
        for node in node_lists.pop() if node_lists else ():
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                for sparse in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                    yield sparse.values
                    yield sparse.indices
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def _check_external(model_path: Path, refs: list[ExternalRef]) -> None:
    folder = model_path.parent.resolve()
    sizes: dict[str, int] = {}
    for r in refs:
        loc = r.location
        if not loc:
            raise OnnxFileError(f"tensor {r.tensor!r} has external data with no location in '{model_path}'")
        pure = Path(loc)
        if pure.is_absolute() or ".." in pure.parts or loc.startswith(("/", "\\")) or ":" in pure.parts[0]:
            raise OnnxFileError(
                f"refusing '{model_path}': tensor {r.tensor!r} keeps its data at {loc!r}, outside the model's folder"
            )
        full = folder / pure
        try:
            real = full.resolve(strict=False)
        except OSError:
            real = full
        if folder not in real.parents:
            raise OnnxFileError(
                f"refusing '{model_path}': external data {loc!r} of tensor {r.tensor!r} links outside the model's folder"
            )
        if loc not in sizes:
            if not real.is_file():
                raise OnnxFileError(
                    f"external data file {loc!r} of '{model_path}' is missing (tensor {r.tensor!r}); "
                    "keep the data file next to the model"
                )
            sizes[loc] = real.stat().st_size
        if r.length is not None and r.offset + r.length > sizes[loc]:
            raise OnnxFileError(
                f"external data file {loc!r} of '{model_path}' is truncated: tensor {r.tensor!r} needs bytes "
                f"{r.offset}..{r.offset + r.length}, the file has {sizes[loc]}"
            )
