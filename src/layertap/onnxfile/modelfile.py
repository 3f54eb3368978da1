"""Open ONNX files safely: never the weights, never data outside the model's folder.

Every ONNX-side entry point loads through :func:`read_model`, which reads the
graph with ``load_external_data=False`` (memory does not grow with weight
size) and checks each external-data reference before anything runs:

* the location is relative, has no ``..`` part, and (symlinks resolved) stays
  inside the model's folder: ONNX Runtime refuses escaping paths too, and a
  crafted file must not make layertap read ``/etc/shadow``;
* the file exists and is long enough for ``offset + length``.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import OnnxFileError
from ..files.reads import note_input
from ..specs import is_model_spec
from .metadata import read_taps
from .walk import all_tensors

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
        >>> import os, tempfile, numpy as np, onnx, onnx.helper as h, onnx.numpy_helper as nh
        >>> w = nh.from_array(np.ones((4, 4), np.float32), "w")
        >>> g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [1, 4])], [h.make_tensor_value_info("y", 1, [1, 4])], [w])
        >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> onnx.save(h.make_model(g), path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
        >>> mf = read_model(path)
        >>> mf.folder == mf.path.parent, mf.data_files(), mf.model.graph.initializer[0].HasField("raw_data")
        (True, ['m.onnx.data'], False)
    """

    path: Path
    model: "onnx.ModelProto"
    external: list[ExternalRef]
    _taps: list[dict] | None = field(default=None, repr=False)
    #: its reader gave ``model`` away (:meth:`hand_over`)
    handed_over: bool = field(default=False, repr=False)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def data_files(self) -> list[str]:
        """Distinct external-data locations, in first-use order."""
        return list(dict.fromkeys(r.location for r in self.external))

    def hand_over(self) -> "ModelFile":
        """Give this file's weights to the first runtime that opens it (a compare side, ``lt.run``),
        so they are held once: that runtime takes them out of :attr:`model` and leaves here the
        graph alone, its big weights referring to memory the runtime holds. For the reader that
        just read the file and needs only its graph afterwards (the CLI's compare: its node data
        and block list read node names); without it a runtime copies the weights out and
        :attr:`model` stays as it is. Returns ``self``.

        Example:
            >>> import tempfile
            >>> from layertap.onnxfile.samples import write_tiny_model
            >>> read_model(write_tiny_model(tempfile.mkdtemp())).hand_over().handed_over
            True
        """
        self.handed_over = True
        return self

    def taps_metadata(self) -> list[dict]:
        """The ``layertap.taps`` records written by ``lt.export`` (empty if none or unreadable)."""
        if self._taps is None:
            self._taps = read_taps(self.model)
        return self._taps


def read_model(path: str | os.PathLike) -> ModelFile:
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


def is_onnx_source(source: Any) -> bool:
    """Whether ``source`` names a file for a runtime (a path, or a :class:`ModelFile` already read),
    not a PyTorch model (a module, or a MODEL spec such as ``torchvision:resnet18``): how ``compare``,
    ``repro`` and ``fix`` tell an ONNX reference.

    Example:
        >>> is_onnx_source("m.onnx"), is_onnx_source(object()), is_onnx_source("torchvision:resnet18")
        (True, False, False)
    """
    if isinstance(source, str):
        return not is_model_spec(source)
    return isinstance(source, (os.PathLike, ModelFile))


def model_file(source: "str | os.PathLike | ModelFile") -> ModelFile:
    """``source`` itself when it was already read (a command reads each file once), else :func:`read_model`."""
    return source if isinstance(source, ModelFile) else read_model(source)


def _check_unique_names(path: Path, model: "onnx.ModelProto") -> None:
    """Refuse graphs that break ONNX's single-assignment rule (ORT misbehaves on them)."""
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
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield external_ref(t)


def external_ref(t: "onnx.TensorProto") -> ExternalRef:
    """Where an external tensor's data lies (location as written, offset, length); a malformed
    offset or length is an :class:`OnnxFileError`.

    Example:
        >>> import onnx
        >>> t = onnx.TensorProto(name="w", data_location=onnx.TensorProto.EXTERNAL)
        >>> _ = t.external_data.add(key="location", value="w.data"); _ = t.external_data.add(key="offset", value="64")
        >>> external_ref(t)
        ExternalRef(tensor='w', location='w.data', offset=64, length=None)
    """
    info = {kv.key: kv.value for kv in t.external_data}
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise OnnxFileError(f"tensor {t.name!r} has a malformed external-data offset/length") from None
    return ExternalRef(t.name, info.get("location", ""), offset, length)


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
